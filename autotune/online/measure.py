"""The loop's own figures: the user's step and the wait inside next(), per window of batches.

The loader times each next() call (the wait) and the time from its return to the next call
(the user's step) with two clock reads; nothing runs in a thread. A window is at least 10
batches and twice the prefetch queue (workers x prefetch), so that a queue filled while the
step ran does not flatter it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIN_WINDOW = 10
_CHUNKS = 5  # sub-windows for the noise estimate


def window_batches(num_workers: int, prefetch_factor: int | None) -> int:
    """Batches in one measured window for a configuration."""
    return max(MIN_WINDOW, 2 * num_workers * (prefetch_factor or 0))


@dataclass(frozen=True)
class WindowStats:
    """One window's figures (DESIGN.md definitions: data-wait fraction, AU)."""

    batches: int
    wait_s: float
    step_s: float
    noise: float  # standard error of the wait share, from the sub-windows' spread

    @property
    def wall_s(self) -> float:
        return self.wait_s + self.step_s

    @property
    def wait_share(self) -> float:
        return self.wait_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def au(self) -> float:
        """Accelerator utilization: time in the step / wall time."""
        return 1.0 - self.wait_share

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.wall_s if self.wall_s > 0 else 0.0


class Meter:
    """Collects (step, wait) pairs until a window is full."""

    def __init__(self, size: int, skip: int = 0) -> None:
        self.size, self.skip = size, skip
        self.steps: list[float] = []
        self.waits: list[float] = []

    def reset(self, size: int | None = None, skip: int = 0) -> None:
        """Start a new window; the first `skip` batches are not counted (a new pool's queue,
        empty at its start or filled while the old pool drained, is no steady state)."""
        if size is not None:
            self.size = size
        self.skip = skip
        self.steps.clear()
        self.waits.clear()

    def add(self, step_s: float, wait_s: float) -> WindowStats | None:
        """Record one batch; the window's figures when this batch completed it."""
        if self.skip > 0:
            self.skip -= 1
            return None
        self.steps.append(step_s)
        self.waits.append(wait_s)
        if len(self.steps) < self.size:
            return None
        stats = summarize(self.steps, self.waits)
        self.reset()
        return stats


    def peek(self) -> WindowStats | None:
        """The figures of the batches so far, the window left open (None before any)."""
        return summarize(self.steps, self.waits) if self.steps else None


def summarize(steps: list[float], waits: list[float]) -> WindowStats:
    """A window's totals and the noise of its wait share."""
    n = len(steps)
    k = min(_CHUNKS, n)
    shares = []
    for i in range(k):
        lo, hi = i * n // k, (i + 1) * n // k
        w, s = sum(waits[lo:hi]), sum(steps[lo:hi])
        shares.append(w / (w + s) if w + s > 0 else 0.0)
    mean = sum(shares) / k
    sd = math.sqrt(sum((x - mean) ** 2 for x in shares) / (k - 1)) if k > 1 else 0.0
    return WindowStats(n, sum(waits), sum(steps), sd / math.sqrt(k))


def beyond_noise(old: WindowStats, new: WindowStats, floor: float = 0.02) -> bool:
    """The wait share fell by more than the noise of the two windows (two standard errors,
    at least `floor`)."""
    margin = max(floor, 2.0 * math.sqrt(old.noise ** 2 + new.noise ** 2))
    return old.wait_share - new.wait_share > margin
