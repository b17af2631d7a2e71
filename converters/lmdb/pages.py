"""A finished data.mdb's sha256 and its index (where each value lies) in one sequential
read, from LMDB's on-disk page format (LMDB 0.9, the format py-lmdb bundles).

The index used to come from LMDB itself: one get() per key through the memory map, and
py-lmdb's get() touches every 4 KiB page of a value (it pre-faults the value with the GIL
released), so the index read the whole file once and the sha256 a second time: two passes
over 1.6 GB after the last commit, from the disk whenever the page cache was dropped
meanwhile. Here the B-tree is walked from the newest meta page with pread (branch and
leaf pages only: a leaf node names the overflow page a value starts on, or holds the
value), and the file is then hashed through a sliding read-only map, gathering each
value's header (layout version, label, path length) on the way, which checks the index
against the layout of every value.

Anything that is not the expected format (magic, version, flags, a page that does not
say it is the page asked for, keys out of order) raises `PageFormatError`; the writer
then builds the index through LMDB as before, so this is a shortcut, never a different
answer.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from pathlib import Path
from typing import Any

from autotune_base.errors import ConvertError

from autotune_converters.lmdb.layout import HEADER, LAYOUT_VERSION, key

MAGIC = 0xBEEFC0DE
DATA_VERSION = 1
PAGEHDRSZ = 16
NODESIZE = 8
P_BRANCH, P_LEAF, P_OVERFLOW = 0x01, 0x02, 0x04
F_BIGDATA = 0x01
P_INVALID = (1 << 64) - 1
WINDOW = 64 << 20  # bytes mapped at a time: resident pages stay bounded
_PAGE = struct.Struct("<QHHHH")  # pgno, pad, flags, lower, upper
_NODE = struct.Struct("<HHHH")  # lo, hi, flags, ksize
_DB = struct.Struct("<IHHQQQQQ")  # pad, flags, depth, branch, leaf, overflow, entries, root


class PageFormatError(Exception):
    """data.mdb is not laid out as this reader expects."""


def _meta(page: bytes) -> tuple[int, int, int, int]:
    """(txnid, page size, main DB root, main DB entries) of a meta page."""
    magic, version = struct.unpack_from("<II", page, PAGEHDRSZ)
    if magic != MAGIC or version != DATA_VERSION:
        raise PageFormatError(f"meta page: magic {magic:#x}, version {version}")
    free = _DB.unpack_from(page, PAGEHDRSZ + 24)
    main = _DB.unpack_from(page, PAGEHDRSZ + 24 + _DB.size)
    if main[1] != 0:  # DUPSORT, INTEGERKEY, ...: not the plain main DB the writer makes
        raise PageFormatError(f"main DB flags {main[1]:#x}")
    txnid = struct.unpack_from("<Q", page, PAGEHDRSZ + 24 + 2 * _DB.size + 8)[0]
    return txnid, free[0], main[7], main[6]


def _page(fd: int, pgno: int, psize: int, want: tuple[int, ...]) -> bytes:
    p = os.pread(fd, psize, pgno * psize)
    if len(p) != psize:
        raise PageFormatError(f"page {pgno} lies past the end of the file")
    got, _, flags, _, _ = _PAGE.unpack_from(p, 0)
    if got != pgno or flags not in want:
        raise PageFormatError(f"page {pgno}: says page {got}, flags {flags:#x}")
    return p


def locate(fd: int) -> tuple[int, int, Any, Any, Any]:
    """(page size, how many '#'-keys come first, value offsets, value lengths, on
    overflow pages) of the main DB, in key order; the keys after the '#'-keys are checked
    to be key(0), key(1), ... as the walk reads them, and not kept.

    The figures are flat arrays (8 + 4 + 1 bytes a value): as lists of Python objects,
    keys included, they were ~135 bytes a sample, most of the writer's peak memory at
    1.28 million samples (416 MiB, in this publish step)."""
    from array import array

    head = os.pread(fd, PAGEHDRSZ + 256, 0)
    psize = _meta(head)[1]
    if psize < 512 or psize & (psize - 1):
        raise PageFormatError(f"page size {psize}")
    metas = [_meta(head), _meta(os.pread(fd, PAGEHDRSZ + 256, psize))]
    _, _, root, entries = max(metas)
    hashed = samples = 0
    offs = array("Q")
    lens = array("I")
    big = bytearray()
    stack = [] if root == P_INVALID else [root]
    while stack:
        pgno = stack.pop()
        p = _page(fd, pgno, psize, (P_BRANCH, P_LEAF))
        flags, lower = _PAGE.unpack_from(p, 0)[2:4]
        ptrs = struct.unpack_from(f"<{(lower - PAGEHDRSZ) // 2}H", p, PAGEHDRSZ)
        if flags == P_BRANCH:
            children = []
            for ptr in ptrs:
                lo, hi, fl, _ = _NODE.unpack_from(p, ptr)
                children.append(lo | hi << 16 | fl << 32)
            stack.extend(reversed(children))  # leftmost child next: keys in order
            continue
        for ptr in ptrs:
            lo, hi, fl, ksize = _NODE.unpack_from(p, ptr)
            size = lo | hi << 16
            at = ptr + NODESIZE + ksize
            k = p[ptr + NODESIZE:at]
            if not samples and k.startswith(b"#"):
                hashed += 1
            elif k != key(samples):
                raise PageFormatError(f"key {k!r} where {key(samples)!r} belongs")
            else:
                samples += 1
            if fl == F_BIGDATA:
                # the overflow page's own header is checked on the hashing pass
                offs.append(struct.unpack_from("<Q", p, at)[0] * psize + PAGEHDRSZ)
            elif fl == 0:
                if at + size > psize:
                    raise PageFormatError(f"page {pgno}: a value runs past its page")
                offs.append(pgno * psize + at)
            else:
                raise PageFormatError(f"page {pgno}: node flags {fl:#x}")
            lens.append(size)
            big.append(fl == F_BIGDATA)
    if len(offs) != entries:
        raise PageFormatError(f"{len(offs)} keys in the tree, the meta page says {entries}")
    return psize, hashed, offs, lens, big


def hash_and_index(path: str, samples: int) -> tuple[int, str, Any]:
    """(bytes, sha256 hex, index records) of a finished data.mdb holding `samples`
    values under keys 0 .. samples-1 (and '#'-keys, skipped); records are
    autotune_converters.lmdb.layout.index_dtype()."""
    import numpy as np

    from autotune_converters.lmdb.layout import index_dtype

    fd = os.open(path, os.O_RDONLY)
    try:
        psize, first, offs, lens, big = locate(fd)
        if len(offs) - first != samples:
            raise PageFormatError(f"{len(offs) - first} sample keys, expected {samples}")
        idx = np.zeros(samples, dtype=index_dtype())
        idx["offset"] = np.frombuffer(offs, dtype=np.uint64)[first:]
        idx["length"] = np.frombuffer(lens, dtype=np.uint32)[first:]
        del offs, lens
        if samples and int(idx["length"].min()) < HEADER.size:
            raise PageFormatError("a value shorter than the layout's header")
        size = os.fstat(fd).st_size
        if samples and int(idx["offset"].max()) + HEADER.size > size:
            raise PageFormatError("a value lies past the end of the file")
        digest, head = _hash_and_gather(fd, size, idx["offset"])
        if samples:
            idx["label"] = _check_heads(head, np.frombuffer(big, dtype=bool)[first:], idx, psize)
        return size, digest, idx
    finally:
        os.close(fd)


def _hash_and_gather(fd: int, size: int, offsets: Any) -> tuple[str, Any]:
    """One sequential pass over the file: its sha256, and the bytes before and at each
    value (its page header, an overflow page's own, and the value's header)."""
    import numpy as np

    order = np.argsort(offsets, kind="stable")
    starts = offsets[order]
    h = hashlib.sha256()
    span = PAGEHDRSZ + HEADER.size
    head = np.zeros((len(offsets), span), dtype=np.uint8)
    lo = 0
    for w0 in range(0, size, WINDOW):
        n = min(WINDOW, size - w0)
        mm = mmap.mmap(fd, n, prot=mmap.PROT_READ, offset=w0)
        try:
            mm.madvise(mmap.MADV_SEQUENTIAL)
            view = memoryview(mm)
            h.update(view)  # pages fault in here, with the GIL released
            hi = int(np.searchsorted(starts, w0 + n, side="left"))
            sel = order[lo:hi]
            if len(sel):
                a = np.frombuffer(mm, dtype=np.uint8)
                rel = (starts[lo:hi] - w0).astype(np.int64) - PAGEHDRSZ
                if int(rel.min()) < 0 or int(rel.max()) + span > n:
                    raise PageFormatError("a value header across a window's edge")
                head[sel] = a[rel[:, None] + np.arange(span)]
                del a
            lo = hi
            view.release()
        finally:
            mm.close()
    return h.hexdigest(), head


def _check_heads(head: Any, ovf: Any, idx: Any, psize: int) -> Any:
    """The gathered headers checked (overflow pages where their nodes point, the layout's
    version, a header no longer than its value); the labels."""
    import numpy as np

    page = head[ovf, :PAGEHDRSZ].copy()
    pgno = page[:, 0:8].view("<u8")[:, 0]
    pflags = page[:, 10:12].view("<u2")[:, 0]
    want = (idx["offset"][ovf] - PAGEHDRSZ) // psize
    if not ((pgno == want).all() and (pflags == P_OVERFLOW).all()):
        raise PageFormatError("a value's overflow page is not the one its node names")
    head = head[:, PAGEHDRSZ:]
    plen = head[:, 5:7].copy().view("<u2")[:, 0]
    if not (head[:, 0] == LAYOUT_VERSION).all():
        raise PageFormatError("a value without the layout's version byte")
    if not (HEADER.size + plen.astype(np.int64) <= idx["length"]).all():
        raise PageFormatError("a value shorter than its header says")
    return head[:, 1:5].copy().view("<u4")[:, 0]


def index_through_lmdb(path: Path, keys: Any) -> Any:
    """Index records of sample `keys` (ascending) of the data.mdb at `path`, located
    through LMDB's own memory map: the fallback where the page walk does not know the
    file, and its check on a spread of keys.

    py-lmdb's get() touches every page of a value, so the environment is reopened
    every 64 MiB of values: unmapping drops those pages from this process's RSS,
    which would otherwise grow to the size of data.mdb."""
    import lmdb
    import numpy as np

    from autotune_converters.lmdb.layout import buffer_address, index_dtype, map_base

    size = path.stat().st_size
    keys = list(keys)
    idx = np.zeros(len(keys), dtype=index_dtype())
    i = 0
    while i < len(keys):
        env = lmdb.open(str(path.parent), readonly=True, lock=False, readahead=True,
                        subdir=True, map_size=max(size, 1 << 20))
        try:
            base = map_base(str(path))
            if base is None:
                raise ConvertError(f"{path}: cannot find its memory map in "
                                   "/proc/self/maps; the LMDB index needs Linux /proc.")
            seen = 0
            with env.begin(buffers=True) as txn:
                while i < len(keys) and seen < 64 * 2**20:
                    v = txn.get(key(keys[i]))
                    if v is None:
                        raise ConvertError(f"{path}: key {key(keys[i]).decode()} missing "
                                           "after the last commit; delete DST and convert "
                                           "again.")
                    idx[i] = (buffer_address(v) - base, len(v), HEADER.unpack_from(v, 0)[1])
                    seen += len(v) + 4096
                    i += 1
        finally:
            env.close()
    return idx
