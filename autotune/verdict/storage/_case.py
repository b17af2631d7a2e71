"""The case the storage rules judge (`autotune probe`): the filesystem's class, fio's
figures, the replay of the dataset's own files and a conversion's reads through its
reader, with the findings gathered so far."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autotune.verdict._base import Rule

if TYPE_CHECKING:
    from autotune.probe.classify import FilesystemInfo
    from autotune.probe.fio import FioResult
    from autotune.probe.replay import ReplayResult
    from autotune.probe.samples import SampleReplay

# The seed article's rule of thumb: small-file image training wants > 50k random IOPS.
SMALL_FILE_MIN_IOPS = 50_000
# A file read whole is served in readahead-sized requests (128 KiB by default on Linux).
READAHEAD_BYTES = 128 * 1024


@dataclass
class StorageCase:
    """One probe's figures; `ceiling` (files/s) and `best_c` (reads in flight at it) are
    the replay's ceiling. The rules add to `evidence`, `advice`, `rules` (the pass/fail
    lines) and `extra` (keys after the verdict's own)."""

    fs: FilesystemInfo
    fio: FioResult | None
    rp: ReplayResult | None
    samples: SampleReplay | None = None
    cap: Any = None              # autotune.readcap.ReadCap on the dataset's disk, if any
    ceiling: float | None = None
    best_c: int | None = None
    evidence: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    rules: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, fs: FilesystemInfo, fio: FioResult | None, rp: ReplayResult | None,
           samples: SampleReplay | None = None, cap: Any = None) -> StorageCase:
        case = cls(fs, fio, rp, samples, cap)
        if rp is not None:
            lv, _ = rp.ceiling
            case.ceiling, case.best_c = lv.files_per_s, lv.concurrency
        return case

    @property
    def fio_plausible(self) -> bool:
        return self.fio is not None and self.fio.plausible


class StorageRule(Rule[StorageCase, None]):
    """A rule of the storage's verdict: each that applies adds its findings to the case."""


__all__ = ["READAHEAD_BYTES", "SMALL_FILE_MIN_IOPS", "StorageCase", "StorageRule"]
