"""The storage's verdict (`autotune probe`): what the storage under a dataset can deliver,
each finding with the figures behind it. A family of rules (autotune.verdict._base), one
module each, read in the order of STORAGE_RULES; every rule that applies adds its
evidence, advice or pass/fail line:

  read_cap       this process's cgroup caps reads on the disk: every figure is the cap's
  samples        a conversion read through its reader: its ceiling in samples/s
  replay         the replay of the dataset's files, and its steady state
  latency        latency-bound: more reads in flight raise the rate
  fio_ignored    fio's figures failed the plausibility check
  random_iops    random 4 KiB read IOPS > SMALL_FILE_MIN_IOPS (the probe's rule)
  cross_check    fio's bounds for the mean file against the replay (a cache?)
  no_replay      only fio's figures: no ceiling in files/s

It sits below the job's engine (autotune.verdict.rules), beside the probe that calls it:
it imports only the probe's result types, for their annotations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.verdict._base import every
from autotune.verdict.storage._case import SMALL_FILE_MIN_IOPS, StorageCase, StorageRule
from autotune.verdict.storage.cross_check import CrossCheck
from autotune.verdict.storage.fio_ignored import FioIgnored
from autotune.verdict.storage.latency import LatencyBound
from autotune.verdict.storage.no_replay import NoReplay
from autotune.verdict.storage.random_iops import RandomIops
from autotune.verdict.storage.read_cap import ReadCapped
from autotune.verdict.storage.replay import Replay
from autotune.verdict.storage.samples import SamplesCeiling

if TYPE_CHECKING:
    from autotune.probe.classify import FilesystemInfo
    from autotune.probe.fio import FioResult
    from autotune.probe.replay import ReplayResult
    from autotune.probe.samples import SampleReplay

# The order the rules are read in (that of the evidence and advice lines).
STORAGE_RULES: tuple[StorageRule, ...] = (ReadCapped(), SamplesCeiling(), Replay(),
                                          LatencyBound(), FioIgnored(), RandomIops(),
                                          CrossCheck(), NoReplay())


def storage_verdict(fs: FilesystemInfo, fio: FioResult | None, rp: ReplayResult | None,
                    samples: SampleReplay | None = None, *, cold: bool = False,
                    cold_reason: str | None = None, cap: Any = None) -> dict[str, Any]:
    """The storage's class and ceiling with the rules and evidence behind them (the
    probe's `verdict`). `cold`, `cold_reason`: whether the replay read from a cold cache,
    and why not; `cap`: this process's cgroup read cap on the disk (autotune.readcap)."""
    case = StorageCase.of(fs, fio, rp, samples, cap)
    every(STORAGE_RULES, case)
    summary = (f"{fs.klass} storage ({fs.type or '?'}"
               + (f" on {fs.device}" if fs.device else "") + ")")
    if cap is not None:
        summary += ", behind this cgroup's read cap"
    if case.ceiling is not None:
        summary += f": at most ~{case.ceiling:,.0f} files/s for this dataset's files"
    if fio is None and rp is None and samples is None:
        # The class alone is the kernel's word for the device (its rotational flag, its
        # driver): a verdict on storage that nothing read from must say so.
        summary += (": nothing measured (no fio run, no replay); the class is what the "
                    "kernel says of the device")
    return {"class": fs.klass,
            "storage_files_per_s": None if case.ceiling is None else round(case.ceiling, 1),
            "storage_pass": rp.ceiling[1] if rp is not None else None,
            "storage_method": rp.ceiling_method if rp is not None else None,
            "best_concurrency": case.best_c, "rules": case.rules, "evidence": case.evidence,
            "advice": case.advice, "summary": summary, "cold": cold, "cold_reason": cold_reason,
            **case.extra}


__all__ = ["SMALL_FILE_MIN_IOPS", "STORAGE_RULES", "storage_verdict"]
