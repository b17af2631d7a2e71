"""The loop's own figures: the user's step and the wait inside next(), per window of batches.

The loader times each next() call (the wait) and the time from its return to the next call
(the user's step) with two clock reads; nothing runs in a thread. A window is full at 10
batches and twice the prefetch queue (workers x prefetch), so that a queue filled while the
step ran does not flatter it; at low batch rates (a few batches a second or fewer, as
behind an IOPS cap) it closes sooner, once it spans WINDOW_S seconds and MIN_BATCHES
batches (and three rounds of the workers) and its wait share's noise, from the spread
of the batches' waits, is under NOISE_TARGET: long enough in time for the figure, not in a
fixed count of batches. The spread is taken over rounds of as many batches as there are
workers: W workers sharing a slow disk deliver their batches in bursts (one long wait,
then W - 1 short ones), a pattern of the configuration, not noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MIN_WINDOW = 10
MIN_BATCHES = 5         # a window closed early on time still has this many batches
WINDOW_S = 5.0          # ... and spans this many seconds
NOISE_TARGET = 0.02     # ... and its wait share's standard error is at most this
MIN_ROUNDS = 3          # ... and it holds this many rounds of the workers


def window_batches(num_workers: int, prefetch_factor: int | None) -> int:
    """Batches in one measured window for a configuration."""
    return max(MIN_WINDOW, 2 * num_workers * (prefetch_factor or 0))


def window_of(cfg: Any) -> int:
    """Batches in one measured window of `cfg` (a Config)."""
    return window_batches(cfg.num_workers, cfg.prefetch_factor)


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

    def __init__(self, size: int, skip: int = 0, early: bool = True, group: int = 1) -> None:
        # early=False: only `size` closes a window (DDP: the ranks close theirs together).
        # group: batches per round of the workers (num_workers; 1 without workers).
        self.size, self.skip, self.early, self.group = size, skip, early, max(1, group)
        self._skipped = 0
        self.steps: list[float] = []
        self.waits: list[float] = []
        self.counted = 0   # batches measured since the meter was made, across resets

    def reset(self, size: int | None = None, skip: int = 0, group: int | None = None) -> None:
        """Start a new window; up to the first `skip` batches are not counted (a new pool's
        queue, empty at its start or filled while the old pool drained, is no steady
        state). Skipping ends early at a batch (after the first) that waited longer than
        the step before it: no filled queue served it, so what follows is no queue's
        flattery (behind a slow disk the queue never fills, and skipping a whole queue
        of batches would take most of a minute)."""
        if size is not None:
            self.size = size
        if group is not None:
            self.group = max(1, group)
        self.skip, self._skipped = skip, 0
        self.steps.clear()
        self.waits.clear()

    def add(self, step_s: float, wait_s: float) -> WindowStats | None:
        """Record one batch; the window's figures when this batch completed it."""
        if self.skip > 0:
            if not (self._skipped and wait_s > step_s):
                self.skip -= 1
                self._skipped += 1
                return None
            self.skip = 0
        self.counted += 1
        self.steps.append(step_s)
        self.waits.append(wait_s)
        if not self._full():
            return None
        stats = summarize(self.steps, self.waits, self.group)
        self.reset()
        return stats

    def _full(self) -> bool:
        n = len(self.steps)
        if n >= self.size:
            return True
        if not self.early or n < max(MIN_BATCHES, MIN_ROUNDS * self.group) \
                or sum(self.steps) + sum(self.waits) < WINDOW_S:
            return False
        return wait_noise(self.steps, self.waits, self.group) <= NOISE_TARGET


    def peek(self) -> WindowStats | None:
        """The figures of the batches so far, the window left open (None before any)."""
        return summarize(self.steps, self.waits, self.group) if self.steps else None


def wait_noise(steps: list[float], waits: list[float], group: int = 1) -> float:
    """The standard error of a window's wait share sum(wait) / sum(wait + step), from the
    spread of the waits of its rounds of `group` consecutive batches (the last round takes
    the remainder): the ratio estimator's, each round's wait less the share of its wall
    time. Derived from the batches themselves, so a short window of steady rounds is
    precise and a long one of erratic rounds is not."""
    g = max(1, group)
    k = len(steps) // g
    if k < 2:
        return 0.0
    rw = [sum(waits[i * g:(i + 1) * g if i < k - 1 else None]) for i in range(k)]
    rt = [w + sum(steps[i * g:(i + 1) * g if i < k - 1 else None]) for i, w in enumerate(rw)]
    total = sum(rt)
    if total <= 0:
        return 0.0
    share = sum(rw) / total
    resid = sum((w - share * t) ** 2 for w, t in zip(rw, rt))
    return math.sqrt(resid / (k * (k - 1))) / (total / k)


def summarize(steps: list[float], waits: list[float], group: int = 1) -> WindowStats:
    """A window's totals and the noise of its wait share (rounds of `group` batches)."""
    return WindowStats(len(steps), sum(waits), sum(steps), wait_noise(steps, waits, group))


def noise_margin(old: WindowStats, new: WindowStats, floor: float = 0.02) -> float:
    """The noise of two windows' wait shares: two standard errors, at least `floor`."""
    return max(floor, 2.0 * math.sqrt(old.noise ** 2 + new.noise ** 2))


def beyond_noise(old: WindowStats, new: WindowStats, floor: float = 0.02) -> bool:
    """The wait share fell by more than the noise of the two windows (noise_margin)."""
    return old.wait_share - new.wait_share > noise_margin(old, new, floor)
