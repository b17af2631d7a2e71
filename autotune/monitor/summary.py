"""median / p95 / max of the main figures over a list of samples."""

from __future__ import annotations

import math
from typing import Any, Iterable

# (section, field) pairs summarised when present; GPU fields are added per device.
MAIN_FIGURES: tuple[tuple[str, str], ...] = (
    ("disk", "reads_per_s"), ("disk", "read_mib_s"), ("disk", "r_await_ms"),
    ("disk", "rareq_sz_kib"), ("disk", "aqu_sz"), ("disk", "util_pct"),
    ("disk", "writes_per_s"), ("disk", "write_mib_s"),
    ("cpu", "total_pct"), ("cpu", "iowait_pct"), ("cpu", "busiest_core_pct"),
    ("proc", "cpu_pct"), ("proc", "rss_bytes"), ("proc", "processes"),
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
    all_samples = list(samples)
    kept = [s for s in all_samples if s.interval_s >= min_interval_s] or all_samples
    series: dict[str, list[float]] = {}
    unavailable: dict[str, str] = {}
    n = 0
    t0 = t1 = None
    for s in kept:
        n += 1
        t0 = s.monotonic - s.interval_s if t0 is None else t0
        t1 = s.monotonic
        d = s.to_dict()
        for section in ("disk", "cpu", "proc", "shm", "gpu"):
            rec = d.get(section)
            if rec is None:
                continue
            if not rec.get("available", False):
                unavailable[section] = rec.get("reason", "")
        for section, field in MAIN_FIGURES:
            rec = d.get(section)
            if rec and rec.get("available") and rec.get(field) is not None:
                series.setdefault(f"{section}.{field}", []).append(float(rec[field]))
        gpu = d.get("gpu")
        if gpu and gpu.get("available"):
            for dev in gpu["devices"]:
                for field in GPU_FIGURES:
                    if dev.get(field) is not None:
                        key = f"gpu{dev['index']}.{field}"
                        series.setdefault(key, []).append(float(dev[field]))
    # A section measured at least once is not "unavailable" (e.g. a process that exited).
    measured = {k.split(".")[0].rstrip("0123456789") for k in series}
    return {
        "samples": n,
        "samples_left_out": len(all_samples) - n,
        "duration_s": (t1 - t0) if n and t0 is not None and t1 is not None else 0.0,
        "figures": {k: stats(v) for k, v in series.items()},
        "unavailable": {k: v for k, v in unavailable.items() if k not in measured},
    }
