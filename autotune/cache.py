"""Cold-cache control: make the next read of a dataset come from storage, not RAM.

DESIGN.md: before a cold measurement the dataset's pages are dropped, with
`drop_caches` when root (the whole page cache), else `posix_fadvise(DONTNEED)` on every
file that will be read (only that file's clean pages; works unprivileged). The method
used is returned so every figure can say how cold it was. Both write dirty pages back
first: neither evicts a page that is not yet on the disk.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from typing import Literal

from autotune_base.fsutil import open_noatime

from autotune.errors import NotPermitted

ColdMethod = Literal["drop_caches", "fadvise"]


def ram_backed(path: str | os.PathLike[str]) -> str | None:
    """Why data under `path` can never be read cold (tmpfs, ramfs, /dev/shm: its pages are
    the data, and no cache drop evicts them), or None."""
    from autotune.blockdev import MEMORY_FS, mount_for

    m = mount_for(path)
    if m is not None and m.fstype in MEMORY_FS:
        return (f"{path} is on {m.fstype} ({m.mountpoint}): RAM-backed, its pages are the "
                "data and no cache drop evicts them")
    return None


def drop_caches(level: int = 3) -> None:
    """Flush dirty pages, then drop the page cache, and with level 3 dentries and inodes
    too (root only). Level 1 keeps the inodes: a re-read then costs the data's I/O alone,
    as in the steady state of a long run whose metadata is already cached."""
    if os.geteuid() != 0:
        raise NotPermitted("dropping the page cache needs root (/proc/sys/vm/drop_caches); "
                           "run as root, or autotune falls back to posix_fadvise per file.")
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write(f"{level}\n")
    except OSError as e:  # read-only /proc/sys in some containers
        raise NotPermitted(f"cannot write /proc/sys/vm/drop_caches ({e.strerror}); "
                           "in a container, mount /proc/sys read-write or run on the host.") from e


def _syncfs(fd: int) -> None:
    """Write back the dirty pages of the filesystem `fd` is on (syncfs(2): no privilege
    needed, other filesystems untouched); os.sync() only where the C library or the
    kernel has no syncfs. A failed write-back (EIO) is not ours to raise: the eviction
    is best effort, and what stays dirty stays cached."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        os.sync()
        return
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    if fn(fd) != 0 and ctypes.get_errno() == errno.ENOSYS:
        os.sync()


def evict_files(paths: Iterable[str | os.PathLike[str]]) -> int:
    """Ask the kernel to drop the cached pages of each file; returns how many were evicted.

    posix_fadvise(DONTNEED) drops clean pages only, so each filesystem is written back
    (syncfs) before its first file: a dataset just written, copied or untarred has dirty
    pages for up to 30 s, and they stayed cached, read back from RAM as "cold".
    Files that vanish or cannot be opened are skipped: eviction is best effort by nature.
    """
    n = 0
    synced: set[int] = set()
    for p in paths:
        try:
            fd = open_noatime(p)
        except OSError:
            continue
        try:
            dev = os.fstat(fd).st_dev
            if dev not in synced:
                synced.add(dev)
                _syncfs(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return n


def make_cold(paths: Iterable[str | os.PathLike[str]] | None = None, *,
              keep_inodes: bool = False) -> ColdMethod:
    """Drop caches as root (the page cache only with keep_inodes); otherwise evict `paths`
    one by one (which never drops inodes). Returns the method used."""
    if os.geteuid() == 0:
        try:
            drop_caches(1 if keep_inodes else 3)
            return "drop_caches"
        except NotPermitted:
            pass
    if paths is None:
        raise NotPermitted("cannot drop the page cache without root, and no file list was "
                           "given to evict one by one.")
    evict_files(paths)
    return "fadvise"
