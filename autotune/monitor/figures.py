"""System figures of a measured window: median / p95 / max / mean of what the monitor
sampled (CPU, the job's process tree and its run-queue wait, the disk, the GPUs).

One summary for a training log's window (`autotune analyze`) and for a bench trial's
window (`autotune search`), so that one verdict engine reads the same figures from both.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from autotune.monitor.summary import percentile
from autotune.monitor.timebudget import TimeBudget


def stat_of(values: list[float]) -> dict[str, float] | None:
    """median / p95 / max / mean / n of `values`, as every SystemFigures figure is held;
    None when there are none."""
    if not values:
        return None
    return {"median": percentile(values, 50), "p95": percentile(values, 95),
            "max": max(values), "mean": sum(values) / len(values), "n": len(values)}


@dataclass
class SystemFigures:
    """median / p95 / max / mean of each figure over the joined samples (None: not measured)."""

    source: str
    joined_by: str                      # "time" or "whole run (...)"
    samples: int
    samples_total: int
    bad_lines: int = 0
    window: tuple[float, float] | None = None
    cores: int | None = None
    cpu_total_pct: dict[str, float] | None = None
    cpu_iowait_pct: dict[str, float] | None = None
    busiest_core_pct: dict[str, float] | None = None
    other_cores_pct: dict[str, float] | None = None   # mean of the other cores, per sample
    proc_cpu_pct: dict[str, float] | None = None      # training process tree, % of one core
    proc_processes: dict[str, float] | None = None
    sched_wanted_pct: dict[str, float] | None = None  # tree on a CPU + waiting for one
    sched_run_wait_pct: dict[str, float] | None = None
    procs_running: dict[str, float] | None = None     # the machine's run queue
    job_cpus: dict[str, float] | None = None          # CPUs the job may run on
    job_cpus_busy_pct: dict[str, float] | None = None  # mean busy % of those CPUs
    disk_device: str | None = None
    disk_util_pct: dict[str, float] | None = None
    disk_r_await_ms: dict[str, float] | None = None
    disk_reads_per_s: dict[str, float] | None = None
    disk_read_mib_s: dict[str, float] | None = None
    # Behind the job's cgroup read cap on the disk: its limits ({"iops", "mib_s"}) and the
    # reads the cgroup charged against it (the job's own, where r/s is the whole disk's).
    disk_read_cap: dict[str, float | None] | None = None
    disk_cap_reads_per_s: dict[str, float] | None = None
    disk_cap_read_mib_s: dict[str, float] | None = None
    gpu_util_pct: dict[str, float] | None = None
    gpus: int = 0
    unavailable: dict[str, str] = field(default_factory=dict)
    # The job's time budget over the window (autotune.monitor.timebudget.TimeBudget's
    # to_dict()): where each process class's wall time went. None: not measured.
    budget: dict[str, Any] | None = None
    # /dev/shm at its fullest over the whole run, not only the window (a job that dies of a
    # full /dev/shm fills it after its last step): {"used_bytes", "total_bytes", "time"}.
    shm_peak: dict[str, float] | None = None
    # The open-files limit at its nearest over the whole run: the sample at which one
    # process of the job held the largest share of its soft limit: {"open", "limit",
    # "hard" (None: unlimited), "pid", "root" (the command itself, not a child), "time"}.
    files_peak: dict[str, Any] | None = None
    # The job's memory cgroup at its fullest over the whole run (autotune.monitor.memcg):
    # {"working_set_bytes", "limit_bytes", "limit_file", "time", "oom_kills" (the most any
    # sample counted since the monitor started)}.
    memory_peak: dict[str, Any] | None = None
    # The job's cgroup CPU quota over the window (autotune.monitor.quota): "cores" (None:
    # no quota), "quota_file", "quota", "stat_file", and summed over the joined samples
    # "periods", "throttled", "throttled_s", "throttled_share" (throttled / periods).
    cpu_quota: dict[str, Any] | None = None

    @staticmethod
    def med(s: dict[str, float] | None) -> float | None:
        return None if s is None else s["median"]

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SystemFigures:
        kw = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        if isinstance(kw.get("window"), list):
            kw["window"] = tuple(kw["window"])
        return cls(**kw)


FIGURES = ("cpu_total_pct", "cpu_iowait_pct", "busiest_core_pct", "other_cores_pct",
         "proc_cpu_pct", "proc_processes", "sched_wanted_pct", "sched_run_wait_pct",
         "procs_running", "job_cpus", "job_cpus_busy_pct", "disk_util_pct", "disk_r_await_ms",
         "disk_reads_per_s", "disk_read_mib_s", "disk_cap_reads_per_s", "disk_cap_read_mib_s",
         "gpu_util_pct")


# Per monitor section: (its key, the figure's name) copied as they are when present.
_PLAIN = {"proc": (("cpu_pct", "proc_cpu_pct"), ("processes", "proc_processes")),
          "sched": (("wanted_pct", "sched_wanted_pct"), ("run_wait_pct", "sched_run_wait_pct"),
                    ("procs_running", "procs_running")),
          "disk": (("util_pct", "disk_util_pct"), ("r_await_ms", "disk_r_await_ms"),
                   ("reads_per_s", "disk_reads_per_s"), ("read_mib_s", "disk_read_mib_s"),
                   ("cap_reads_per_s", "disk_cap_reads_per_s"),
                   ("cap_read_mib_s", "disk_cap_read_mib_s"))}


def finite_number(x: Any) -> float | None:
    """`x` as a figure: a finite number a float holds, else None (a metrics file may be a
    stranger's: a string, a bool or a 400-digit integer is no figure)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        f = float(x)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def whole_number(x: Any, below: int = 2**31) -> int | None:
    """`x` where it is a whole number from 0 below `below` (a count, an id a /proc file
    could give), else None: a metrics file may be a stranger's."""
    return x if isinstance(x, int) and not isinstance(x, bool) and 0 <= x < below else None


def _section(rec: dict[str, Any], name: str, series: dict[str, list[float]],
             unavailable: dict[str, str]) -> dict[str, Any] | None:
    """A sample's section when it was measured (its plain figures added to the series);
    None, with the reason kept, when the monitor could not measure it."""
    sec = rec.get(name)
    if not sec or not isinstance(sec, dict):
        return None
    if not sec.get("available"):
        unavailable[name] = str(sec.get("reason", ""))
        return None
    for key, fig in _PLAIN.get(name, ()):
        if (v := finite_number(sec.get(key))) is not None:
            series[fig].append(v)
    return sec


def _summed(rec: dict[str, Any], info: dict[str, Any], unavailable: dict[str, str]) -> None:
    """A record's budget and CPU-quota sections added to the window's running sums (a day
    of samples kept whole held a gigabyte: the sums are all finish() reads), or the
    reason a section was not measured."""
    for name in ("budget", "cpu_quota"):
        sec = rec.get(name)
        if not sec or not isinstance(sec, dict):
            continue
        if not sec.get("available"):
            unavailable[name] = str(sec.get("reason", ""))
        elif name == "budget":
            try:
                b = TimeBudget.from_dict(sec)
                if "budget" in info:
                    info["budget"].add(b)
                else:
                    info["budget"] = b
            except (TypeError, ValueError, KeyError, AttributeError, OverflowError):
                unavailable[name] = "a budget section that does not read as one"
        else:
            q = info.setdefault("quota", {"periods": 0.0, "throttled": 0.0, "throttled_s": 0.0})
            q.update({k: _setting(sec.get(k)) for k in _QUOTA_SETTING})
            q["cores"] = c if (c := finite_number(sec.get("cores"))) and c > 0 else None
            for k in _QUOTA_COUNTS:
                q[k] += finite_number(sec.get(k)) or 0.0


def _setting(x: Any) -> str | int | None:
    """A quota setting as the monitor writes it (a file's name, a figure), else None."""
    if isinstance(x, str):
        return x[:200]
    return x if isinstance(x, int) and not isinstance(x, bool) and abs(x) < 2**63 else None


def _list(x: Any) -> list[Any]:
    return x if isinstance(x, list) else []


def collect(rec: dict[str, Any], series: dict[str, list[float]], unavailable: dict[str, str],
            info: dict[str, Any]) -> None:
    cpu = _section(rec, "cpu", series, unavailable) or {}
    per = [v for x in _list(cpu.get("per_core_pct")) if (v := finite_number(x)) is not None]
    if cpu and (total := finite_number(cpu.get("total_pct"))) is not None:
        series["cpu_total_pct"].append(total)
        series["cpu_iowait_pct"].append(finite_number(cpu.get("iowait_pct", 0.0)) or 0.0)
        if per:
            top = max(per)
            series["busiest_core_pct"].append(top)
            if len(per) > 1:
                series["other_cores_pct"].append((sum(per) - top) / (len(per) - 1))
            info["cores"] = max(info.get("cores", 0), len(per))
    _section(rec, "proc", series, unavailable)
    sched = _section(rec, "sched", series, unavailable)
    ids = [i for i in _list((sched or {}).get("cpus")) if whole_number(i, 2**20) is not None]
    if ids:
        series["job_cpus"].append(float(len(ids)))
        if per and max(ids) < len(per):
            series["job_cpus_busy_pct"].append(sum(per[i] for i in ids) / len(ids))
    disk = _section(rec, "disk", series, unavailable)
    if disk is not None:
        info["disk_device"] = disk.get("device")
        if disk.get("cap_iops") is not None or disk.get("cap_mib_s") is not None:
            info["read_cap"] = {"iops": disk.get("cap_iops"), "mib_s": disk.get("cap_mib_s")}
    # Summed over the joined window: thread-seconds and periods add, shares follow.
    _summed(rec, info, unavailable)
    gpu = _section(rec, "gpu", series, unavailable)
    utils = [v for d in _list((gpu or {}).get("devices"))
             if isinstance(d, dict) and (v := finite_number(d.get("util_pct"))) is not None]
    if utils:
        series["gpu_util_pct"].append(sum(utils) / len(utils))
        info["gpus"] = max(info.get("gpus", 0), len(utils))


def finish(series: dict[str, list[float]], unavailable: dict[str, str], info: dict[str, Any],
           **kw: Any) -> SystemFigures:
    """The SystemFigures of collected series (kw: source, joined_by, samples, ...)."""
    figs = SystemFigures(cores=info.get("cores"), disk_device=info.get("disk_device"),
                         gpus=info.get("gpus", 0), disk_read_cap=info.get("read_cap"), **kw)
    for k in FIGURES:
        setattr(figs, k, stat_of(series[k]))
    budget = info.get("budget")
    figs.budget = budget.to_dict() if budget is not None else None
    figs.cpu_quota = _quota_of(info.get("quota"))
    if figs.cpu_quota is None and "cpu_quota" in unavailable:
        figs.unavailable["cpu_quota"] = unavailable["cpu_quota"]
    if budget is None and "budget" in unavailable:
        figs.unavailable["budget"] = unavailable["budget"]
    # A section measured in the window is not "unavailable" for the analysis.
    for sec, key in (("cpu", "cpu_total_pct"), ("proc", "proc_cpu_pct"),
                     ("disk", "disk_util_pct"), ("gpu", "gpu_util_pct")):
        if sec in unavailable and getattr(figs, key) is None:
            figs.unavailable[sec] = unavailable[sec]
    return figs


_QUOTA_SETTING = ("cores", "quota_file", "quota", "stat_file")   # the last sample's
_QUOTA_COUNTS = ("periods", "throttled", "throttled_s")           # summed


def _quota_of(q: dict[str, Any] | None) -> dict[str, Any] | None:
    """The CPU quota over the window: its last setting, its counts summed; None: none."""
    if q is None:
        return None
    out = {k: q.get(k) for k in (*_QUOTA_SETTING, *_QUOTA_COUNTS)}
    out["throttled_share"] = out["throttled"] / out["periods"] if out["periods"] else None
    return out


def figures_of(records: Iterable[dict[str, Any]], source: str, joined_by: str) -> SystemFigures:
    """The figures of monitor samples (their to_dict(), with "sched" and "budget" when
    sampled)."""
    series: dict[str, list[float]] = {k: [] for k in FIGURES}
    unavailable: dict[str, str] = {}
    info: dict[str, Any] = {}
    n = 0
    for rec in records:
        collect(rec, series, unavailable, info)
        n += 1
    return finish(series, unavailable, info, source=source, joined_by=joined_by, samples=n,
                  samples_total=n)
