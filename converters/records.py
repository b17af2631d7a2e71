"""The records that flow through a conversion: scanned entries, checked samples, skipped
files, finished units; and the progress counter the reading workers share.

A conversion is cut into *units* (a WebDataset shard, or an LMDB commit batch) fixed by
the plan before any is written, so that the result does not depend on the number of
workers, the order in which they finish, or where a killed run stopped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Entry:
    """One scanned source file at its place in the plan (after the seeded shuffle)."""

    position: int  # index in the shuffled plan (also the WebDataset key)
    label: int
    relpath: str  # relative to SRC (absolute only when a file list gave it so)
    size: int  # bytes at scan time


@dataclass
class Sample:
    """A checked sample, ready to store."""

    position: int
    label: int
    relpath: str
    ext: str  # member suffix / format: jpg, png, webp, ...
    data: bytes
    source_bytes: int  # bytes read from the source (differs from len(data) if re-encoded)
    reencoded: bool = False


@dataclass
class SkippedFile:
    """A source file left out, and why (the reason starts with a short kind phrase)."""

    relpath: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"path": self.relpath, "reason": self.reason}

    def message(self, root: str) -> str:
        """The --on-error fail message for this file."""
        return (f"{os.path.join(root, self.relpath)}: {self.reason}; fix or remove the file, "
                "or rerun with --on-error skip to leave it out (it is then listed in "
                "manifest.json skipped[])")

    @property
    def kind(self) -> str:
        """'truncated JPEG' from 'truncated JPEG (image file is truncated ...)'."""
        return self.reason.split(" (", 1)[0]


@dataclass
class UnitResult:
    """What one finished unit contributes to the manifest and the summary."""

    unit: int
    samples: int
    source_bytes: int  # bytes read from the source for the stored samples
    stored_bytes: int  # image bytes stored (after any re-encode)
    reencoded: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)
    shard: dict[str, Any] | None = None  # {file, samples, bytes, sha256} for shard formats

    def to_dict(self) -> dict[str, Any]:
        return {"unit": self.unit, "samples": self.samples, "source_bytes": self.source_bytes,
                "stored_bytes": self.stored_bytes, "reencoded": self.reencoded,
                "skipped": self.skipped, "shard": self.shard}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "a unit record") -> UnitResult:
        """The record as written; a shard it names must be a plain relative path (the
        name goes into the manifest): UnsafeName naming `where` otherwise."""
        from autotune_base.beneath import plain_name

        shard = d.get("shard")
        if shard is not None:
            plain_name(shard["file"], where, "shard.file")
        return cls(unit=int(d["unit"]), samples=int(d["samples"]),
                   source_bytes=int(d["source_bytes"]), stored_bytes=int(d["stored_bytes"]),
                   reencoded=int(d.get("reencoded", 0)), skipped=list(d.get("skipped", [])),
                   shard=shard)


# Progress of the reading workers: (samples, source bytes) done. Inline, a plain list;
# in a pool, the pool's shared array of one (samples, bytes) pair per worker, `_slot` this
# worker's. One writer per pair, so no lock: a worker killed while it held a shared lock
# (by the pool on another unit's error, or by the OOM killer) left it held, and the
# parent's next read of the counter waited forever (CI: `convert --on-error fail` hung).
_progress: Any = None
_slot = 0


def set_progress_counter(counter: Any, slot: int = 0) -> None:
    global _progress, _slot
    _progress, _slot = counter, slot


def report_progress(samples: int, nbytes: int) -> None:
    c = _progress
    if c is None:
        return
    i = 2 * _slot
    c[i] += samples
    c[i + 1] += nbytes
