"""The per-sample pipeline: encoded bytes -> CHW tensor, with Pillow and torch only.

By default it is torchvision's own pipeline, step for step and at its cost (pil_loader +
transforms.v2 on a PIL image), for the three transforms ImageNet jobs run:

    RandomResizedCrop(224) + RandomHorizontalFlip [+ ColorJitter] + ToImage
        + ToDtype(float32, scale=True) + Normalize(ImageNet mean, std)       training
    Resize(256) + CenterCrop(224) (or RandomCrop) + the same conversion          eval

The random draws are torchvision's, on torch's generator (`geometry`), so a seed gives
the crops and flips torchvision gives. The output is float32: a batch of 256 images of
224 x 224 is 154 MB, four times the bytes of uint8, and collate, pin_memory and the
copy to the device move all of it (`output: uint8` keeps bytes, for a pipeline that
normalises on the GPU).

Faster variants are opt-in and labelled (`describe()`): `exact: false` (the same crop
boxes and flips, fewer passes over the pixels; see `pixels`), `decoder: simplejpeg` and
`draft: true` (a JPEG decoded at 1/2, 1/4 or 1/8 of its size where the crop still only
shrinks; see `decode`). Their output stays within FAST_TOLERANCE of the exact pipeline.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autotune.data.decode import DECODERS, require_simplejpeg
from autotune.errors import UsageError

CROP_MODES = ("center", "random", "random_resized")
OUTPUTS = ("float32", "uint8")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# How far the fast pipeline (exact: false, either decoder, draft on) may be from the
# exact one on the same crop box and flip: the mean absolute difference per value of one
# image, in levels of the 0-255 input scale (in normalised units: divided by 255 x std).
# Tested on synthetic photo-like JPEGs (tests/bench/test_transforms.py), which have more
# fine texture than photos and so differ more: up to about 0.3 at full scale (torch's and
# Pillow's antialiased bilinear round differently), up to about 1.9 for an image decoded
# at 1/2 to 1/8 (the DCT-domain downscale is a different low-pass from Pillow's filter).
FAST_TOLERANCE = {"full_scale": 0.5, "dct_scaled": 2.5}


def _three(name: str, v: Any) -> tuple[float, float, float]:
    if (not isinstance(v, (list, tuple)) or len(v) != 3
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)):
        raise UsageError(f"transform {name} must be three numbers (R, G, B), but got {v!r}.")
    return (float(v[0]), float(v[1]), float(v[2]))


@dataclass(frozen=True)
class TransformSpec:
    """What to do to each sample. Sizes in pixels.

    resize: shorter side after resizing (bilinear, antialiased, as torchvision's
        Resize on a PIL image); None skips the resize. Ignored by crop_mode
        'random_resized', which resizes its crop straight to `crop`.
    crop: output side (square).
    crop_mode: 'center' (eval), 'random' (RandomCrop) or 'random_resized'
        (RandomResizedCrop with `scale` and `ratio`).
    flip: random horizontal flip, p = 0.5.
    jitter: (brightness, contrast, saturation[, hue]) strengths as in torchvision's
        ColorJitter, applied in random order: PIL ImageEnhance for the first three, an HSV
        round trip for hue (as torchvision does on PIL images); None for no jitter.
    output: 'float32' (ToDtype(float32, scale=True): values in [0, 1]) or 'uint8'
        (PILToTensor). float32 is 4x the bytes per batch to collate, pin and copy.
    normalize: subtract `mean` and divide by `std` per channel (needs float32).
    decoder: 'pil' (Pillow, what torchvision's ImageFolder uses) or 'simplejpeg'
        (libjpeg-turbo straight into numpy; `pip install 'autotune-loader[fast]'`).
    draft: decode a JPEG at 1/2, 1/4 or 1/8 scale (DCT domain) when the drawn crop,
        that much smaller, still covers the output: cheaper on large photos, not what
        torchvision does; off by default and labelled when on.
    exact: True does each step as torchvision does (its pixels and its cost); False
        takes the same crops with fewer copies (output within FAST_TOLERANCE).
    """

    resize: int | None = 256
    crop: int = 224
    crop_mode: str = "center"
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = False
    jitter: tuple[float, ...] | None = None
    output: str = "float32"
    normalize: bool = True
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    decoder: str = "pil"
    draft: bool = False
    exact: bool = True

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
        for name in ("flip", "normalize", "draft", "exact"):
            if not isinstance(getattr(self, name), bool):
                raise UsageError(f"transform {name} must be true or false, but got "
                                 f"{getattr(self, name)!r}.")
        if self.output not in OUTPUTS:
            raise UsageError(f"transform output must be float32 or uint8, but got {self.output!r}.")
        if self.decoder not in DECODERS:
            raise UsageError(f"transform decoder must be pil or simplejpeg, but got {self.decoder!r}.")
        if self.normalize and self.output != "float32":
            raise UsageError(f"transform normalize needs output float32, but got output "
                             f"{self.output!r}; set normalize: false to keep uint8.")
        _three("mean", self.mean)
        if min(_three("std", self.std)) <= 0:
            raise UsageError(f"transform std must be three numbers > 0, but got {list(self.std)}.")

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
        for k in ("mean", "std"):
            if k in d:
                d[k] = _three(k, d[k])
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("scale", "ratio", "jitter", "mean", "std"):
            if d[k] is not None:
                d[k] = list(d[k])
        return d

    def describe(self) -> str:
        """One line for tables, e.g. 'random-resized crop 224 (scale 0.08-1), flip,
        float32 normalised'."""
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
        parts.append("float32 normalised" if self.normalize else
                     "float32 [0, 1]" if self.output == "float32" else "uint8")
        if self.decoder != "pil":
            parts.append(f"{self.decoder} decoder")
        if self.draft:
            parts.append("JPEG DRAFT decode")
        if not self.exact:
            parts.append("FAST (not torchvision's exact pixels)")
        return ", ".join(parts)


@dataclass
class SampleTransform:
    """Callable: encoded image (bytes, or a file path) -> tensor [3, crop, crop],
    float32 (normalised unless `normalize: false`) or uint8. Picklable, so DataLoader
    workers get their own copy; randomness from torch's generator, which DataLoader
    seeds in each worker."""

    spec: TransformSpec
    _consts: tuple[Any, ...] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.spec.decoder == "simplejpeg":
            require_simplejpeg()  # now, with the fix in the message, not in a worker

    def _constants(self) -> tuple[Any, ...]:
        if self._consts is None:
            import torch

            mean = torch.tensor(self.spec.mean, dtype=torch.float32).view(3, 1, 1)
            std = torch.tensor(self.spec.std, dtype=torch.float32).view(3, 1, 1)
            if self.spec.normalize:  # (x / 255 - mean) / std = x * scale + bias
                scale, bias = 1.0 / (255.0 * std), -mean / std
            else:
                scale, bias = torch.full((3, 1, 1), 1.0 / 255), torch.zeros((3, 1, 1))
            self._consts = (mean, std, scale, bias)
        return self._consts

    def __call__(self, data: bytes | str | os.PathLike[str]) -> Any:
        return self.run(data)[0]

    def run(self, data: bytes | str | os.PathLike[str]) -> tuple[Any, float]:
        """(the output; the seconds of it spent decoding: the header and the pixels)."""
        if isinstance(data, (str, os.PathLike)):
            data = Path(data).read_bytes()
        from autotune.data.decode import open_image

        opened = open_image(data, self.spec.decoder)
        return self._pixels(opened), opened.decode_s

    def _pixels(self, opened: Any) -> Any:
        from autotune.data import geometry, pixels

        s = self.spec
        geo = geometry.plan(s, *opened.size)  # crop, then flip: torchvision's draw order
        k = geo.reduction() if s.draft else 1
        jitter = geometry.jitter_params(s.jitter) if s.jitter else None
        mean, std, scale, bias = self._constants()
        if s.exact:
            return pixels.exact(opened, geo, k, s, jitter, mean, std)
        return pixels.fast(opened, geo, k, s, jitter, scale, bias)


def build_transform(spec: TransformSpec) -> SampleTransform:
    """The sample pipeline for `spec`."""
    return SampleTransform(spec)


class ImagenetTrainTransform(SampleTransform):
    """torchvision's standard ImageNet training transform on encoded images, for your
    own training loop: RandomResizedCrop(size) (scale 0.08-1, ratio 3/4-4/3, bilinear,
    antialiased), RandomHorizontalFlip, float32 in [0, 1], Normalize(ImageNet mean, std),
    CHW. Input: an image file's bytes or its path.

    fast=False is torchvision's pipeline step for step (the `resnet50` preset).
    fast=True is the `resnet50-fast` preset: simplejpeg decoding (`pip install
    'autotune-loader[fast]'`, or pass decoder='pil'), a JPEG decoded at reduced scale where
    the crop allows it, and fewer copies; the same random crops and flips, pixels within
    FAST_TOLERANCE of the exact pipeline. The output is float32: a batch moves 4x the
    bytes of a uint8 one through collate, pin_memory and the copy to the GPU.

        from torch.utils.data import DataLoader
        from autotune.data import FolderSource, ImagenetTrainTransform
        from autotune.data.torchds import ImageDataset

        ds = ImageDataset(FolderSource("/data/imagenet/train"), ImagenetTrainTransform(fast=True))
        loader = DataLoader(ds, batch_size=256, shuffle=True, num_workers=8, pin_memory=True)

    With torchvision's ImageFolder, hand it the bytes:
    `ImageFolder(root, loader=pathlib.Path.read_bytes, transform=ImagenetTrainTransform())`.
    """

    def __init__(self, size: int = 224, *, fast: bool = False, decoder: str | None = None,
                 scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3),
                 mean: tuple[float, float, float] = IMAGENET_MEAN,
                 std: tuple[float, float, float] = IMAGENET_STD) -> None:
        super().__init__(TransformSpec(
            resize=None, crop=size, crop_mode="random_resized", scale=tuple(scale),
            ratio=tuple(ratio), flip=True, output="float32", normalize=True, mean=tuple(mean),
            std=tuple(std), decoder=decoder or ("simplejpeg" if fast else "pil"), draft=fast,
            exact=not fast))
