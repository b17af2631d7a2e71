"""Markers for the emulation tests: skip (with the reason) only what this machine cannot do."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from autotune.blockdev import block_device_for
from autotune.emulate.slowfs import fuse_unavailable_reason
from autotune.emulate.throttle import CgroupBackend, detect_backend
from autotune.errors import NotPermitted


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("root") and os.geteuid() != 0:
        pytest.skip("needs root (cgroup I/O throttle, drop_caches)")
    if item.get_closest_marker("fuse"):
        reason = fuse_unavailable_reason()
        if reason:
            pytest.skip(f"needs FUSE: {reason}")
    if item.get_closest_marker("fio") and shutil.which("fio") is None:
        pytest.skip("needs the fio binary (apt-get install fio)")


@pytest.fixture
def backend() -> CgroupBackend:
    try:
        return detect_backend()
    except NotPermitted as e:
        pytest.skip(str(e))


@pytest.fixture
def disk_dir(tmp_path: Path) -> Path:
    """tmp_path, when it lives on a block device that a cgroup can throttle."""
    if block_device_for(tmp_path) is None:
        pytest.skip(f"{tmp_path} has no block device (tmpfs/overlay?): nothing to throttle")
    return tmp_path


@pytest.fixture
def random_file() -> Callable[[Path, int], Path]:
    """Factory: write_random_file(path, size)."""
    return write_random_file


def write_random_file(path: Path, size: int) -> Path:
    """`size` random bytes, fsynced: real extents that a cold read must fetch from disk
    (fallocate-only extents are unwritten and never touch the disk)."""
    with open(path, "xb") as f:  # "x": never overwrite a file this test did not create
        left = size
        while left > 0:
            n = min(left, 1 << 20)
            f.write(os.urandom(n))
            left -= n
        f.flush()
        os.fsync(f.fileno())
    return path
