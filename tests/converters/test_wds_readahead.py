"""A shard reader asks for its next megabytes before it reads them.

Behind a capped or slow disk whose read-ahead is Linux's usual 128 KB, each of the
reader's 1 MiB reads waited for its own I/O after the previous megabyte was decoded. The
reader now asks the kernel for the next few MiB (posix_fadvise WILLNEED) so that they
arrive while the worker decodes: seen here as those pages in the page cache (mincore)
before the reader has read past its first member.
"""

from __future__ import annotations

import ctypes
import io
import mmap
import os
import tarfile
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from autotune_converters.wds.tarfmt import READ_AHEAD, iter_members

MEMBER = 100_000


def _resident(path: Path, start: int, stop: int) -> float:
    """The share of the file's pages in [start, stop) that are in the page cache."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = mmap.PAGESIZE
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as m:
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        n = (os.path.getsize(path) + page - 1) // page
        vec = (ctypes.c_ubyte * n)()
        assert libc.mincore(ctypes.c_void_p(addr), n * page, vec) == 0, ctypes.get_errno()
        pages = vec[start // page:stop // page]
        del addr
    return sum(v & 1 for v in pages) / len(pages)


def _shard(path: Path, members: int) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as t:
        for i in range(members):
            data = os.urandom(MEMBER)
            info = tarfile.TarInfo(f"{i:010d}.jpg")
            info.size = len(data)
            t.addfile(info, fileobj=io.BytesIO(data))


# alone: another test's drop_caches between the reader's request and the mincore look
# empties the window (seen in CI's parallel pass: 67 %, 33 %, 0 %; reproduced here with
# a drop_caches loop beside it: 0 %, 0 %, 0 %).
@pytest.mark.alone
@pytest.mark.root
def test_the_next_megabytes_are_asked_for_before_the_reader_reaches_them(work_dir):
    from autotune.blockdev import block_device_for
    from autotune.emulate.setups import own_disk

    src = work_dir / "src"
    src.mkdir()
    _shard(src / "shard-000000.tar", 120)  # 12 MB
    with ExitStack() as stack:
        # A disk of its own, at the read-ahead most disks have (this machine's is 8 MiB,
        # which would hide the difference).
        (work_dir / "disk").mkdir()
        shard = own_disk(stack, src, work_dir / "disk") / "shard-000000.tar"
        dev = block_device_for(str(shard))
        assert dev is not None
        Path(f"/sys/block/{dev.name}/queue/read_ahead_kb").write_text("128")
        # mincore counts a page once its read has completed (uptodate, Linux 6.x): right
        # after next() the window's reads may still be in flight (seen: 33 % and 67 %,
        # in runs, on an idle machine with 23 GiB free). So each try waits up to 2 s for
        # them; the old reader's window never comes however long it waits (a third, from
        # the kernel's own read-ahead). A few tries: another job's cache drop between the
        # request and the look empties it.
        seen = []
        for _ in range(5):
            with open(shard, "rb") as f:  # out of the page cache: this file alone
                os.fsync(f.fileno())
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            assert _resident(shard, 0, 8 << 20) < 0.05
            it = iter_members(shard)
            key, suffix, data = next(it)
            assert (key, suffix, len(data)) == ("0000000000", "jpg", MEMBER)
            # The reader has read its first 1 MiB; the megabytes after it, up to its
            # window, were asked for (the kernel's own read-ahead at 128 KB brings ~8 %).
            deadline = time.monotonic() + 2.0
            while (got := _resident(shard, 1 << 20, READ_AHEAD)) <= 0.9 \
                    and time.monotonic() < deadline:
                time.sleep(0.01)
            seen.append(got)
            assert sum(1 for _ in it) == 119  # and every member still comes, in order
            if seen[-1] > 0.9:
                break
        assert max(seen) > 0.9, (f"{[f'{a:.0%}' for a in seen]} of the "
                                 f"{(READ_AHEAD >> 20) - 1} MiB after the first in the page cache")
