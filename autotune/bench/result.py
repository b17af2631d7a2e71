"""The result of one bench: figures, labels, system summary, warnings, failure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SCHEMA = "autotune.bench/1"


@dataclass
class BenchResult:
    """One measured configuration. Figures are None when the run failed.

    images_per_s: samples delivered in the measured window / its wall time (the whole
        window; the sub-windows' median and spread are in images_per_s_spread).
    data_wait_fraction: time blocked in next(loader_iter) / wall time of the window.
    au: time in the step / wall time (None when there is no step: compute_ms 0).
    batch_wait_ms: p50/p95/max of the per-batch wait.
    cpu_percent: CPU of the measurement process tree (main + workers), time-weighted mean
        over the window, in % of one core (200 = two cores busy).
    peak_rss_mib: highest sum of RSS over the process tree during the run (shared pages
        are counted in every process that maps them, as `ps` does: an upper bound).
    peak_pss_mib: highest sum of PSS over the process tree (a page shared by n processes
        counts 1/n in each, as the cgroup is charged for it once); None where a process's
        /proc/PID/smaps_rollup could not be read.
    cold / cold_method: the page cache was dropped before the run, and how; warm runs
        carry `cache.resident_fraction_at_start`.
    """

    dataset: dict[str, Any]
    config: dict[str, Any]
    failed: bool = False
    reason: str | None = None
    hint: str | None = None
    failure_kind: str | None = None
    images_per_s: float | None = None
    images_per_s_overall: float | None = None
    images_per_s_spread: dict[str, Any] | None = None
    data_wait_fraction: float | None = None
    au: float | None = None
    input_bound: bool | None = None
    batch_wait_ms: dict[str, float] | None = None
    step_ms: dict[str, float] | None = None
    cpu_percent: float | None = None
    peak_rss_mib: float | None = None
    peak_pss_mib: float | None = None
    cold: bool = True
    cold_method: str | None = None
    cold_reason: str | None = None    # why not cold (warm, from memory, RAM-backed data)
    cache: dict[str, Any] = field(default_factory=dict)
    window: dict[str, Any] = field(default_factory=dict)
    system: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    process: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    timeline_file: str | None = None
    seconds_total: float = 0.0
    # With ranks (procs_per_node > 1): each rank's figures; images_per_s is the node's
    # (ranks x the slowest rank), images_per_s_sum what the ranks delivered together.
    per_rank: list[dict[str, Any]] | None = None
    # autotune's own pipeline: seconds and shares of read, decode, transform and collate
    # in the window, timed in each loading process (autotune.data.stages.stage_budget);
    # None for a user's own dataset (the time budget in system.figures is its budget).
    stages: dict[str, Any] | None = None
    images_per_s_sum: float | None = None

    @property
    def label(self) -> str:
        """'cold (drop_caches)' or 'WARM (93 % cached)': how every output names the cache."""
        if self.config.get("in_memory"):
            return f"FROM MEMORY ({self.dataset.get('images', self.config['in_memory'])} images)"
        if self.cache.get("ram_backed"):
            return "RAM-backed (never cold)"
        if self.cold:
            # A run refused or failed before its cache drop (/dev/shm too small) has no method.
            return (f"cold ({self.cold_method})" if self.cold_method else
                    "cold (not measured)" if self.failed else "cold (?)")
        frac = self.cache.get("resident_fraction_at_start")
        return "WARM" + (f" ({frac:.0%} of sampled pages cached at start)" if frac is not None else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "dataset": self.dataset,
            "config": self.config,
            "failed": self.failed,
            "reason": self.reason,
            "hint": self.hint,
            "failure_kind": self.failure_kind,
            "images_per_s": self.images_per_s,
            "images_per_s_overall": self.images_per_s_overall,
            "images_per_s_spread": self.images_per_s_spread,
            "data_wait_fraction": self.data_wait_fraction,
            "au": self.au,
            "input_bound": self.input_bound,
            "batch_wait_ms": self.batch_wait_ms,
            "step_ms": self.step_ms,
            "cpu_percent": self.cpu_percent,
            "peak_rss_mib": self.peak_rss_mib,
            "peak_pss_mib": self.peak_pss_mib,
            "cold": self.cold,
            "cold_reason": self.cold_reason,
            "cold_method": self.cold_method,
            "cache_label": self.label,
            "cache": self.cache,
            "window": self.window,
            "stages": self.stages,
            "system": self.system,
            "warnings": self.warnings,
            "process": self.process,
            "environment": self.environment,
            "timeline_file": self.timeline_file,
            "seconds_total": self.seconds_total,
            "per_rank": self.per_rank,
            "images_per_s_sum": self.images_per_s_sum,
        }
