"""A dataset written a moment ago is read cold after eviction, as it is after a cache drop.

`posix_fadvise(DONTNEED)`, the eviction of a job that is not root (or of a root one in a
container whose /proc/sys is read-only), drops only clean pages: the pages of files just
written, copied or untarred are dirty until the kernel writes them back (up to 30 s
later), and stayed cached. A walk through the README as a user in a container
(make_image_folder, then `autotune probe`) read its "cold" first level at 46,000 files/s
from RAM (4,500 after a `sync`) and blamed a host cache it could not drop. Real files,
the real page cache, mincore as root (truthful: see test_residency_unprivileged)."""

from __future__ import annotations

import os

import pytest

from autotune.bench.residency import resident_fraction
from autotune.cache import evict_files, ram_backed


def test_files_written_a_moment_ago_are_evicted(work_dir):
    if ram_backed(work_dir):
        pytest.skip(f"{work_dir} is RAM-backed: its pages are the data, never evicted")
    files = []
    for i in range(16):
        f = work_dir / f"img{i}.jpg"
        f.write_bytes(os.urandom(512 * 1024))   # dirty in the page cache, not yet on disk
        files.append(str(f))
    before = resident_fraction(files)
    if before is None:
        pytest.skip("mincore cannot tell residency here")
    assert before == 1.0                        # the set-up: every page is cached
    assert evict_files(files) == len(files)
    assert resident_fraction(files) == 0.0
