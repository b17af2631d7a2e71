"""How much CPU this process may use: its affinity mask and every cgroup CPU quota above it.

A Slurm job, a systemd slice or a container without a cgroup namespace sets its quota on
the process's own cgroup (or an ancestor of it), not on the hierarchy's root, so the
root's `cpu.max` says "max" while the job may run 1.5 cores. This module reads
`/proc/self/cgroup`, finds where each hierarchy is mounted (`/proc/self/mountinfo`) and
walks from the process's own cgroup directory up to the mount's root, reading

* cgroup v1, the hierarchy holding the `cpu` controller (mounted alone or as
  `cpu,cpuacct`): `cpu.cfs_quota_us` / `cpu.cfs_period_us` (-1: no quota);
* cgroup v2: `cpu.max` ("QUOTA PERIOD", or "max PERIOD" for none).

The kernel enforces every quota on the way up, so the smallest one binds; the affinity
mask (`os.sched_getaffinity`, which a cpuset or `taskset` narrows) is a bound as well, and
the minimum of all of them wins.

How often a quota held the job back: the cgroup's `cpu.stat` counts the enforcement periods
that elapsed while its tasks ran (`nr_periods`), those at whose end the quota was used up
and its tasks were stopped until the next period (`nr_throttled`), and the time they spent
stopped (v1 `throttled_time` in ns, v2 `throttled_usec`). `parse_cpu_stat` reads either,
`quota_of(pid)` finds the binding quota of another process (the monitored job) and the
`cpu.stat` that counts its throttling.

Rounding: a quota is CPU *time* (1.5 cores = 150 ms of CPU per 100 ms), so throughput
scales with the fractional figure and `CpuLimit.cores` keeps it (the decode ceiling is
per-core rate x 1.5). Whole processes do not: a third worker process under a 1.5-core
quota finds no CPU time left and the quota throttles all of them at the end of each
period, so `CpuLimit.whole` rounds *down*, and is at least 1 (one process always runs).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from autotune.cgroups import CGROUP_FILE, MOUNTINFO_FILE, cgroup_dirs

__all__ = ["CpuLimit", "CpuStat", "Quota", "cgroup_quotas", "cpu_limit", "job_cores",
           "parse_cpu_stat", "quota_of", "usable_cores"]

# A quota within this of a whole number is that number (150000/100000 is 1.5 exactly, but
# a period of 33333 us makes 1 core 0.99999...).
_EPS = 1e-6


@dataclass(frozen=True)
class Quota:
    """One cgroup CPU quota found on the way up."""

    cores: float  # quota / period
    file: str     # the file it was read from
    raw: str      # its content, as the kernel wrote it

    def describe(self) -> str:
        return f"{self.file} = {self.raw} ({self.cores:g} core(s))"


@dataclass(frozen=True)
class CpuLimit:
    """The CPUs this process may use and where the figure came from."""

    cores: float                 # the binding figure; fractional when a quota binds
    source: str                  # what bound it: the affinity mask or a quota file
    affinity: int                # CPUs in the affinity mask
    quota: Quota | None = None   # the smallest cgroup quota found, None when unlimited
    quotas: tuple[Quota, ...] = ()  # every quota found, own cgroup first

    @property
    def whole(self) -> int:
        """Whole cores for worker counts: rounded down, at least 1 (see module doc)."""
        return max(1, math.floor(self.cores + _EPS))

    def to_dict(self) -> dict:
        return {"cores": self.cores, "whole": self.whole, "source": self.source,
                "affinity": self.affinity,
                "quota_cores": None if self.quota is None else self.quota.cores,
                "quotas": [q.describe() for q in self.quotas]}


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _read_quota(kind: str, d: Path) -> Quota | None:
    """The quota set in cgroup directory `d`, None when none is set or none is readable."""
    try:
        if kind == "v2":
            f = d / "cpu.max"
            raw = f.read_text().strip()
            q, _, period = raw.partition(" ")
            if q == "max":
                return None
            return Quota(int(q) / int(period), str(f), raw)
        f = d / "cpu.cfs_quota_us"
        q = int(f.read_text())
        if q <= 0:  # -1: no quota
            return None
        period = int((d / "cpu.cfs_period_us").read_text())
        return Quota(q / period, str(f), f"{q} (period {period})")
    except (OSError, ValueError, ZeroDivisionError):
        return None


def cgroup_quotas(*, cgroup_file: str | os.PathLike[str] = CGROUP_FILE,
                  mountinfo_file: str | os.PathLike[str] = MOUNTINFO_FILE) -> list[Quota]:
    """Every CPU quota set on the process's own cgroup and its ancestors, v1 and v2, own
    cgroup first. Ancestors above what this mount namespace shows (a container's mount
    root) cannot be read and are not in the list. [] when /proc is unreadable."""
    try:
        dirs = cgroup_dirs("cpu", cgroup_file=cgroup_file, mountinfo_file=mountinfo_file)
    except OSError:
        return []
    return [q for q, _ in _quotas_in(dirs)]


def _quotas_in(dirs: list[tuple[str, Path]]) -> list[tuple[Quota, Path]]:
    """The quota set in each of cgroup directories `dirs` (kind, dir), with its dir."""
    return [(q, d) for kind, d in dirs if (q := _read_quota(kind, d)) is not None]


def cpu_limit(*, cgroup_file: str | os.PathLike[str] = CGROUP_FILE,
              mountinfo_file: str | os.PathLike[str] = MOUNTINFO_FILE,
              affinity: int | None = None) -> CpuLimit:
    """The binding CPU limit: the affinity mask and every quota above the process, the
    minimum wins (`affinity` overrides the mask, for tests)."""
    n = _affinity() if affinity is None else affinity
    quotas = cgroup_quotas(cgroup_file=cgroup_file, mountinfo_file=mountinfo_file)
    smallest = min(quotas, key=lambda q: q.cores, default=None)
    if smallest is not None and smallest.cores < n:
        return CpuLimit(cores=smallest.cores, source=f"cgroup CPU quota {smallest.describe()}",
                        affinity=n, quota=smallest, quotas=tuple(quotas))
    return CpuLimit(cores=float(n), source=f"affinity mask ({n} CPUs)", affinity=n,
                    quota=smallest, quotas=tuple(quotas))


def usable_cores() -> int:
    """Whole cores this process may use at once (worker counts): see `cpu_limit`."""
    return cpu_limit().whole


def job_cores() -> int | float:
    """The CPUs this process may use as a step log's header records them: the fractional
    figure under a quota (0.5), a whole number otherwise (2)."""
    cores = cpu_limit().cores
    return int(round(cores)) if abs(cores - round(cores)) < _EPS else round(cores, 3)


@dataclass(frozen=True)
class CpuStat:
    """A cgroup's CPU bandwidth counters (`cpu.stat`), since the cgroup was made."""

    periods: int        # enforcement periods in which its tasks ran (nr_periods)
    throttled: int      # of them, those in which the quota ran out (nr_throttled)
    throttled_s: float  # time its tasks were stopped by the quota (throttled_time/_usec)


