"""Streaming accumulators: figures of a log of any length in constant memory.

- `LogHistogram`: quantiles to 1 % relative precision from log-spaced bins.
- `Totals`: weighted sums (data wait, iteration, step, images) and the time span.
- `Timeline`: the run in at most `max_buckets` consecutive buckets (merged pairwise as
  the run grows), for trends over the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from autotune.analyze.parsers._base import StepRecord

_LOG_STEP = math.log(1.01)
_FLOOR = 1e-6   # values below 1 us land in the zero bin
_INV_STEP = 1.0 / _LOG_STEP
_LOG_FLOOR = math.log(_FLOOR)


class LogHistogram:
    """Counts in bins 1 % wide (log scale) from 1 us up; quantiles within 1 %."""

    def __init__(self) -> None:
        self.bins: dict[int, int] = {}
        self.zero = 0
        self.n = 0
        self.max = 0.0

    def add(self, x: float) -> None:
        self.n += 1
        if x > self.max:
            self.max = x
        if x < _FLOOR:
            self.zero += 1
            return
        k = int((math.log(x) - _LOG_FLOOR) * _INV_STEP)
        bins = self.bins
        bins[k] = bins.get(k, 0) + 1

    def quantile(self, q: float) -> float | None:
        """Value at quantile q in [0, 1] (the bin's geometric middle); None when empty."""
        if self.n == 0:
            return None
        rank = q * (self.n - 1)
        seen = self.zero
        if rank < seen:
            return 0.0
        for k in sorted(self.bins):
            seen += self.bins[k]
            if rank < seen:
                return min(self.max, _FLOOR * math.exp((k + 0.5) * _LOG_STEP))
        return self.max

    def to_dict(self) -> dict[str, float | None]:
        return {"p50": self.quantile(0.5), "p95": self.quantile(0.95),
                "p99": self.quantile(0.99), "max": self.max if self.n else None}


@dataclass(slots=True)
class Totals:
    """Weighted sums over step records; `w` counts batches, `n` records."""

    n: int = 0
    w: int = 0
    data: float = 0.0
    iter: float = 0.0
    step: float = 0.0
    timed_w: int = 0            # weight of records with both data and iter times
    images: float = 0.0
    images_iter: float = 0.0    # iteration time of the records whose batch size is known
    t_first: float | None = None
    t_last: float | None = None

    def add(self, r: StepRecord) -> None:
        self.n += 1
        self.w += r.weight
        if r.data_s is not None and r.iter_s is not None:
            self.timed_w += r.weight
            self.data += r.data_s * r.weight
            self.iter += r.iter_s * r.weight
            self.step += (r.step_s or 0.0) * r.weight
            if r.batch is not None:
                self.images += r.batch * r.weight
                self.images_iter += r.iter_s * r.weight
        if r.end_time is not None:
            start = r.end_time - (r.iter_s or 0.0)
            if self.t_first is None or start < self.t_first:
                self.t_first = start
            if self.t_last is None or r.end_time > self.t_last:
                self.t_last = r.end_time

    def merge(self, o: Totals) -> None:
        self.n += o.n
        self.w += o.w
        self.data += o.data
        self.iter += o.iter
        self.step += o.step
        self.timed_w += o.timed_w
        self.images += o.images
        self.images_iter += o.images_iter
        for t in (o.t_first, o.t_last):
            if t is None:
                continue
            self.t_first = t if self.t_first is None else min(self.t_first, t)
            self.t_last = t if self.t_last is None else max(self.t_last, t)

    @property
    def data_share(self) -> float | None:
        return self.data / self.iter if self.iter > 0 else None

    @property
    def au(self) -> float | None:
        return self.step / self.iter if self.iter > 0 else None

    @property
    def images_per_s(self) -> float | None:
        return self.images / self.images_iter if self.images_iter > 0 else None


@dataclass
class EpochStats:
    """One epoch: its first batch apart (the epoch-start wait), the rest summed."""

    epoch: int
    first: StepRecord | None = None
    rest: Totals = field(default_factory=Totals)

    def add(self, r: StepRecord) -> None:
        if self.first is None:
            self.first = r
        else:
            self.rest.add(r)

    @property
    def first_data_s(self) -> float | None:
        return self.first.data_s if self.first is not None else None

    @property
    def totals(self) -> Totals:
        t = Totals()
        if self.first is not None:
            t.add(self.first)
        t.merge(self.rest)
        return t

    def to_dict(self) -> dict[str, Any]:
        t = self.totals
        return {"epoch": self.epoch, "steps": t.n, "batches": t.w,
                "data_time_share": t.data_share, "first_batch_wait_s": self.first_data_s,
                "mean_wait_s_after_first": (self.rest.data / self.rest.timed_w
                                            if self.rest.timed_w else None)}


class Timeline:
    """Consecutive buckets of the measured steps, at most `max_buckets` of them."""

    def __init__(self, max_buckets: int = 256) -> None:
        self.max_buckets = max_buckets
        self.per_bucket = 1
        self.buckets: list[Totals] = []

    def add(self, r: StepRecord) -> None:
        if not self.buckets or self.buckets[-1].n >= self.per_bucket:
            if len(self.buckets) >= self.max_buckets:
                merged = []
                for i in range(0, len(self.buckets), 2):
                    b = self.buckets[i]
                    if i + 1 < len(self.buckets):
                        b.merge(self.buckets[i + 1])
                    merged.append(b)
                self.buckets = merged
                self.per_bucket *= 2
            if not self.buckets or self.buckets[-1].n >= self.per_bucket:
                self.buckets.append(Totals())
        self.buckets[-1].add(r)

    def segments(self, k: int) -> list[Totals]:
        """The run cut into (up to) k consecutive parts of about equal step counts."""
        if not self.buckets:
            return []
        k = min(k, len(self.buckets))
        out = []
        for i in range(k):
            part = Totals()
            for b in self.buckets[i * len(self.buckets) // k:(i + 1) * len(self.buckets) // k]:
                part.merge(b)
            out.append(part)
        return out
