"""The two ways a drawn `Geometry` becomes a tensor.

`exact`: what torchvision does to a PIL image, step by step and at its cost: pil_loader's
`convert("RGB")` (a copy even of an RGB file), crop then resize in Pillow (bilinear,
antialiased), transpose for the flip, `np.array` copy to a CHW view (ToImage), then
`to(float32).mul_(1/255)` (ToDtype(scale=True)) and `sub(mean).div_(std)` (Normalize).

`fast`: the same crop box and flip with fewer passes over the pixels: the crop is a view
of the decoded array (no RGB copy, no crop copy), resampled by torch's antialiased
bilinear on uint8 channels-last data (it follows Pillow's filter to within a level),
then one float conversion into a contiguous tensor and one multiply-add for ToDtype and
Normalize together.

An image decoded k times smaller (`draft`) is resampled by Pillow in both paths, from
the box's exact fractional position in it.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from autotune.data.decode import Opened, scale_box
from autotune.data.geometry import Geometry


def _pad_pil(img: Any, crop: int) -> Any:
    """Centre `img` on a black canvas at least crop x crop."""
    from PIL import Image

    w, h = img.size
    canvas = Image.new("RGB", (max(w, crop), max(h, crop)))
    canvas.paste(img, ((canvas.width - w) // 2, (canvas.height - h) // 2))
    return canvas


def _adjust_hue(img: Any, factor: float) -> Any:
    # torchvision's adjust_hue on PIL: shift H in HSV space (uint8 wraps).
    from PIL import Image

    h, s, v = img.convert("HSV").split()
    h_arr = np.array(h, dtype=np.uint8)
    h_arr += np.uint8(int(factor * 255) % 256)
    return Image.merge("HSV", (Image.fromarray(h_arr, "L"), s, v)).convert("RGB")


def jitter_pil(img: Any, adjustments: list[tuple[str, float]]) -> Any:
    """Apply ColorJitter's drawn adjustments, in order, as torchvision does on PIL."""
    from PIL import ImageEnhance

    enhancers = {"brightness": ImageEnhance.Brightness, "contrast": ImageEnhance.Contrast,
                 "saturation": ImageEnhance.Color}
    for name, factor in adjustments:
        img = _adjust_hue(img, factor) if name == "hue" else enhancers[name](img).enhance(factor)
    return img


def _resample_pil(img: Any, geo: Geometry, k: int, crop_mode: str) -> Any:
    """Resample `img` (decoded k times smaller) to `geo.out`. At full size: torchvision's
    steps (crop then resize for RandomResizedCrop, resize of the whole image for Resize).
    Shrunk: one resize of the box's exact fraction (`scale_box`)."""
    from PIL import Image

    if k > 1:
        return img.resize(geo.out, Image.BILINEAR, box=scale_box(geo.box, k))
    if crop_mode == "random_resized":
        img = img.crop(geo.box)  # F.resized_crop on a PIL image: crop, then resize
    return img if img.size == geo.out else img.resize(geo.out, Image.BILINEAR)


def exact(opened: Opened, geo: Geometry, k: int, spec: Any,
          jitter: list[tuple[str, float]] | None, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    from PIL import Image

    img, k = opened.pil(k)
    img = img.convert("RGB")  # pil_loader converts always: a full copy even of an RGB file
    img = _resample_pil(img, geo, k, spec.crop_mode)
    crop = spec.crop
    if spec.crop_mode != "random_resized":
        if geo.pad:
            img = _pad_pil(img, crop)
        left, top = geo.crop
        img = img.crop((left, top, left + crop, top + crop))
    if geo.flip:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    if jitter:
        img = jitter_pil(img, jitter)
    x = torch.as_tensor(np.array(img, copy=True)).view(img.height, img.width, 3).permute(2, 0, 1)
    if spec.output == "uint8":
        return x
    x = x.to(torch.float32).mul_(1.0 / 255)
    return x.sub(mean).div_(std) if spec.normalize else x


def _resize(t: torch.Tensor, w: int, h: int) -> torch.Tensor:
    """uint8 CHW (any strides) -> uint8 [3, h, w], bilinear with antialiasing as Pillow."""
    if (t.shape[2], t.shape[1]) == (w, h):
        return t
    return F.interpolate(t.unsqueeze(0), size=(h, w), mode="bilinear", antialias=True,
                         align_corners=False)[0]


def _chw(arr: Any) -> torch.Tensor:
    """CHW view of HWC pixels (no copy)."""
    if arr.flags.writeable:
        return torch.from_numpy(arr).permute(2, 0, 1)
    with warnings.catch_warnings():
        # Pillow's array is read-only; nothing writes to this view (every step copies).
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr).permute(2, 0, 1)


def fast(opened: Opened, geo: Geometry, k: int, spec: Any,
         jitter: list[tuple[str, float]] | None, scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    arr, k = opened.array(k)
    crop = spec.crop
    if k > 1:  # a fractional box: Pillow resamples it (the image is k^2 times smaller)
        from PIL import Image

        t = _chw(np.asarray(_resample_pil(Image.fromarray(arr, "RGB"), geo, k, spec.crop_mode)))
    elif spec.crop_mode == "random_resized":
        left, top, right, bottom = geo.box
        t = _resize(_chw(arr)[:, top:bottom, left:right], *geo.out)
    else:
        t = _resize(_chw(arr), *geo.out)
    if spec.crop_mode != "random_resized":
        if geo.pad:
            c = torch.zeros((3, max(t.shape[1], crop), max(t.shape[2], crop)), dtype=torch.uint8)
            y0, x0 = (c.shape[1] - t.shape[1]) // 2, (c.shape[2] - t.shape[2]) // 2
            c[:, y0:y0 + t.shape[1], x0:x0 + t.shape[2]] = t
            t = c
        left, top = geo.crop
        t = t[:, top:top + crop, left:left + crop]
    if geo.flip:
        t = t.flip(-1)
    if jitter:
        from PIL import Image

        img = jitter_pil(Image.fromarray(t.permute(1, 2, 0).contiguous().numpy(), "RGB"), jitter)
        t = torch.from_numpy(np.array(img)).permute(2, 0, 1)
    if spec.output == "uint8":
        return t.contiguous()
    out = torch.empty((3, crop, crop), dtype=torch.float32)
    out.copy_(t)
    return out.mul_(scale).add_(bias)  # (x / 255 - mean) / std as x * scale + bias
