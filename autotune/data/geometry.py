"""Where each output pixel comes from: the random draws of the crop, flip and jitter.

The draws are torchvision's own, call for call, on torch's global generator (which a
DataLoader seeds in each worker): `RandomResizedCrop.make_params` (float32 uniforms, the
10-attempt loop, the centre fallback), `RandomCrop` (`torch.randint`), `CenterCrop`
(rounded centre), `RandomHorizontalFlip` (`torch.rand(1) < p`) and `ColorJitter`
(`torch.randperm(4)`, then one uniform per adjustment that is on). With the same seed a
pipeline built from this module crops, flips and jitters as torchvision does.

All geometry is computed from the image's size alone (known from the file header), so a
decoder can be told, before it decodes, how far it may shrink the image (DCT scaling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Geometry:
    """The plan for one image of size (width, height) in source pixels.

    box: (left, top, right, bottom) of the source region that is resampled.
    out: (width, height) that region is resampled to (equal to the box size: no resample).
    crop: (left, top) of the final crop x crop window in `out` (0, 0 for a crop-resize).
    pad: the crop is larger than `out` (RandomCrop without resize on a small image):
        `out` is centred on a black canvas first.
    flip: mirror left-right after the crop.
    """

    box: tuple[int, int, int, int]
    out: tuple[int, int]
    crop: tuple[int, int]
    pad: bool
    flip: bool

    def reduction(self, gap: float = 2.0, allowed: tuple[int, ...] = (8, 4, 2)) -> int:
        """The largest factor k in `allowed` (else 1) by which the decoder may shrink the
        image so that the box, k times smaller, is still at least `gap` times `out` on
        both sides. The resample after it then still shrinks by `gap` or more, enough
        taps to hide the decoder's 8x8-block filter (Pillow's `reducing_gap`, whose
        default of 2 this follows); no detail is ever invented."""
        bw, bh = self.box[2] - self.box[0], self.box[3] - self.box[1]
        for k in sorted(allowed, reverse=True):
            if k > 1 and bw / k >= gap * self.out[0] and bh / k >= gap * self.out[1]:
                return k
        return 1


def _uniform(lo: float, hi: float) -> float:
    return torch.empty(1).uniform_(lo, hi).item()


def rrc_params(width: int, height: int, scale: tuple[float, float],
               ratio: tuple[float, float]) -> tuple[int, int, int, int]:
    """torchvision v2 `RandomResizedCrop.make_params`: (top, left, height, width).

    The log-ratio bounds are float32 tensors and the uniforms float32 draws, as there, so
    the same seed gives the same box bit for bit."""
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * _uniform(scale[0], scale[1])
        aspect = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1])).item()  # type: ignore[arg-type]
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            i = int(torch.randint(0, height - h + 1, size=(1,)).item())
            j = int(torch.randint(0, width - w + 1, size=(1,)).item())
            return i, j, h, w
    in_ratio = float(width) / float(height)  # fallback: a centred crop of clamped ratio
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def resized_size(width: int, height: int, size: int) -> tuple[int, int]:
    """torchvision `Resize(size)` on (width, height): the shorter side becomes `size`, the
    longer one `int(size * long / short)` (truncated, as there)."""
    short, long = (width, height) if width <= height else (height, width)
    if short == size:
        return width, height
    new_long = int(size * long / short)
    return (size, new_long) if width <= height else (new_long, size)


def _crop_pos(w: int, h: int, crop: int, random_pos: bool) -> tuple[int, int]:
    """(left, top) of a crop x crop window in a w x h image: torchvision v2 RandomCrop
    (`torch.randint`, top first, no draw on a side that fits exactly) or CenterCrop
    (rounded centre)."""
    if random_pos:
        top = int(torch.randint(0, h - crop + 1, size=())) if h > crop else 0
        left = int(torch.randint(0, w - crop + 1, size=())) if w > crop else 0
        return left, top
    return int(round((w - crop) / 2.0)), int(round((h - crop) / 2.0))


def plan(spec: object, width: int, height: int) -> Geometry:
    """Draw the crop and the flip for an image of (width, height), in torchvision's order
    (crop first, then flip). `spec` is a TransformSpec."""
    crop, mode = spec.crop, spec.crop_mode  # type: ignore[attr-defined]
    pad = False
    if mode == "random_resized":
        i, j, h, w = rrc_params(width, height, spec.scale, spec.ratio)  # type: ignore[attr-defined]
        box, out, pos = (j, i, j + w, i + h), (crop, crop), (0, 0)
    else:
        out = (width, height)
        if spec.resize is not None:  # type: ignore[attr-defined]
            out = resized_size(width, height, spec.resize)  # type: ignore[attr-defined]
        box = (0, 0, width, height)
        if out[0] < crop or out[1] < crop:  # RandomCrop would fail: pad to the crop first
            pad = True
            out_c = (max(out[0], crop), max(out[1], crop))
            pos = _crop_pos(out_c[0], out_c[1], crop, mode == "random")
        else:
            pos = _crop_pos(out[0], out[1], crop, mode == "random")
    flip = bool(spec.flip) and bool(torch.rand(1).item() < 0.5)  # type: ignore[attr-defined]
    return Geometry(box=box, out=out, crop=pos, pad=pad, flip=flip)


def jitter_params(strengths: tuple[float, ...]) -> list[tuple[str, float]]:
    """torchvision `ColorJitter.make_params`: the order of the four adjustments
    (`torch.randperm(4)`), then one factor per adjustment that is on (brightness,
    contrast, saturation in [max(0, 1 - s), 1 + s], hue in [-s, s]); returns the ones that
    are on, in the order they are applied."""
    order = torch.randperm(4).tolist()
    names = ("brightness", "contrast", "saturation", "hue")
    factors: dict[str, float] = {}
    for n, s in zip(names, tuple(strengths) + (0.0,) * (4 - len(strengths))):
        if s > 0:
            lo, hi = (-s, s) if n == "hue" else (max(0.0, 1 - s), 1 + s)
            factors[n] = _uniform(lo, hi)
    return [(names[k], factors[names[k]]) for k in order if names[k] in factors]
