"""Fixtures for the bench tests: real image folders on the real disk, and leftovers checks."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest



@pytest.fixture(scope="session")
def bench_ds() -> Path:
    """400 ImageNet-like JPEGs in 4 classes on the root disk (throttle tests need a
    block device behind it), made once per session."""
    from autotune.synth import make_image_folder

    d = Path(tempfile.mkdtemp(prefix="autotune-bench-ds-", dir="/var/tmp"))
    make_image_folder(d / "train", 400, 4, seed=3, workers=2)
    yield d / "train"
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def small_images_ds() -> Path:
    """400 small (96 px) JPEGs in 4 classes on the root disk: a loader that decodes them
    is far faster than a 100 ms step even on a busy machine, yet each file still costs a
    disk read when cold."""
    import numpy as np
    from PIL import Image

    d = Path(tempfile.mkdtemp(prefix="autotune-bench-small-", dir="/var/tmp")) / "train"
    rng = np.random.default_rng(7)
    for i in range(400):
        cls = d / f"c{i % 4}"
        cls.mkdir(parents=True, exist_ok=True)
        arr = rng.integers(0, 256, size=(96, 96, 3), dtype=np.uint8)
        Image.fromarray(arr).save(cls / f"{i:04d}.jpg", quality=85)
    yield d
    shutil.rmtree(d.parent, ignore_errors=True)
