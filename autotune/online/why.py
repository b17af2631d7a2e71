"""Why AU stays under 0.90 after tuning: what the loader's own workers were doing.

A stand-in until the verdict engine (autotune/verdict) takes the online loader's figures:
one engine is to serve search, analyze and this loader. Here only the cheap part of the
time budget: the workers' CPU seconds (/proc/PID/stat utime + stime) over each window, one
read per worker per window. Workers on a CPU most of the time at the worker bound: decode;
workers off the CPU most of the time while the loop waits: their reads (storage), or
whatever else they block on.
"""

from __future__ import annotations

import os
import time

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
ON_CPU = 0.8    # workers busier than this on a CPU: decode-bound
OFF_CPU = 0.5   # workers on a CPU less than this: waiting (storage, a lock, the network)
INPUT_BOUND_AU = 0.90


def cpu_seconds(pids: list[int]) -> float | None:
    """utime + stime of these processes, None when one cannot be read."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rpartition(")")[2].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
        except (OSError, IndexError, ValueError):
            return None
    return total / _TICK


class WorkerCpu:
    """The workers' share of their wall time on a CPU, between two samples of one pool."""

    def __init__(self) -> None:
        self._last: tuple[tuple[int, ...], float, float] | None = None
        self.share: float | None = None

    def sample(self, pids: list[int]) -> None:
        now, cpu = time.perf_counter(), cpu_seconds(pids)
        key = tuple(pids)
        last, self._last = self._last, (key, now, cpu) if cpu is not None and pids else None
        if last is None or self._last is None or last[0] != key or now <= last[1]:
            self.share = None
            return
        self.share = (cpu - last[2]) / ((now - last[1]) * len(pids))


def explain(au: float, share: float | None, workers: int, bound: int) -> tuple[str, str]:
    """(bottleneck, one line) for a loop that tuning left input-bound."""
    head = f"AU {au:.2f} after tuning (under {INPUT_BOUND_AU:.2f})"
    if workers == 0 or share is None:
        return "unknown", f"{head}: the workers' CPU time could not be read"
    pct = f"{100 * share:.0f} %"
    if share >= ON_CPU and workers >= bound:
        return "decode", (f"{head}: decode; the {workers} workers are on a CPU {pct} of the "
                          f"time at the worker bound ({bound}): a cheaper transform or more "
                          "cores")
    if share < OFF_CPU:
        return "storage", (f"{head}: the workers are off the CPU {100 - 100 * share:.0f} % "
                           "of the time, waiting (on storage if their reads are slow): "
                           "`autotune probe PATH`, then `autotune convert` / `autotune stage`")
    return "loader", (f"{head}: the workers are on a CPU {pct} of the time with cores free; "
                      "`autotune search` measures the pipeline apart")
