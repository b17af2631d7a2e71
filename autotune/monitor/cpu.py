"""System CPU utilisation, total and per core, from /proc/stat deltas.

busy = user + nice + system + irq + softirq + steal; total = busy + idle + iowait.
guest/guest_nice are already included in user/nice, so they are not added again.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.monitor.records import record_dict

PROC_STAT = "/proc/stat"


@dataclass(frozen=True)
class CpuTimes:
    """Cumulative busy / iowait / total ticks of one "cpu" line of /proc/stat."""

    busy: int
    iowait: int
    total: int


@dataclass(frozen=True)
class CpuSnapshot:
    """All cores plus the aggregate line, keyed "cpu" (total) and "cpu0", "cpu1", ..."""

    lines: dict[str, CpuTimes]


@dataclass(frozen=True)
class CpuUsage:
    """CPU % over one interval. Percentages of all cores (total) or of one core."""

    total_pct: float
    iowait_pct: float              # idle with I/O outstanding: a storage-bound hint
    busiest_core_pct: float        # a single-thread bottleneck shows here, not in the total
    per_core_pct: list[float]      # index = core number; cores offline in the interval omitted
    cores: int

    def to_dict(self) -> dict:
        return record_dict(self)


def parse_proc_stat(text: str) -> CpuSnapshot:
    """The cpu lines of a /proc/stat text."""
    lines: dict[str, CpuTimes] = {}
    for line in text.splitlines():
        if not line.startswith("cpu"):
            break  # the cpu lines come first; stop before the long intr line
        parts = line.split()
        v = [int(x) for x in parts[1:]] + [0] * 8   # old kernels have fewer columns
        user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
        busy = user + nice + system + irq + softirq + steal
        lines[parts[0]] = CpuTimes(busy=busy, iowait=iowait, total=busy + idle + iowait)
    return CpuSnapshot(lines)


def read_cpu_times(path: str = PROC_STAT) -> CpuSnapshot:
    """Read /proc/stat now."""
    with open(path, "rb") as f:
        # The cpu lines are at the start; 64 KiB covers ~500 cores without reading the
        # (possibly huge) interrupt counters.
        return parse_proc_stat(f.read(65536).decode(errors="replace").rsplit("\n", 1)[0])


def _pct(a: CpuTimes, b: CpuTimes) -> tuple[float, float]:
    # idle/iowait can step backwards on NO_HZ kernels (iowait is an estimate): clamp.
    total = max(0, b.total - a.total)
    if total == 0:
        return 0.0, 0.0
    busy = min(total, max(0, b.busy - a.busy))
    iowait = min(total, max(0, b.iowait - a.iowait))
    return busy / total * 100.0, iowait / total * 100.0


def cpu_usage(before: CpuSnapshot, after: CpuSnapshot) -> CpuUsage:
    """CPU % between two snapshots."""
    total_pct, iowait_pct = _pct(before.lines["cpu"], after.lines["cpu"])
    per_core: list[float] = []
    ids = sorted(int(k[3:]) for k in after.lines if k != "cpu" and k in before.lines)
    for i in ids:
        per_core.append(_pct(before.lines[f"cpu{i}"], after.lines[f"cpu{i}"])[0])
    return CpuUsage(total_pct=total_pct, iowait_pct=iowait_pct,
                    busiest_core_pct=max(per_core, default=0.0),
                    per_core_pct=per_core, cores=len(per_core))
