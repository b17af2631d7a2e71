"""A user's own dataset, as the factory tests use it: not autotune's pipeline.

Grayscale, a Gaussian blur and a 192-pixel random crop, float16 tensors in dict samples,
listed from the image folder by a CSV-less walk: what a user might write for a
self-supervised or medical-imaging job.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch
import torch.utils.data
from PIL import Image, ImageFilter


class GrayBlur(torch.utils.data.Dataset):
    def __init__(self, root: str, crop: int = 192) -> None:
        self.files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
                            if f.lower().endswith((".jpg", ".jpeg", ".png")))
        self.classes = sorted({os.path.basename(os.path.dirname(p)) for p in self.files})
        self.crop = crop

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> dict:
        p = self.files[i]
        with Image.open(p) as im:
            g = im.convert("L").filter(ImageFilter.GaussianBlur(2))
        w, h = g.size
        c = min(self.crop, w, h)
        x, y = random.randint(0, w - c), random.randint(0, h - c)
        g = g.crop((x, y, x + c, y + c)).resize((self.crop, self.crop))
        arr = torch.from_numpy(np.asarray(g, dtype=np.float16) / np.float16(255.0))
        return {"image": arr.unsqueeze(0),
                "label": self.classes.index(os.path.basename(os.path.dirname(p)))}


def make(root: str) -> GrayBlur:
    return GrayBlur(root)


def make_dict(root: str) -> dict:
    return {"dataset": GrayBlur(root)}


def make_bad_type(root: str) -> list:
    return [1, 2, 3]


def make_raises(root: str) -> GrayBlur:
    raise RuntimeError(f"no index for {root}")


class _Unbatchable(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> object:
        return object()


def make_unbatchable(root: str) -> _Unbatchable:
    return _Unbatchable()
