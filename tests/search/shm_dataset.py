"""A user's dataset for the /dev/shm tests: each small JPEG becomes a 3x224x224 float32
sample (tiled, not resampled: cheap on a busy machine), so a batch of 64 is 36.8 MiB, as
the resnet50 preset's is, and a 64 MiB /dev/shm holds no worker's batches."""

from __future__ import annotations

import os

import numpy as np
import torch
import torch.utils.data
from PIL import Image


class Tiled(torch.utils.data.Dataset):
    def __init__(self, root: str) -> None:
        self.files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
                            if f.endswith(".jpg"))

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with Image.open(self.files[i]) as im:
            a = torch.from_numpy(np.asarray(im.convert("RGB"), dtype=np.uint8).copy())
        x = a.permute(2, 0, 1).float().div_(255.0)          # 3 x 32 x 32
        return x.repeat(1, 7, 7).contiguous(), i % 4          # 3 x 224 x 224 float32


def make(root: str) -> Tiled:
    return Tiled(root)
