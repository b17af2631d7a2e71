"""Reading a unit's source files at the disk's speed: readahead hints, no per-file buffers.

A unit's files are read in plan order, which is a seeded shuffle: random on the disk. One
file at a time, each read waits for its own I/O (about 2,500 files/s measured here, cold);
`Prefetch` opens the next files ahead and asks the kernel for them with
`posix_fadvise(POSIX_FADV_WILLNEED)`, which starts their reads at once, so the disk has many
requests queued while this process checks and writes the current one (about 10,000
files/s, same disk, same order: see README "Measured here"). The window is bounded in files
and bytes, so the page cache it fills stays small.

`read_into` reads a whole file into a caller's buffer (a slice of a shard's staging buffer,
or a reused LMDB value buffer): a fresh `bytes` per file costs page faults of its own
(measured: 64 us against 20 us for an 86 KB file from the page cache).
"""

from __future__ import annotations

import collections
import os
from collections.abc import Iterable, Iterator
from functools import lru_cache

from autotune_converters.records import Entry

WINDOW_FILES = 64
WINDOW_BYTES = 32 << 20


@lru_cache(maxsize=1)
def _open_flags() -> int:
    # O_NOATIME spares an inode write per source file read; a non-owner gets EPERM from
    # it, so only root (who may always) uses it.
    return os.O_RDONLY | (getattr(os, "O_NOATIME", 0) if os.geteuid() == 0 else 0)


def _open_ahead(path: str) -> int | OSError:
    try:
        fd = os.open(path, _open_flags())
    except OSError as e:
        return e
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except (OSError, AttributeError):
        pass  # a hint only: a filesystem that refuses it is read as usual
    return fd


def prefetch(root: str, entries: Iterable[Entry], *, window_files: int = WINDOW_FILES,
             window_bytes: int = WINDOW_BYTES) -> Iterator[tuple[Entry, int | OSError]]:
    """(entry, open fd or the OSError of opening it), in order, with the next files'
    reads already started. The fd is closed when the next item is asked for (or the
    iterator is closed): use it before that."""
    it = iter(entries)
    ahead: collections.deque[tuple[Entry, int | OSError]] = collections.deque()
    ahead_bytes = 0
    done = False
    try:
        while True:
            while not done and (not ahead or (len(ahead) < window_files
                                              and ahead_bytes < window_bytes)):
                e = next(it, None)
                if e is None:
                    done = True
                    break
                ahead.append((e, _open_ahead(os.path.join(root, e.relpath))))
                ahead_bytes += e.size
            if not ahead:
                return
            e, fd = ahead.popleft()
            ahead_bytes -= e.size
            try:
                yield e, fd
            finally:
                if isinstance(fd, int):
                    os.close(fd)
    finally:
        for _, fd in ahead:
            if isinstance(fd, int):
                os.close(fd)


def read_into(fd: int, dest: memoryview) -> int | bytes:
    """Read the file behind `fd` from its start into `dest`; returns the byte count, or
    the whole content as bytes when it does not fit (a file that grew since the scan)."""
    n = 0
    while n < len(dest):
        k = os.preadv(fd, [dest[n:]], n)
        if k == 0:
            return n
        n += k
    more = [bytes(dest)]
    while True:  # dest is full: the file may be larger
        b = os.pread(fd, 1 << 20, n)
        if not b:
            break
        more.append(b)
        n += len(b)
    return n if len(more) == 1 else b"".join(more)


def read_whole(fd: int, size_hint: int) -> bytes:
    """The whole file as bytes, with one allocation when the scan's size still holds."""
    data = os.pread(fd, size_hint + 1, 0)
    if len(data) <= size_hint:
        return data
    chunks = [data]
    off = len(data)
    while True:
        b = os.pread(fd, 1 << 20, off)
        if not b:
            return b"".join(chunks)
        chunks.append(b)
        off += len(b)
