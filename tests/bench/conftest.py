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


