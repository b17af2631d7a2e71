"""sourceread.prefetch with its opens in a thread of their own (the LMDB writer's read-ahead):
the same files in the same order as without, every fd it opened closed, also when the
reader stops early, and an error of the entries' iterator raised where they are read."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from autotune_converters.records import Entry
from autotune_converters.sourceread import prefetch, read_whole


def _tree(tmp_path: Path, n: int) -> list[Entry]:
    out = []
    for i in range(n):
        p = tmp_path / f"f{i:03d}.bin"
        p.write_bytes(bytes([i % 251]) * (1000 + i))
        out.append(Entry(position=i, label=0, relpath=p.name, size=1000 + i))
    out.append(Entry(position=n, label=0, relpath="missing.bin", size=10))
    return out


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("files,nbytes", [(1, 1), (4, 1 << 20), (64, 3000)])
def test_the_thread_gives_what_the_inline_window_gives(tmp_path, files, nbytes):
    entries = _tree(tmp_path, 40)
    before = _open_fds()

    def read(thread: bool) -> list[tuple[str, object]]:
        return [(e.relpath, type(fd).__name__ if isinstance(fd, OSError)
                 else read_whole(fd, e.size))
                for e, fd in prefetch(str(tmp_path), entries, window_files=files,
                                      window_bytes=nbytes, thread=thread)]

    assert read(True) == read(False)
    assert read(True)[-1] == ("missing.bin", "FileNotFoundError")
    assert not _open_fds() - before  # nothing left open (another test's fd may close meanwhile)


def test_stopping_early_closes_the_files_opened_ahead(tmp_path):
    entries = _tree(tmp_path, 40)
    before = _open_fds()
    it = prefetch(str(tmp_path), entries, window_files=16, window_bytes=1 << 20, thread=True)
    for _ in range(3):
        next(it)
    # The window is opened ahead by the thread: waited for, not assumed to have run.
    deadline = time.monotonic() + 30
    while len(_open_fds() - before) <= 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(_open_fds() - before) > 1
    it.close()
    assert not _open_fds() - before  # nothing left open (another test's fd may close meanwhile)


def test_an_error_listing_the_entries_is_raised_to_the_reader(tmp_path):
    entries = _tree(tmp_path, 5)

    def listing():
        yield from entries[:3]
        raise RuntimeError("plan file unreadable")

    got = []
    with pytest.raises(RuntimeError, match="plan file unreadable"):
        for e, _ in prefetch(str(tmp_path), listing(), thread=True):
            got.append(e.relpath)
    assert got == [e.relpath for e in entries[:3]]
