"""Figures from the per-batch timings of the measured window (DESIGN.md definitions).

Each measured batch is (wait_s, step_s, samples, end): `wait_s` is the time blocked in
next(loader_iter), `step_s` the time in the step, `end` time.monotonic() when its step
returned. The window starts at `start` (the end of the last warm-up step), so its wall
time covers everything, including time that is neither wait nor step (loop overhead).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

from autotune.monitor.summary import percentile

INPUT_BOUND_AU = 0.90       # MLPerf Storage: a job is input-bound below 90 % AU
UNSTEADY_SPREAD = 0.25      # (max - min) / median of the windows' images/s


@dataclass(frozen=True)
class Batch:
    wait_s: float
    step_s: float
    samples: int
    end: float


@dataclass(frozen=True)
class WindowFigures:
    images_per_s: float                 # all samples / the whole window (DESIGN.md)
    images_per_s_median: float          # median over the sub-windows: stability, not the figure
    window_rates: list[float]
    data_wait_fraction: float
    step_fraction: float                # AU when there is a step
    wall_s: float
    batches: int
    samples: int
    wait_ms_p50: float
    wait_ms_p95: float
    wait_ms_max: float
    step_ms_p50: float
    step_ms_p95: float

    @property
    def images_per_s_overall(self) -> float:
        """The whole window's figure (kept under its older name)."""
        return self.images_per_s

    @property
    def spread(self) -> float:
        """(max - min) / median of the windows' images/s (0 with one window)."""
        r, m = self.window_rates, self.images_per_s_median
        return (max(r) - min(r)) / m if len(r) > 1 and m else 0.0


def split_windows(n: int, k: int) -> list[tuple[int, int]]:
    """[lo, hi) batch ranges of `k` contiguous, nearly equal windows over `n` batches,
    with at least two batches per window (fewer windows when there are few batches)."""
    k = max(1, min(k, n // 2))
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(k)]


def window_figures(batches: Sequence[Batch], start: float, windows: int = 5) -> WindowFigures:
    """images/s (samples over the whole window; the median of `windows` sub-windows is a
    stability figure beside it: a disk that serves in bursts flatters a median), data-wait
    and step fractions, wait and step percentiles. Raises ValueError without batches."""
    if not batches:
        raise ValueError("no measured batches")
    rates = []
    prev_end = start
    for lo, hi in split_windows(len(batches), windows):
        end = batches[hi - 1].end
        n = sum(b.samples for b in batches[lo:hi])
        rates.append(n / (end - prev_end) if end > prev_end else float("inf"))
        prev_end = end
    wall = batches[-1].end - start
    samples = sum(b.samples for b in batches)
    waits = [b.wait_s * 1000 for b in batches]
    steps = [b.step_s * 1000 for b in batches]
    return WindowFigures(
        images_per_s=samples / wall if wall > 0 else float("inf"),
        images_per_s_median=statistics.median(rates),
        window_rates=rates,
        data_wait_fraction=sum(b.wait_s for b in batches) / wall if wall > 0 else 0.0,
        step_fraction=sum(b.step_s for b in batches) / wall if wall > 0 else 0.0,
        wall_s=wall, batches=len(batches), samples=samples,
        wait_ms_p50=percentile(waits, 50), wait_ms_p95=percentile(waits, 95),
        wait_ms_max=max(waits),
        step_ms_p50=percentile(steps, 50), step_ms_p95=percentile(steps, 95),
    )
