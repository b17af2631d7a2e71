"""What every converter output format shares: its errors, the sample records that flow
from the reading workers to a writer, and the writer base class.

A conversion is cut into *units* (a WebDataset shard, or an LMDB commit batch) fixed by
the plan before any is written, so that the result does not depend on the number of
workers, the order in which they finish, or where a killed run stopped. A writer
(`FormatWriter`) says which units are still to do, does the part of a unit that can run in
a worker process (`work`), takes the results in unit order in the parent (`accept`) and
publishes the finished output (`publish`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from converters.errors import ConvertError
from converters.fsutil import fsync_dir as _fsync_dir


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
class Skip:
    """A source file left out, and why (the reason starts with a short kind phrase)."""

    relpath: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"path": self.relpath, "reason": self.reason}

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
    def from_dict(cls, d: dict[str, Any]) -> UnitResult:
        return cls(unit=int(d["unit"]), samples=int(d["samples"]),
                   source_bytes=int(d["source_bytes"]), stored_bytes=int(d["stored_bytes"]),
                   reencoded=int(d.get("reencoded", 0)), skipped=list(d.get("skipped", [])),
                   shard=d.get("shard"))


class FormatWriter(ABC):
    """Writes the units of a plan in one output format.

    Lifecycle (in the parent unless said otherwise):
        open()                   resume state: which units are done (`done` results)
        pending() -> [unit]      the units still to write, ascending
        work(unit)               in a worker process (or inline): the part that scales
        accept(unit, out)        in unit order: store/commit, returns the UnitResult
        publish() -> [shard]     make the output final (fsync, checksum, rename)
        close()                  release handles (also after an error)

    Instances are pickled to worker processes before `open()`; keep `work`'s state
    picklable and open files lazily in the process that uses them.
    """

    format: str = "?"

    def __init__(self, dst: Path, workdir: Any, plan: Any, opts: Any, sample_opts: Any) -> None:
        self.dst = dst
        self.workdir = workdir  # converters.workdir.WorkDir
        self.plan = plan  # converters.plan.Plan
        self.opts = opts  # converters.conversion.ConvertOptions
        self.sample_opts = sample_opts  # converters.images.SampleOptions

    @abstractmethod
    def open(self) -> list[UnitResult]:
        """Prepare for writing; return the results of the units a previous run finished."""

    @abstractmethod
    def pending(self) -> list[int]:
        """Units still to write, ascending."""

    @abstractmethod
    def work(self, unit: int) -> Any:
        """Process one unit in a worker; the return value goes to `accept` (picklable)."""

    @abstractmethod
    def accept(self, unit: int, out: Any) -> UnitResult:
        """Take a unit's work in unit order; return its result once durable."""

    @abstractmethod
    def publish(self, results: list[UnitResult]) -> list[dict[str, Any]]:
        """Make the output final; return the manifest's shards[] entries."""

    def close(self) -> None:
        """Release open handles; safe to call twice and after an error."""

    def samples(self, unit: int) -> Iterator[Sample | Skip]:
        """The unit's samples read and checked (in a worker); with --on-error fail the
        first bad file raises ConvertError naming it."""
        from converters.images import load_sample
        from converters.scan import skip_message

        for entry in self.plan.entries(unit):
            s = load_sample(entry, self.sample_opts)
            report_progress(1, entry.size)
            if isinstance(s, Skip) and self.opts.on_error == "fail":
                raise ConvertError(skip_message(self.sample_opts.root, s))
            yield s

    # Shared helpers -------------------------------------------------------------------

    fsync_dir = staticmethod(_fsync_dir)


# Progress shared by the worker processes: (samples, source bytes) done, in a shared
# array set by the pool initializer (a plain list when converting inline).
_progress: Any = None


def set_progress_counter(counter: Any) -> None:
    global _progress
    _progress = counter


def report_progress(samples: int, nbytes: int) -> None:
    c = _progress
    if c is None:
        return
    if isinstance(c, list):
        c[0] += samples
        c[1] += nbytes
        return
    with c.get_lock():
        c[0] += samples
        c[1] += nbytes
