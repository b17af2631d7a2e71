"""sourceread.prefetch with its opens in a thread of their own (the LMDB writer's read-ahead):
the same files in the same order as without, every fd it opened closed, also when the
reader stops early, and an error of the entries' iterator raised where they are read."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
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


NOBODY = 65534


@pytest.mark.root
def test_a_users_own_files_are_read_without_touching_their_atime():
    """O_NOATIME is the owner's to use, not root's alone: a user converting a tree of
    their own writes no inode per file read; a file someone else owns is still read."""
    d = Path(tempfile.mkdtemp(prefix="autotune-noatime-", dir="/var/tmp"))
    # A tmpfs of the test's own, strictatime: every read updates the atime, whatever the
    # machine's own mounts say (a noatime disk would show nothing either way).
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=755,strictatime",
                    "autotune-noatime", str(d)], check=True)
    try:
        entries = []
        for i, owner in enumerate((NOBODY, 0)):
            p = d / f"f{i}.bin"
            p.write_bytes(bytes([i]) * 5000)
            os.chown(p, owner, owner)
            os.chmod(p, 0o644)
            st = p.stat()
            os.utime(p, ns=(st.st_mtime_ns - 3600 * 10**9, st.st_mtime_ns))
            entries.append(Entry(position=i, label=0, relpath=p.name, size=5000))
        before = [(d / e.relpath).stat().st_atime_ns for e in entries]

        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the user: nobody, who owns f0 and may only read f1
            code = 1
            try:
                os.close(r)
                os.setgroups([])
                os.setresgid(NOBODY, NOBODY, NOBODY)
                os.setresuid(NOBODY, NOBODY, NOBODY)
                got = [read_whole(fd, e.size) if isinstance(fd, int) else repr(fd)
                       for e, fd in prefetch(str(d), entries, thread=True)]
                os.write(w, repr([len(g) if isinstance(g, bytes) else g for g in got]).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            out = f.read().decode()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0 and out == "[5000, 5000]", out
        after = [(d / e.relpath).stat().st_atime_ns for e in entries]
        assert after[1] != before[1], "the non-owner's read did not update the atime"
        assert after[0] == before[0], "the owner's read updated the atime (no O_NOATIME)"
    finally:
        subprocess.run(["umount", str(d)], check=False)
        shutil.rmtree(d, ignore_errors=True)
