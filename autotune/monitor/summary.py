"""median / p95 / max of the main figures over a list of samples, or as they arrive."""

from __future__ import annotations

import math
from array import array
from typing import Any, Iterable

# (section, field) pairs summarised when present; GPU fields are added per device.
MAIN_FIGURES: tuple[tuple[str, str], ...] = (
    ("disk", "reads_per_s"), ("disk", "read_mib_s"), ("disk", "r_await_ms"),
    ("disk", "rareq_sz_kib"), ("disk", "aqu_sz"), ("disk", "util_pct"),
    ("disk", "writes_per_s"), ("disk", "write_mib_s"),
    ("cpu", "total_pct"), ("cpu", "iowait_pct"), ("cpu", "busiest_core_pct"),
    ("proc", "cpu_pct"), ("proc", "rss_bytes"), ("proc", "processes"), ("proc", "open_files"),
    ("shm", "used_bytes"),
)
GPU_FIGURES = ("util_pct", "mem_util_pct", "mem_used_bytes")


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    if not values:
        return math.nan
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def stats(values: list[float]) -> dict[str, float]:
    """median, p95 and max of a list of numbers."""
    return {"median": percentile(values, 50), "p95": percentile(values, 95),
            "max": max(values), "n": len(values)}


def summarize(samples: Iterable[Any], min_interval_s: float = 0.0) -> dict[str, Any]:
    """Summary of Sample objects: figures keyed "section.field" (GPU: "gpu0.util_pct"),
    and for each section that was never measurable, the last reason given.

    Samples shorter than `min_interval_s` (the final partial one at stop) are left out of
    the figures, where a few milliseconds would make a noisy max, unless none is longer.
    """
    run = RunningSummary(min_interval_s)
    for s in samples:
        run.add(s)
    return run.result()


class RunningSummary:
    """`summarize()` as the samples arrive, in memory bounded over a run of any length:
    never the samples (a day of them held whole is some 300 MB, in the job's own memory
    limit), and each figure's numbers exactly only up to `EXACT_SAMPLES` (`_Series`)."""

    def __init__(self, min_interval_s: float = 0.0) -> None:
        self.min_interval_s = min_interval_s
        self._long, self._short = _Figures(), _Figures()

    def add(self, sample: Any) -> None:
        (self._long if sample.interval_s >= self.min_interval_s else self._short).add(sample)

    def result(self) -> dict[str, Any]:
        if self._long.n:
            return self._long.result(left_out=self._short.n)
        return self._short.result(left_out=0)


# A figure's numbers are kept exactly for this many samples (9 hours at the monitor's
# 0.5 s; 15 figures of 8 bytes: 7.5 MiB), in chunks allocated whole (an array grown one
# number at a time is reallocated between the sampler's other allocations). Past it, a
# log-bucketed histogram (relative error RELATIVE_ERROR) holds them, in at most a few
# thousand buckets whatever the run's length: kept whole, a week's figures were 145 MB
# in the job's own memory limit, and they grew without end.
EXACT_SAMPLES = 65_536
CHUNK = 4096
RELATIVE_ERROR = 0.005


class _Series:
    """One figure's numbers: median, p95, max and n as `stats()` gives them; exact up to
    EXACT_SAMPLES numbers, then within RELATIVE_ERROR of the value (max and n exact)."""

    _GAMMA = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)
    _LOG_GAMMA = math.log(_GAMMA)

    def __init__(self) -> None:
        self.n = 0
        self.max = -math.inf
        self._chunks: list[array] = []
        self._buckets: dict[int, int] | None = None   # bucket -> count, once past exact
        self._zeros = 0

    def append(self, x: float) -> None:
        self.n += 1
        self.max = max(self.max, x)
        if self._buckets is not None:
            self._count(x)
            return
        at = (self.n - 1) % CHUNK
        if at == 0:   # a whole chunk at once: no reallocation while the sampler allocates
            self._chunks.append(array("d", bytes(8 * CHUNK)))
        self._chunks[-1][at] = x
        if self.n > EXACT_SAMPLES:
            self._buckets = {}
            for v in self._values():
                self._count(v)
            self._chunks = []

    def _values(self) -> list[float]:
        out = [v for c in self._chunks for v in c]
        del out[self.n:]          # the last chunk's unfilled end
        return out

    def _count(self, x: float) -> None:
        if x <= 0.0:   # the figures are rates, shares, bytes and counts: none below 0
            self._zeros += 1
            return
        assert self._buckets is not None
        i = math.ceil(math.log(x) / self._LOG_GAMMA)
        self._buckets[i] = self._buckets.get(i, 0) + 1

    def stats(self) -> dict[str, float]:
        if self._buckets is None:
            return stats(self._values())
        return {"median": self._quantile(0.5), "p95": self._quantile(0.95), "max": self.max,
                "n": self.n}

    def _quantile(self, q: float) -> float:
        rank = q * (self.n - 1)
        seen = self._zeros
        if rank < seen:
            return 0.0
        for i, count in sorted((self._buckets or {}).items()):
            seen += count
            if rank < seen:
                return min(self.max, 2 * self._GAMMA ** i / (self._GAMMA + 1))
        return self.max


class _Figures:
    def __init__(self) -> None:
        self.n = 0
        self.t0: float | None = None
        self.t1: float | None = None
        self.series: dict[str, _Series] = {}
        self.unavailable: dict[str, str] = {}

    def add(self, s: Any) -> None:
        self.n += 1
        self.t0 = s.monotonic - s.interval_s if self.t0 is None else self.t0
        self.t1 = s.monotonic
        d = s.to_dict()
        for section in ("disk", "cpu", "proc", "shm", "gpu"):
            rec = d.get(section)
            if rec is not None and not rec.get("available", False):
                self.unavailable[section] = rec.get("reason", "")
        for section, field in MAIN_FIGURES:
            rec = d.get(section)
            if rec and rec.get("available") and rec.get(field) is not None:
                self._put(f"{section}.{field}", rec[field])
        gpu = d.get("gpu")
        if gpu and gpu.get("available"):
            for dev in gpu["devices"]:
                for field in GPU_FIGURES:
                    if dev.get(field) is not None:
                        self._put(f"gpu{dev['index']}.{field}", dev[field])

    def _put(self, key: str, value: Any) -> None:
        if key not in self.series:
            self.series[key] = _Series()
        self.series[key].append(float(value))

    def result(self, left_out: int) -> dict[str, Any]:
        # A section measured at least once is not "unavailable" (e.g. a process that exited).
        measured = {k.split(".")[0].rstrip("0123456789") for k in self.series}
        n, t0, t1 = self.n, self.t0, self.t1
        return {
            "samples": n,
            "samples_left_out": left_out,
            "duration_s": (t1 - t0) if n and t0 is not None and t1 is not None else 0.0,
            "figures": {k: v.stats() for k, v in self.series.items()},
            "unavailable": {k: v for k, v in self.unavailable.items() if k not in measured},
        }
