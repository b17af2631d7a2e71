"""One search trial as the search reasons about it (built from a BenchResult)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


def _fig(d: dict[str, Any], *path: str) -> float | None:
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)  # type: ignore[assignment]
    return d if isinstance(d, (int, float)) else None


@dataclass
class TrialRecord:
    number: int
    params: dict[str, Any]
    state: str          # "complete", "failed", "rejected", "pruned", "duplicate", "running"
    images_per_s: float | None = None
    images_per_s_spread: dict[str, Any] | None = None
    au: float | None = None
    data_wait_fraction: float | None = None
    peak_rss_mib: float | None = None
    # The tree's peak PSS: forked workers' shared pages once, as the cgroup charges them
    # (RSS counts them in every worker); None where it could not be read.
    peak_pss_mib: float | None = None
    shm_used_mib: float | None = None
    cpu_percent: float | None = None
    disk_util_pct: float | None = None
    disk_r_await_ms: float | None = None
    disk_reads_per_s: float | None = None
    reason: str | None = None
    hint: str | None = None
    # What failed, as the measurement names it (BenchResult.failure_kind: "step_error",
    # "shm", "timeout", ...); None for a trial that did not fail.
    failure_kind: str | None = None
    duplicate_of: int | None = None
    seconds: float | None = None
    timeline_file: str | None = None
    warnings: list[str] = field(default_factory=list)
    # Set on a confirmation: the trial's first images/s (its short window), the window
    # measured (a cold pass that ends early makes it shorter) and the one asked for.
    first_images_per_s: float | None = None
    window_s: float | None = None
    requested_window_s: float | None = None
    # Every measurement: the seconds and batches of its measured window.
    measured_s: float | None = None
    batches: int | None = None
    step_ms: float | None = None      # p50 of the (emulated or real) step
    # What the monitor saw in the window (autotune.monitor.figures): the verdict's evidence.
    system_figures: dict[str, Any] | None = None
    stages: dict[str, Any] | None = None   # autotune's pipeline by stage (BenchResult.stages)
    per_rank: list[dict[str, Any]] | None = None   # procs_per_node > 1: each rank's figures
    # Who measured it (autotune.search.shared.host_info): figures compare within one class
    # of hosts (CPU model, cores, storage class).
    host: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.state == "complete" and self.images_per_s is not None

    @property
    def memory_mib(self) -> float:
        """Peak memory of the loader tree + /dev/shm, the figure --max-memory bounds: its
        PSS where it was read, else its RSS (an upper bound)."""
        tree = self.peak_pss_mib if self.peak_pss_mib is not None else self.peak_rss_mib
        return (tree or 0.0) + (self.shm_used_mib or 0.0)

    @property
    def memory_kind(self) -> str:
        """What memory_mib sums for the loader tree: 'PSS' or 'RSS'."""
        return "PSS" if self.peak_pss_mib is not None else "RSS"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_bench(cls, number: int, params: dict[str, Any], r: dict[str, Any]) -> TrialRecord:
        """From BenchResult.to_dict()."""
        system = r.get("system") or {}
        return cls(
            number=number, params=params,
            state=("pruned" if r.get("failure_kind") == "pruned" else
                   "failed" if r.get("failed") else "complete"),
            images_per_s=r.get("images_per_s"), images_per_s_spread=r.get("images_per_s_spread"),
            au=r.get("au"), data_wait_fraction=r.get("data_wait_fraction"),
            peak_rss_mib=r.get("peak_rss_mib"), peak_pss_mib=r.get("peak_pss_mib"),
            shm_used_mib=_fig(system, "shm", "used_mib_max"),
            cpu_percent=r.get("cpu_percent"),
            disk_util_pct=_fig(system, "disk", "util_pct", "median"),
            disk_r_await_ms=_fig(system, "disk", "r_await_ms", "median"),
            disk_reads_per_s=_fig(system, "disk", "reads_per_s", "median"),
            reason=r.get("reason"), hint=r.get("hint"),
            failure_kind=r.get("failure_kind") if r.get("failed") else None,
            seconds=r.get("seconds_total"),
            measured_s=_fig(r, "window", "seconds"), step_ms=_fig(r, "step_ms", "p50"),
            system_figures=system.get("figures"), per_rank=r.get("per_rank"),
            stages=r.get("stages"),
            batches=int(b) if (b := _fig(r, "window", "batches")) is not None else None,
            timeline_file=r.get("timeline_file"), warnings=list(r.get("warnings") or []))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialRecord:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})
