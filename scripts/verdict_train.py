#!/usr/bin/env python3
"""A plain PyTorch training script, as a user writes one: its own Dataset of JPEGs
(decoded with PIL), a DataLoader, a training step (time.sleep: the accelerator's time,
the CPU free), and pytorch/examples ImageNet progress lines. It imports nothing of
autotune, so what `autotune monitor` and `autotune analyze` say of it is what they would
say of a stranger's job (scripts/bench_verdicts.py runs it in set-ups of known cause).

    python -m scripts.verdict_train --make 1000 --data /tmp/jpegs      # generate JPEGs
    python -m scripts.verdict_train --data /tmp/jpegs --workers 4 --step-ms 100 --steps 60
    python -m scripts.verdict_train --data /tmp/jpegs --workers 2 --heavy   # CPU-heavy

Lines: "Epoch: [0][ 10/62]\tTime  0.345 ( 0.567)\tData  0.123 ( 0.234)\tLoss ..."
(Time: the whole iteration; Data: the wait for the batch), one per --print-freq steps.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageFilter
from torch.utils.data import DataLoader, Dataset


class JpegFolder(Dataset):
    """Every *.jpg under root, its label the parent directory's index."""

    def __init__(self, root: str, size: int = 160, heavy: bool = False) -> None:
        self.files = sorted(str(p) for p in Path(root).rglob("*.jpg"))
        if not self.files:
            raise SystemExit(f"{root}: no *.jpg files; make some with --make N")
        classes = sorted({os.path.basename(os.path.dirname(f)) for f in self.files})
        self.label = {c: i for i, c in enumerate(classes)}
        self.size, self.heavy = size, heavy

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path = self.files[i]
        with open(path, "rb") as f:
            img = Image.open(io.BytesIO(f.read())).convert("RGB")
        if self.heavy:
            # A CPU-heavy augmentation: a large resample and a blur, several times the decode.
            img = img.resize((img.width * 2, img.height * 2), Image.BICUBIC)
            img = img.filter(ImageFilter.GaussianBlur(2)).rotate(7, Image.BICUBIC)
            img = img.resize((max(1, img.width // 2), max(1, img.height // 2)), Image.LANCZOS)
        img = img.resize((self.size, self.size), Image.BILINEAR)
        x = torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1)
        return x.float().div_(255.0), self.label[os.path.basename(os.path.dirname(path))]


def make(root: str, n: int, classes: int = 8, seed: int = 0) -> None:
    """n noisy JPEGs (~50-100 KB, 400-500 px) in `classes` class directories."""
    rng = np.random.default_rng(seed)
    for k in range(n):
        d = Path(root) / f"class{k % classes:02d}"
        d.mkdir(parents=True, exist_ok=True)
        w, h = int(rng.integers(400, 500)), int(rng.integers(350, 450))
        base = rng.integers(0, 255, (h // 8, w // 8, 3), dtype=np.uint8)
        img = Image.fromarray(base).resize((w, h), Image.BICUBIC)
        noise = rng.integers(0, 40, (h, w, 3), dtype=np.uint8)
        img = Image.fromarray(np.clip(np.asarray(img) + noise, 0, 255).astype(np.uint8))
        img.save(d / f"img{k:06d}.jpg", quality=90)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--make", type=int, default=0, help="generate N JPEGs under --data and exit")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--prefetch", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--step-ms", type=float, default=100.0)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--heavy", action="store_true", help="a CPU-heavy augmentation")
    ap.add_argument("--print-freq", type=int, default=1)
    ap.add_argument("--cpus", type=int, default=0, help="run on the first N CPUs (0: all)")
    a = ap.parse_args()
    if a.make:
        make(a.data, a.make)
        return 0
    if a.cpus:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:a.cpus])  # workers inherit it
    random.seed(0)
    torch.manual_seed(0)
    kw = {"prefetch_factor": a.prefetch} if a.workers > 0 else {}
    loader = DataLoader(JpegFolder(a.data, heavy=a.heavy), batch_size=a.batch_size,
                        shuffle=True, num_workers=a.workers, drop_last=True, **kw)
    done, epoch = 0, 0
    while done < a.steps:
        end = time.time()
        for i, (images, _labels) in enumerate(loader):
            data_t = time.time() - end
            time.sleep(a.step_ms / 1000.0)          # the accelerator's time
            done += 1
            if i % a.print_freq == 0:
                t = time.time() - end
                print(f"Epoch: [{epoch}][{i + 1:4d}/{len(loader)}]\tTime {t:6.3f} ({t:6.3f})\t"
                      f"Data {data_t:6.3f} ({data_t:6.3f})\tLoss 0.0e+00 (0.0e+00)", flush=True)
            if done >= a.steps:
                break
            end = time.time()
        epoch += 1
    print(f"=> {done} steps of {a.batch_size} ({a.workers} workers)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
