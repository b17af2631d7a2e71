"""The per-sample pipeline with Pillow and torch only (no torchvision).

bytes -> PIL decode -> RGB -> [resize shorter side] -> crop -> [flip] -> [colour jitter]
-> uint8 CHW tensor. Each step does what torchvision's transform of the same name does on
a PIL image (same interpolation, same crop arithmetic), so the CPU cost per image is the
cost of the usual ImageNet training pipeline:

    Resize(256) + RandomCrop(224) / CenterCrop(224) + RandomHorizontalFlip + PILToTensor
    RandomResizedCrop(224) + RandomHorizontalFlip + ColorJitter(b, c, s) + PILToTensor

`draft=True` lets libjpeg decode at a reduced scale (1/2, 1/4, 1/8) when the image is
large enough for the target size. It can cut decode time severalfold on large photos but
it is not what torchvision does, so it is off by default and labelled when on.

Randomness uses Python's `random` module, which DataLoader seeds per worker.
"""

from __future__ import annotations

import io
import math
import random
from dataclasses import asdict, dataclass
from typing import Any

from autotune.errors import UsageError

CROP_MODES = ("center", "random", "random_resized")


@dataclass(frozen=True)
class TransformSpec:
    """What to do to each sample. Sizes in pixels.

    resize: shorter side after resizing (bilinear, antialiased like PIL/torchvision);
        None skips the resize. Ignored by crop_mode 'random_resized', which resizes its
        crop straight to `crop`.
    crop: output side (square).
    crop_mode: 'center' (eval), 'random' (RandomCrop) or 'random_resized'
        (RandomResizedCrop with `scale` and `ratio`).
    flip: random horizontal flip, p = 0.5.
    jitter: (brightness, contrast, saturation[, hue]) strengths as in torchvision's
        ColorJitter, applied in random order: PIL ImageEnhance for the first three, an HSV
        round trip for hue (as torchvision does on PIL images); None for no jitter.
    draft: JPEG draft-mode decoding (reduced-scale DCT); off by default (see module doc).
    """

    resize: int | None = 256
    crop: int = 224
    crop_mode: str = "center"
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = False
    jitter: tuple[float, ...] | None = None
    draft: bool = False

    def __post_init__(self) -> None:
        if self.crop_mode not in CROP_MODES:
            raise UsageError(f"transform crop_mode must be one of {', '.join(CROP_MODES)}, "
                             f"but got {self.crop_mode!r}.")
        if not isinstance(self.crop, int) or self.crop < 1:
            raise UsageError(f"transform crop must be a positive integer, but got {self.crop!r}.")
        if self.resize is not None and (not isinstance(self.resize, int) or self.resize < self.crop):
            raise UsageError(f"transform resize must be an integer of at least crop ({self.crop}) "
                             f"or null, but got {self.resize!r}.")
        lo, hi = self.scale
        if not 0 < lo <= hi <= 1:
            raise UsageError(f"transform scale must be 0 < min <= max <= 1, but got {list(self.scale)}.")
        lo, hi = self.ratio
        if not 0 < lo <= hi:
            raise UsageError(f"transform ratio must be 0 < min <= max, but got {list(self.ratio)}.")
        if self.jitter is not None and (len(self.jitter) not in (3, 4) or min(self.jitter) < 0
                                        or (len(self.jitter) == 4 and self.jitter[3] > 0.5)):
            raise UsageError("transform jitter must be [brightness, contrast, saturation] or "
                             "[brightness, contrast, saturation, hue], each >= 0 and hue <= 0.5, "
                             f"but got {self.jitter!r}.")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> TransformSpec:
        """From a preset's `transform:` mapping (unknown keys are an error)."""
        d = dict(d or {})
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(d) - known)
        if unknown:
            raise UsageError(f"unknown transform key(s) {', '.join(unknown)}; known: "
                             f"{', '.join(sorted(known))}.")
        for k in ("scale", "ratio", "jitter"):
            if d.get(k) is not None:
                d[k] = tuple(float(x) for x in d[k])
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("scale", "ratio", "jitter"):
            if d[k] is not None:
                d[k] = list(d[k])
        return d

    def describe(self) -> str:
        """One line for tables, e.g. 'resize 256, random crop 224, flip'."""
        parts = []
        if self.crop_mode == "random_resized":
            parts.append(f"random-resized crop {self.crop} (scale {self.scale[0]:g}-{self.scale[1]:g})")
        else:
            if self.resize is not None:
                parts.append(f"resize {self.resize}")
            parts.append(f"{self.crop_mode} crop {self.crop}")
        if self.flip:
            parts.append("flip")
        if self.jitter is not None:
            parts.append("jitter " + "/".join(f"{x:g}" for x in self.jitter))
        if self.draft:
            parts.append("JPEG DRAFT decode")
        return ", ".join(parts)


