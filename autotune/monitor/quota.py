"""The job's CPU quota and how often it throttled the job, per interval.

A container's `--cpus 0.5` (Kubernetes resources.limits.cpu, a systemd unit's CPUQuota=) is
a CFS quota on the job's cgroup: once its tasks have used 50 ms of CPU in a 100 ms period,
the kernel stops them all until the next period. They then wait for a CPU as they would on
a full machine (schedstat counts the stop as run-queue wait: "runnable 145 %"), while the
machine's cores may be idle. The cgroup's `cpu.stat` says so directly: the periods that
elapsed, those in which the quota ran out, the time stopped (autotune.cpus.parse_cpu_stat).

`QuotaSampler(pid)` reads the quota binding the monitored process (its own cgroup or an
ancestor: autotune.cpus.quota_of) lazily, on its first sample, and again whenever the
process moves to another cgroup (a launcher that joins one after it started); each
`sample()` is the counters' change since the last: the "cpu_quota" section of a monitor
record. What cannot be read is said (`available: false` and the reason), never raised.
`started(pid)` is a sampler with its baseline taken, or None where no quota can be seen
(no cgroup cpu hierarchy, no CFS bandwidth control): what the loader's burst and a bench
measurement's window read, so that a job with no quota hears nothing of one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.cpus import CpuStat, Quota, parse_cpu_stat, quota_of
from autotune.monitor.proctree import read_proc_stat


class QuotaSampler:
    """Per-interval throttling of process `pid`'s binding CPU quota."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._key: str | None = None        # /proc/PID/cgroup when last resolved
        self._quota: Quota | None = None
        self._stat: Path | None = None
        self._first: CpuStat | None = None   # counters at the baseline (whole-run totals)
        self._last: CpuStat | None = None

    def _resolve(self) -> None:
        """(Re)find the quota and its cpu.stat when the process's cgroup changed; a process
        that is gone keeps the cgroup it was last seen in (its counters stay readable).
        So does one that has exited and is not yet reaped: a zombie's cgroup file reads
        the root (cgroup v1), whose counters, taken for a move, reset the run's totals
        (run.json's throttled_share null, in 1 of many runs: the last sample's race with
        the job's exit)."""
        try:
            if self._key is not None and getattr(read_proc_stat(self.pid), "zombie", False):
                return
            key = Path(f"/proc/{self.pid}/cgroup").read_text()
        except OSError:
            if self._key is None:
                raise
            return
        if key != self._key:
            if self._key is not None and _cpu_path(key) == "/" != _cpu_path(self._key):
                # Into the root: where an exiting task's cgroup points from cgroup_exit on,
                # while /proc/PID/stat may not say Z yet (the same flake, once more). No
                # runtime moves a job there; its cgroup's counters stay the run's.
                return
            self._quota, self._stat = quota_of(self.pid)
            self._key, self._first, self._last = key, None, None

    def _read(self) -> CpuStat:
        if self._stat is None:
            raise OSError("no cgroup cpu hierarchy holds the job's process")
        stat = parse_cpu_stat(self._stat.read_text())
        if stat is None:
            raise OSError(f"{self._stat} has no nr_periods (no CFS bandwidth control)")
        return stat

    def sample(self) -> dict[str, Any] | None:
        """The change since the last call as a record section; None for the baseline."""
        try:
            self._resolve()
            cur = self._read()
        except OSError as e:
            return {"available": False, "reason": f"the job's cgroup cannot be read: {e}"}
        last, self._last = self._last, cur
        if self._first is None:
            self._first = cur
        if last is None:
            return None
        return self._section(last, cur)

    def _section(self, a: CpuStat, b: CpuStat) -> dict[str, Any]:
        q = self._quota
        return {"available": True, "cores": None if q is None else q.cores,
                "quota_file": None if q is None else q.file,
                "quota": None if q is None else q.raw, "stat_file": str(self._stat),
                "periods": max(0, b.periods - a.periods),
                "throttled": max(0, b.throttled - a.throttled),
                "throttled_s": max(0.0, b.throttled_s - a.throttled_s)}

    def totals(self) -> dict[str, Any] | None:
        """The whole run's (since the baseline in the job's last cgroup), as run.json
        records it; None before two reads."""
        if self._first is None or self._last is None:
            return None
        d = self._section(self._first, self._last)
        d["throttled_share"] = d["throttled"] / d["periods"] if d["periods"] else None
        return d


def _cpu_path(cgroup_file: str) -> str | None:
    """The cpu hierarchy's path in a /proc/PID/cgroup text (cgroup v1's line naming the
    cpu controller, else v2's "0::PATH"); None without either."""
    v2 = None
    for line in cgroup_file.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "cpu" in parts[1].split(","):
            return parts[2]
        if parts[0] == "0" and not parts[1]:
            v2 = parts[2]
    return v2


def quota_section(sampler: QuotaSampler | None) -> dict[str, Any] | None:
    """The "cpu_quota" section of a monitor record (never raises)."""
    if sampler is None:
        return None
    try:
        return sampler.sample()
    except Exception as e:  # noqa: BLE001  (a figure, never a reason to stop)
        return {"available": False, "reason": f"{type(e).__name__}: {e}"}


def started(pid: int) -> QuotaSampler | None:
    """A sampler of the CPU quota binding process `pid` (its own cgroup's or an
    ancestor's), its baseline taken; None where none can be read (nothing to say)."""
    q = QuotaSampler(pid)
    return q if quota_section(q) is None else None   # a section here: unreadable


def quota_line(q: dict[str, Any]) -> str:
    """A quota's throttling over a window as one line (the verdict's evidence, bench's
    table): `q` is a window's sum (autotune.monitor.figures: its last setting, its counts
    summed) with its cores."""
    share = q.get("throttled_share")
    return (f"CPU quota: the job's cgroup allows {q['cores']:g} CPU ({q.get('quota_file')} = "
            f"{q.get('quota')}); throttled in {'-' if share is None else f'{share * 100:,.0f}'} % "
            f"of {q.get('periods', 0):,.0f} periods, its tasks stopped "
            f"{q.get('throttled_s', 0):,.1f} s in all ({q.get('stat_file')})")


__all__ = ["QuotaSampler", "quota_line", "quota_section", "started"]
