"""Helpers for the monitor tests: scratch files with real data, tool presence checks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

def write_real_file(path: Path, size: int) -> Path:
    """Create `path` with `size` random bytes, fsynced: real extents the disk must read
    (fallocate-only extents are unwritten and never read from disk)."""
    chunk = os.urandom(1 << 20)
    with open(path, "xb") as f:   # "x": never overwrite something we did not create
        left = size
        while left > 0:
            n = min(left, len(chunk))
            f.write(chunk[:n])
            left -= n
        f.flush()
        os.fsync(f.fileno())
    return path


@pytest.fixture
def make_real_file():
    """The write_real_file function, as a fixture (test modules cannot import conftest)."""
    return write_real_file


@pytest.fixture
def scratch_dir(tmp_path: Path) -> Path:
    """A scratch directory on the disk that backs the test's tmp_path."""
    d = tmp_path / "scratch"
    d.mkdir()
    return d
