"""The LMDB layout autotune writes: keys and the compact value format.

Keys: the sample index as 10 ASCII digits, zero-padded (b"0000000000", b"0000000001", ...),
so key order is index order and writes are appends. Two bookkeeping keys start with '#'
(which sorts before the digits, so appends stay appends):
    b"#meta"      JSON: layout version, num_samples, num_classes, classes (a complete env)
    b"#progress"  JSON: next unit, samples so far, map size (only while being written;
                  committed in the same transaction as the unit's data)

Value (all integers little-endian):
    offset 0   u8   layout version (1)
    offset 1   u32  label
    offset 5   u16  P = length of the original path
    offset 7   P    original relative path, UTF-8 (undecodable bytes as surrogateescape)
    offset 7+P      the image file's bytes (the original bytes unless re-encoded)

Index, DST/data.idx, one 16-byte record per sample in index order (little-endian):
    u64 offset of the value in data.mdb, u32 value length, u32 label
It lets a reader fetch a value with one pread of its byte range. Asking LMDB for the value
instead touches every 4 KiB page of it through the memory map (py-lmdb 3's get() does so
even with buffers=True, measured with page-fault counters), and with readahead off each
page is its own I/O: the ~12 images/s collapse at 300 IOPS.
"""

from __future__ import annotations

import os
import struct
from typing import Any

LAYOUT_VERSION = 1
HEADER = struct.Struct("<BIH")
KEY_DIGITS = 10
META_KEY = b"#meta"
PROGRESS_KEY = b"#progress"
DESCRIPTION = ("key: sample index as 10 zero-padded ASCII digits; value: u8 version (1), "
               "u32 label, u16 path length P, P bytes original path (UTF-8), image bytes; "
               "little-endian")


INDEX_FILE = "data.idx"
INDEX_RECORD = 16


def index_dtype() -> Any:
    import numpy as np

    return np.dtype([("offset", "<u8"), ("length", "<u4"), ("label", "<u4")])


def map_base(path: str) -> int | None:
    """Start address of this process's mapping of file `path` at offset 0."""
    real = os.path.realpath(path)
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].rstrip("\n") == real and int(parts[2], 16) == 0:
                    return int(parts[0].split("-", 1)[0], 16)
    except OSError:
        pass
    return None


def buffer_address(buf: Any) -> int:
    """Address of a read-only buffer's first byte."""
    import numpy as np

    return int(np.frombuffer(buf, dtype=np.uint8).ctypes.data)


def key(index: int) -> bytes:
    return b"%010d" % index


def value_head(label: int, relpath: str) -> bytes:
    """A stored value's bytes before the image: the header, then the original path."""
    # paths are informational (PATH_MAX is 4096 anyway): at most 0xFFFF bytes, the end kept
    p = relpath.encode("utf-8", "surrogateescape")[-0xFFFF:]
    return HEADER.pack(LAYOUT_VERSION, label, len(p)) + p


def encode_value(label: int, relpath: str, data: bytes) -> bytes:
    return value_head(label, relpath) + data


def decode_value(v: bytes | memoryview) -> tuple[int, str, memoryview]:
    """(label, original path, image bytes view) of a stored value."""
    mv = memoryview(v)
    if len(mv) < HEADER.size:
        raise ValueError(f"value of {len(mv)} bytes is shorter than the {HEADER.size}-byte header")
    version, label, plen = HEADER.unpack_from(mv, 0)
    if version != LAYOUT_VERSION:
        raise ValueError(f"value layout version {version}, expected {LAYOUT_VERSION}")
    start = HEADER.size + plen
    if start > len(mv):
        raise ValueError("value shorter than its path length says")
    path = bytes(mv[HEADER.size:start]).decode("utf-8", "surrogateescape")
    return label, path, mv[start:]