@dataclass
class SampleTransform:
    """Callable: encoded bytes -> uint8 tensor [3, crop, crop]. Picklable."""

    spec: TransformSpec

    def decode(self, data: bytes) -> Any:
        from PIL import Image

        img = Image.open(io.BytesIO(data))
        if self.spec.draft and img.format == "JPEG":
            target = self.spec.crop if self.spec.crop_mode == "random_resized" else (
                self.spec.resize or self.spec.crop)
            img.draft("RGB", (target, target))
        img.load()
        # torchvision's pil_loader converts always; for a file already RGB that is a
        # full copy of the decoded image for the same pixels, so skip it then.
        return img if img.mode == "RGB" else img.convert("RGB")

    def augment(self, img: Any) -> Any:
        from PIL import Image

        s = self.spec
        if s.crop_mode == "random_resized":
            i, j, h, w = _rrc_params(img.width, img.height, s.scale, s.ratio)
            img = img.crop((j, i, j + w, i + h)).resize((s.crop, s.crop), Image.BILINEAR)
        elif s.resize is not None and min(_resized_size(img.size, s.resize)) >= s.crop:
            img = _resize_crop(img, s.resize, s.crop, random_pos=s.crop_mode == "random")
        else:
            if s.resize is not None:
                img = _resize_shorter(img, s.resize)
            img = _crop(img, s.crop, random_pos=s.crop_mode == "random")
        if s.flip and random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        if s.jitter is not None:
            img = _color_jitter(img, s.jitter)
        return img

    def __call__(self, data: bytes) -> Any:
        import numpy as np
        import torch

        img = self.augment(self.decode(data))
        # PILToTensor: HWC uint8 -> CHW view (collate stacks it into one batch tensor).
        return torch.from_numpy(np.array(img, dtype=np.uint8, copy=True)).permute(2, 0, 1)


def build_transform(spec: TransformSpec) -> SampleTransform:
    """The sample pipeline for `spec`."""
    return SampleTransform(spec)


def _resized_size(wh: tuple[int, int], size: int) -> tuple[int, int]:
    w, h = wh
    short, long = (w, h) if w <= h else (h, w)
    if short == size:
        return w, h
    new_long = int(size * long / short)  # torchvision's arithmetic (truncates)
    return (size, new_long) if w <= h else (new_long, size)


def _resize_crop(img: Any, size: int, crop: int, random_pos: bool) -> Any:
    """Resize(size) then RandomCrop/CenterCrop(crop), computing only the crop's pixels:
    the crop window is mapped back to the source and resampled straight to crop x crop
    (Pillow's resize box=). Same window, same random draws, same filter; a third less
    resampling work on ImageNet-sized images (the pixels differ by rounding only)."""
    from PIL import Image

    w, h = img.size
    nw, nh = _resized_size((w, h), size)
    if random_pos:
        top, left = random.randint(0, nh - crop), random.randint(0, nw - crop)
    else:
        top, left = int(round((nh - crop) / 2.0)), int(round((nw - crop) / 2.0))
    if (nw, nh) == (w, h):
        return img.crop((left, top, left + crop, top + crop))
    sx, sy = w / nw, h / nh
    return img.resize((crop, crop), Image.BILINEAR,
                      box=(left * sx, top * sy, (left + crop) * sx, (top + crop) * sy))


def _resize_shorter(img: Any, size: int) -> Any:
    from PIL import Image

    w, h = img.size
    short, long = (w, h) if w <= h else (h, w)
    if short == size:
        return img
    new_long = int(size * long / short)  # torchvision's arithmetic (truncates)
    new = (size, new_long) if w <= h else (new_long, size)
    return img.resize(new, Image.BILINEAR)


def _crop(img: Any, size: int, random_pos: bool) -> Any:
    w, h = img.size
    if w < size or h < size:  # RandomCrop(pad_if_needed=False) would fail; centre-pad instead
        from PIL import Image

        canvas = Image.new("RGB", (max(w, size), max(h, size)))
        canvas.paste(img, ((canvas.width - w) // 2, (canvas.height - h) // 2))
        img, (w, h) = canvas, canvas.size
    if random_pos:
        top, left = random.randint(0, h - size), random.randint(0, w - size)
    else:
        top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
    return img.crop((left, top, left + size, top + size))


def _rrc_params(width: int, height: int, scale: tuple[float, float],
                ratio: tuple[float, float]) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params: (top, left, height, width)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * random.uniform(scale[0], scale[1])
        aspect = math.exp(random.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return random.randint(0, height - h), random.randint(0, width - w), h, w
    in_ratio = width / height  # fallback: whole image, clamped to the ratio range
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def _adjust_hue(img: Any, factor: float) -> Any:
    # torchvision.transforms.functional_pil.adjust_hue: shift H in HSV space (uint8 wraps).
    import numpy as np
    from PIL import Image

    h, s, v = img.convert("HSV").split()
    h_arr = np.array(h, dtype=np.uint8)
    h_arr += np.uint8(int(factor * 255) % 256)
    return Image.merge("HSV", (Image.fromarray(h_arr, "L"), s, v)).convert("RGB")


def _color_jitter(img: Any, strengths: tuple[float, ...]) -> Any:
    from PIL import ImageEnhance

    ops: list[tuple[Any, float]] = [(ImageEnhance.Brightness, strengths[0]),
                                    (ImageEnhance.Contrast, strengths[1]),
                                    (ImageEnhance.Color, strengths[2])]
    if len(strengths) == 4:
        ops.append(("hue", strengths[3]))
    random.shuffle(ops)  # ColorJitter applies its adjustments in random order
    for op, s in ops:
        if s <= 0:
            continue
        if op == "hue":
            img = _adjust_hue(img, random.uniform(-s, s))
        else:
            img = op(img).enhance(random.uniform(max(0.0, 1 - s), 1 + s))
    return img
