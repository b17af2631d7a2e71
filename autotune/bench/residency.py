"""How much of a dataset is in the page cache (mincore), and loading it there.

A figure labelled warm should say how warm: `resident_fraction` checks a sample of the
files page by page, so "warm" in a result means "N % of the sampled pages were cached
when the run started", not a hope.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import random
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_MAP_FAILED = ctypes.c_void_p(-1).value
PAGE = mmap.PAGESIZE


_CAP_FOWNER = 3


def _has_cap_fowner() -> bool:
    """CAP_FOWNER in this process's effective set (/proc/self/status CapEff)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_FOWNER & 1)
    except (OSError, ValueError, IndexError):
        pass
    return os.geteuid() == 0


def mincore_truthful(path: str | os.PathLike[str], st: os.stat_result,
                     fowner: bool | None = None) -> bool:
    """Whether the kernel's mincore tells the truth about this file for this process
    (`fowner`: whether it has CAP_FOWNER, when the caller read that once for many files).

    Since Linux 5.2 (mm/mincore.c, can_do_mincore) mincore reports the page cache of a
    file mapping only to a process that owns the file (or has CAP_FOWNER) or could open
    it for writing; to anyone else it reports every page resident, evicted or not. A
    job that is not root reading a dataset another user owns (a shared mount, a
    read-only one) is that case.
    """
    if st.st_uid == os.geteuid() or (_has_cap_fowner() if fowner is None else fowner):
        return True
    try:
        return os.access(path, os.W_OK, effective_ids=os.access in os.supports_effective_ids)
    except OSError:
        return False


def file_residency(path: str | os.PathLike[str], *, fowner: bool | None = None
                   ) -> tuple[int, int]:
    """(resident pages, total pages) of one file; (0, 0) for an empty or unreadable file,
    and for one whose residency the kernel will not tell this process (`mincore_truthful`).

    Mapping a file does not read it: mincore only reports what the cache already holds.
    """
    try:
        # O_NONBLOCK: a FIFO (or a device) in a dataset must not hang the check.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return 0, 0
    try:
        st = os.fstat(fd)
        size = st.st_size
        if size == 0 or not stat.S_ISREG(st.st_mode) or not mincore_truthful(path, st, fowner):
            return 0, 0
        pages = (size + PAGE - 1) // PAGE
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            return 0, 0
        try:
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                return 0, 0
            return sum(v & 1 for v in vec), pages
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def resident_fraction(paths: Sequence[str | os.PathLike[str]], sample: int = 256, seed: int = 0
                      ) -> float | None:
    """Fraction of the pages of up to `sample` files (drawn at random) in the page cache;
    None when none of them can be checked (empty, unreadable, or files whose residency
    mincore hides from this process: see `mincore_truthful`)."""
    if not paths:
        return None
    # Positions drawn, not a copy of the list: it may hold a million paths.
    picked = paths if len(paths) <= sample else [
        paths[i] for i in random.Random(seed).sample(range(len(paths)), sample)]
    res = tot = 0
    fowner = _has_cap_fowner()  # once, not once a file
    for p in picked:
        r, t = file_residency(p, fowner=fowner)
        res += r
        tot += t
    return res / tot if tot else None


def preload(paths: Iterable[Path], chunk: int = 1 << 20) -> int:
    """Read every file once so that it is cached (for a warm ceiling); returns bytes read."""
    n = 0
    for p in paths:
        try:
            with open(p, "rb", buffering=0) as f:
                while True:
                    b = f.read(chunk)
                    if not b:
                        break
                    n += len(b)
        except OSError:
            continue
    return n