def parse_cpu_stat(text: str) -> CpuStat | None:
    """The bandwidth counters of a v1 `cpu.stat` (nr_periods, nr_throttled, throttled_time
    in ns) or a v2 one (nr_periods, nr_throttled, throttled_usec, beside usage_usec ...);
    None when the text holds no nr_periods (a kernel without CFS bandwidth control)."""
    kv: dict[str, int] = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) == 2 and f[1].lstrip("-").isdigit():
            kv[f[0]] = int(f[1])
    if "nr_periods" not in kv:
        return None
    secs = (kv["throttled_usec"] / 1e6 if "throttled_usec" in kv
            else kv.get("throttled_time", 0) / 1e9)
    return CpuStat(kv["nr_periods"], kv.get("nr_throttled", 0), secs)


def quota_of(pid: int | str, *, cgroup_file: str | os.PathLike[str] | None = None,
             mountinfo_file: str | os.PathLike[str] = MOUNTINFO_FILE
             ) -> tuple[Quota | None, Path | None]:
    """The binding CPU quota on process `pid`'s cgroup and its ancestors (None: none) and
    the `cpu.stat` that counts its throttling: that of the cgroup holding the quota (the
    kernel throttles there), else the process's own cgroup's (None: no cpu hierarchy
    seen). `cgroup_file` overrides /proc/PID/cgroup (tests). Raises OSError when it
    cannot be read (the process is gone)."""
    dirs = cgroup_dirs("cpu", cgroup_file=cgroup_file or f"/proc/{pid}/cgroup",
                       mountinfo_file=mountinfo_file)
    found = _quotas_in(dirs)
    if found:
        q, d = min(found, key=lambda x: x[0].cores)
        return q, d / "cpu.stat"
    return None, (dirs[0][1] / "cpu.stat" if dirs else None)
