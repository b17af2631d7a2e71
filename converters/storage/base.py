"""The storage interface: names below a root, their sizes and versions, their bytes.

A name is a plain relative path ('/'-separated, checked by autotune_base.beneath.plain_name
where it comes from a manifest or a listing). Reads given a `Stat` from `list()` are
pinned to its version where the storage can (an object's ETag: an object replaced since
the listing is a SampleError naming it, never a mix of two versions).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from autotune_base.fsutil import pwrite_all


@dataclass(frozen=True)
class Stat:
    """One file or object: its name below the root, its size, and its version tag (an
    object's ETag; '' where the storage has none)."""

    name: str
    size: int
    tag: str = ""


class Storage(ABC):
    """Where a dataset's bytes live (see the module doc). Picklable: a client, when there
    is one, is made in the process that uses it."""

    root: str  # the root as messages show it (a path or s3://BUCKET/PREFIX)

    def where(self, name: str) -> str:
        """`name` as messages show it (a path, or an s3:// address)."""
        return f"{self.root.rstrip('/')}/{name}"

    @abstractmethod
    def list(self) -> list[Stat]:
        """Every file or object below the root (links not followed), in a stable order:
        an object store's by key, a folder's as a walk of sorted names."""

    @abstractmethod
    def stat(self, name: str) -> Stat | None:
        """`name`'s size and version, or None when there is none."""

    @abstractmethod
    def read(self, what: str | Stat, byte_range: tuple[int, int] | None = None) -> bytes:
        """The bytes of `what` (a name, or a Stat to pin the read to), or bytes
        [start, end) of it. FileNotFoundError / SampleError when it is gone."""

    @abstractmethod
    def open(self, what: str | Stat) -> Any:
        """A stream of the whole of `what` (`.read(n)`, `.close()`), read sequentially."""

    @abstractmethod
    def write_atomic(self, name: str, data: bytes, **meta: str) -> None:
        """Write `name` whole or not at all (a reader sees the old bytes or the new)."""

    def read_into(self, st: Stat, fd: int, *, part: int, in_flight: int) -> int:
        """`st`'s bytes written at their offsets into file `fd` by reads of `part` bytes,
        `in_flight` at once (one read when it fits in one part); the bytes written.
        OSError(EIO) naming it when a read gives fewer bytes than asked."""
        if st.size == 0:
            return 0
        ranges = [(a, min(a + part, st.size)) for a in range(0, st.size, part)]

        def one(r: tuple[int, int]) -> int:
            n = self.read_range_into(st, r if len(ranges) > 1 else None, fd, r[0])
            if n != r[1] - r[0]:
                raise ShortRead(st.name, n, r[1] - r[0])
            return n

        if len(ranges) == 1:
            return one(ranges[0])
        with ThreadPoolExecutor(max_workers=min(in_flight, len(ranges)),
                                thread_name_prefix="s3range") as ex:
            return sum(ex.map(one, ranges))


    def read_range_into(self, st: Stat, byte_range: tuple[int, int] | None, fd: int,
                        offset: int) -> int:
        """`st`'s bytes (or bytes [start, end) of it) written into `fd` from `offset`; the
        bytes written. A storage that can stream overrides it: this holds the range whole."""
        return pwrite_all(fd, self.read(st, byte_range), offset)


class ShortRead(Exception):
    """A ranged read gave fewer (or more) bytes than asked for."""

    def __init__(self, name: str, got: int, want: int) -> None:
        super().__init__(name, got, want)
        self.name, self.got, self.want = name, got, want


__all__ = ["ShortRead", "Stat", "Storage"]
