"""Fixtures for the bench tests: real image folders on the real disk, and leftovers checks."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import psutil
import pytest

from autotune.bench.procs import group_members


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


def measurement_processes() -> list[psutil.Process]:
    """Live descendants of this test process that run the bench child (or its workers,
    which are forks of it and share its command line)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "autotune.bench.child" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            continue
    return out


def assert_no_leftovers(res) -> None:
    """Nothing of the measurement's process group remains, not even a zombie."""
    pgid = res.process["pid"]
    assert pgid, res.process
    assert group_members(pgid) == [], f"left in group {pgid}: {group_members(pgid)}"
    assert measurement_processes() == []
    assert res.process["stray"] == []


@pytest.fixture
def no_leftovers():
    """The assert_no_leftovers check, as a fixture (test modules here are not a package)."""
    return assert_no_leftovers


@pytest.fixture
def live_measurements():
    """measurement_processes, as a fixture."""
    return measurement_processes
