"""The one pass over a training log's step records: weights, warm-up, epoch starts,
repeats and duplicates, into bounded accumulators (`analyze` reads the sums)."""

from __future__ import annotations

from typing import Any

from autotune.analyze.parsers import StepRecord
from autotune.analyze.reader import LineTimes
from autotune.analyze.stats import EpochStats, LogHistogram, Timeline, Totals

MIN_WARMUP = 5
MAX_EPOCHS_KEPT = 10_000
MAX_STARTS_LISTED = 100
ACROSS_KEPT = 256   # step indices open at once for the shortest rank's step


class LogPass:
    """Streams records into the accumulators; holds only bounded state."""

    def __init__(self, warmup: int | None, times: LineTimes | None,
                 other_kind: str | None = None) -> None:
        self.warmup_fixed = warmup
        self.times = times
        self.other_kind = other_kind
        self.measured = Totals()
        self.warm = Totals()
        self.warm_records: list[StepRecord] = []
        self.hist_step, self.hist_iter, self.hist_data = LogHistogram(), LogHistogram(), LogHistogram()
        self.timeline = Timeline()
        self.epochs: dict[int, EpochStats] = {}
        self.first_epoch: int | None = None
        self.seen = 0
        self.last_index: dict[tuple[int | None, int | None], tuple[int, int]] = {}
        # The last 64 (rank, epoch, index) seen with their figures, as an ordered set: a
        # repeat with other figures is another rank printing the same step; with the same
        # figures, the same line printed twice.
        self.recent: dict[tuple[int | None, int | None, int | None],
                          tuple[float | None, float | None]] = {}
        self._warmup_for: tuple[int, int] | None = None   # (id(meta), steps)
        self.repeats = 0
        self.duplicates = 0
        self.ranks: set[int] = set()
        self.batches: dict[int, int] = {}   # batch size -> records (bounded)
        self.times_used = False
        # Batches between two logged lines, per rank; a rank's first line waits for it.
        self.interval: dict[int | None, int] = {}
        self.pending: dict[int | None, list[tuple[StepRecord, dict[str, Any]]]] = {}
        # Epoch starts: the first line of each (rank, epoch) and the batches before the
        # warm-up count; `steady` is the measured steps without them.
        self.started: set[tuple[int | None, int | None]] = set()
        self.starts = Totals()
        self.starts_listed: list[dict[str, Any]] = []
        self.steady = Totals()
        # The lines' other reading (StepRecord.alt_*): summed like the main figures
        # ("sample"), or the last running average of each (rank, epoch) ("running").
        self.other = Totals()
        self.other_last: dict[tuple[int | None, int | None], tuple[float, float, int]] = {}
        # Under DDP a rank's step includes waiting in all_reduce for the slowest rank: at
        # each (epoch, index) the shortest of the ranks' steps is the step's own time.
        # Open indices: the shortest step so far and the ranks seen (bounded, oldest out).
        self.across: dict[tuple[int | None, int], tuple[float, frozenset[int]]] = {}
        self.hist_step_shortest = LogHistogram()

    def warmup_steps(self, meta: dict[str, Any]) -> int:
        if self.warmup_fixed is not None:
            return self.warmup_fixed
        cached = self._warmup_for
        if cached is not None and cached[0] == id(meta):
            return cached[1]
        w = self._warmup_of(meta)
        self._warmup_for = (id(meta), w)
        return w

    @staticmethod
    def _warmup_of(meta: dict[str, Any]) -> int:
        loader = meta.get("loader") or {}
        w, pf = loader.get("num_workers"), loader.get("prefetch_factor")
        if isinstance(w, int) and w > 0:
            return max(MIN_WARMUP, w * (pf if isinstance(pf, int) else 2))
        return MIN_WARMUP

    def add(self, r: StepRecord, line_end: int, meta: dict[str, Any]) -> bool:
        """Take one record; False when it is a line already counted (printed twice)."""
        if r.end_time is None and self.times is not None:
            r.end_time = self.times.time_of(line_end)
            self.times_used = self.times_used or r.end_time is not None
        if r.index is None:
            self._accept(r, meta)
            return True
        k = (r.rank, r.epoch)
        key3 = (r.rank, r.epoch, r.index)
        figures = (r.data_s, r.iter_s)
        prev = self.last_index.get(k)
        wait = False
        if key3 in self.recent:
            if self.recent[key3] == figures:
                self.duplicates += 1
                return False
            self.repeats += 1     # the same step again: another rank printing it
            if r.rank in self.pending:
                wait = True       # ... the log's first line: it waits with it
            else:
                r.weight = prev[1] if prev else 1
        else:
            if prev is not None:
                gap = r.index - prev[0]
                r.weight = gap if gap > 0 else 1
                if gap > 0 and (r.rank in self.interval or len(self.interval) < 4096):
                    self.interval[r.rank] = gap
            elif r.rank in self.interval:
                # An epoch's first line stands for the batches since the epoch began, but
                # for no more than one logging interval: an excerpt can begin mid-epoch.
                r.weight = max(1, min(r.index, self.interval[r.rank]))
            else:
                wait = True       # the log's first line: its weight needs the interval
            self.last_index[k] = (r.index, r.weight)
            self.recent[key3] = figures
            if len(self.recent) > 64:
                del self.recent[next(iter(self.recent))]
            if len(self.last_index) > 4096:
                self.last_index.clear()
        if wait:
            self.pending.setdefault(r.rank, []).append((r, meta))
            return True
        for held in self.pending.pop(r.rank, []):
            self._release(*held)
        self._accept(r, meta)
        return True

    def _release(self, r: StepRecord, meta: dict[str, Any]) -> None:
        iv = self.interval.get(r.rank)
        r.weight = max(1, min(r.index or 0, iv)) if iv else 1
        self._accept(r, meta)

    def _accept(self, r: StepRecord, meta: dict[str, Any]) -> None:
        if r.rank is not None:
            self.ranks.add(r.rank)
        if r.batch is not None and (r.batch in self.batches or len(self.batches) < 256):
            self.batches[r.batch] = self.batches.get(r.batch, 0) + 1
        if r.epoch is not None:
            if self.first_epoch is None:
                self.first_epoch = r.epoch
            ep = self.epochs.get(r.epoch)
            if ep is None and len(self.epochs) < MAX_EPOCHS_KEPT:
                ep = self.epochs[r.epoch] = EpochStats(r.epoch)
            if ep is not None:
                ep.add(r)
        self.seen += 1
        w = self.warmup_steps(meta)
        in_first = r.epoch is None or r.epoch == self.first_epoch
        is_warm = in_first and ((r.index is not None and r.index < w)
                                or (r.index is None and self.seen <= w))
        k = (r.rank, r.epoch)
        is_start = k not in self.started or (r.index is not None and r.index < w)
        if k not in self.started and len(self.started) < MAX_EPOCHS_KEPT:
            self.started.add(k)
        if is_start:
            # The run's warm-up (workers starting, the first batch) is left out of every
            # figure, these too: with kept workers later epochs start at no cost, and the
            # run's start counted here would show a stall at every epoch start.
            if not is_warm:
                self.starts.add(r)
            if len(self.starts_listed) < MAX_STARTS_LISTED:
                self.starts_listed.append({"epoch": r.epoch, "rank": r.rank, "line": r.lineno,
                                           "data_wait_s": r.data_s, "batches": r.weight,
                                           "warmup": is_warm})
        if r.alt_data_s is not None and r.alt_iter_s is not None:
            if self.other_kind == "running" and (k in self.other_last
                                                 or len(self.other_last) < MAX_EPOCHS_KEPT):
                self.other_last[k] = (r.alt_data_s, r.alt_iter_s, max(1, r.index or 0))
            elif self.other_kind == "sample" and not is_warm:
                self.other.add(StepRecord(data_s=r.alt_data_s, iter_s=r.alt_iter_s,
                                          weight=r.weight))
        if is_warm:
            self.warm.add(r)
            if len(self.warm_records) < 4096:
                self.warm_records.append(r)
            return
        self._measure(r)
        if not is_start:
            self.steady.add(r)

    def _measure(self, r: StepRecord) -> None:
        self.measured.add(r)
        self.timeline.add(r)
        if r.step_s is not None:
            self.hist_step.add(r.step_s)
            if r.rank is not None and r.index is not None:
                self._across(r.epoch, r.index, r.rank, r.step_s)
        if r.iter_s is not None:
            self.hist_iter.add(r.iter_s)
        if r.data_s is not None:
            self.hist_data.add(r.data_s)

    def _across(self, epoch: int | None, index: int, rank: int, step_s: float) -> None:
        k = (epoch, index)
        prev = self.across.pop(k, None)
        if prev is None:
            self.across[k] = (step_s, frozenset((rank,)))
            if len(self.across) > ACROSS_KEPT:
                self._close(self.across.pop(next(iter(self.across))))
        elif rank not in prev[1]:          # the same rank again: a restarted run's line
            self.across[k] = (min(prev[0], step_s), prev[1] | {rank})
        else:
            self.across[k] = prev

    def _close(self, entry: tuple[float, frozenset[int]]) -> None:
        if len(entry[1]) > 1:              # a step only one rank logged says nothing
            self.hist_step_shortest.add(entry[0])

    def finish(self) -> bool:
        """Take the lines still waiting for their weight, then use the warm-up steps when
        nothing else was measured; True when that happened."""
        for held in self.pending.values():
            for r, meta in held:
                self._release(r, meta)
        self.pending.clear()
        used_warm = False
        if self.measured.n == 0 and self.warm_records:
            for r in self.warm_records:
                self._measure(r)
            used_warm = True
        for entry in self.across.values():
            self._close(entry)
        self.across.clear()
        return used_warm

    def other_share(self) -> float | None:
        """The data share from the lines' other reading."""
        if self.other_kind == "running":
            data = sum(d * n for d, _, n in self.other_last.values())
            it = sum(i * n for _, i, n in self.other_last.values())
            return data / it if it > 0 else None
        return self.other.data_share
