"""Fixtures of the analysis tests: a generated dataset on the real disk, and a copy of it
on a loop-mounted ext4 image (its own block device: an IOPS cap on it slows the dataset's
reads and nothing else, not the Python and torch files the job also reads)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TRAIN_LOOP = HERE / "train_loop.py"
IMAGES = 512


@pytest.fixture(scope="session")
def an_dataset() -> Iterator[Path]:
    """512 ImageNet-like JPEGs (~80 KB) in 8 classes on the root disk, made once."""
    from autotune.synth import make_image_folder

    root = Path(tempfile.mkdtemp(prefix="autotune-analyze-", dir="/var/tmp"))
    make_image_folder(root / "train", IMAGES, 8, seed=3)
    yield root / "train"
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def loop_dataset(an_dataset: Path) -> Iterator[Path]:
    """The dataset copied onto a 96 MiB ext4 image mounted through a loop device (root)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (losetup/mount of a loop device)")
    for tool in ("mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed")
    base = Path(tempfile.mkdtemp(prefix="autotune-analyze-loop-", dir="/var/tmp"))
    img, mnt = base / "disk.img", base / "mnt"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(96 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True, capture_output=True)
    r = subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"cannot mount a loop device here: {r.stderr.strip()}")
    try:
        shutil.copytree(an_dataset, mnt / "train")
        os.sync()
        yield mnt / "train"
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
