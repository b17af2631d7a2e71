"""What every log parser yields, and the line handling they share.

A parser turns one text line into zero or more `StepRecord`s. Lines are never trusted to
be whole: two ranks writing one file can splice a line into another, a killed job
leaves its last line cut mid-way. So a parser names an *anchor* (where a record starts);
a line holding several anchors is split there and each piece is parsed on its own, and
a piece that starts like a record but does not finish like one is counted as truncated.
Nothing here raises on bad input: it is counted by reason (`Skip`).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, ClassVar

NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|inf"

# A logging-style timestamp at the start of a line: 2024-05-01 12:00:00,123 / ISO 'T'.
_TS = re.compile(r"^\W{0,2}(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,6}))?")


@dataclass(slots=True)
class StepRecord:
    """One training step (or one logged step standing for several).

    Times in seconds. `data_s`: blocked waiting for the batch (data wait); `iter_s`: wall
    time of the whole iteration (data + step); `step_s`: time in the step (iter - data
    when the log does not say). `end_time`: epoch seconds when the step ended, when known.
    `weight` is filled in by the analysis (batches a sampled log line stands for).
    `alt_data_s`/`alt_iter_s`: the other reading the same line prints (the running average
    in brackets, or detectron2's last iteration), compared with the share's (LogParser.other_kind).
    """

    data_s: float | None
    iter_s: float | None
    step_s: float | None = None
    epoch: int | None = None
    index: int | None = None
    total: int | None = None
    batch: int | None = None
    rate: float | None = None
    end_time: float | None = None
    rank: int | None = None
    lineno: int = 0
    weight: int = 1
    alt_data_s: float | None = None
    alt_iter_s: float | None = None

    def complete(self) -> StepRecord:
        """Fill step_s or iter_s from the other two (clamped: rounding can make d > i)."""
        if self.step_s is None and self.iter_s is not None and self.data_s is not None:
            self.step_s = max(0.0, self.iter_s - self.data_s)
        elif self.iter_s is None and self.step_s is not None and self.data_s is not None:
            self.iter_s = self.step_s + self.data_s
        if self.batch is None and self.rate is not None and self.iter_s:
            self.batch = max(1, round(self.rate * self.iter_s))
        return self


@dataclass
class ProfileSummary:
    """Totals without per-step timings: Lightning's SimpleProfiler table, or a run's closing
    summary (HuggingFace Trainer's train_runtime). `data_total_s` is None when the log has
    no data time at all; `data_calls` is then the number of steps the totals cover."""

    data_total_s: float | None
    data_calls: int
    step_total_s: float | None
    step_calls: int | None
    epoch_total_s: float | None = None
    lineno: int = 0
    source: str = ""
    samples_per_s: float | None = None
    # What these totals are, in one sentence: shown with the analysis.
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"data_total_s": self.data_total_s, "data_calls": self.data_calls,
                "step_total_s": self.step_total_s, "step_calls": self.step_calls,
                "epoch_total_s": self.epoch_total_s, "line": self.lineno,
                "source": self.source, "samples_per_s": self.samples_per_s}


class Skip(Exception):
    """A line (or piece) that is not a record; `reason` is what the counts are keyed by."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# Reasons used by the shared code (parsers add their own, e.g. "evaluation line").
OTHER = "other output"
TRUNCATED = "truncated or garbled record"
BAD_NUMBER = "impossible figure (negative or not finite)"


def line_timestamp(line: str) -> float | None:
    """Epoch seconds of a leading logging timestamp (local time), or None."""
    m = _TS.match(line)
    if not m:
        return None
    y, mo, d, h, mi, s, frac = m.groups()
    try:
        base = time.mktime((int(y), int(mo), int(d), int(h), int(mi), int(s), 0, 0, -1))
    except (OverflowError, ValueError):
        return None
    return base + (float(f"0.{frac}") if frac else 0.0)


def finite(*values: float | None) -> bool:
    """True when every given figure is a finite number >= 0."""
    for v in values:
        if v is not None and not (v == v and 0.0 <= v < float("inf")):
            return False
    return True


class LogParser:
    """Base of the line parsers. Subclasses set `name`, `anchor`, and `parse_piece`.

    `feed(line, lineno)` returns the records of one line or raises Skip; `finish()`
    returns what an aggregate parser only knows at the end (e.g. a profiler table).
    """

    name: ClassVar[str] = "?"
    description: ClassVar[str] = ""
    anchor: ClassVar[re.Pattern[str] | None] = None
    # Lines that look like records of a kind this analysis leaves out (evaluation).
    ignore: ClassVar[re.Pattern[str] | None] = None
    # What the share is computed from, in words (shown with the share).
    figures: ClassVar[str] = ""
    # The other reading of each line (StepRecord.alt_*), and how it adds up: "running" (a
    # running average since the epoch began: its last line per epoch covers every batch) or
    # "sample" (a per-line value, weighted like the main one).
    other_figures: ClassVar[str] = ""
    other_kind: ClassVar[str | None] = None
    # A caveat on what the figures mean, added to the verdict's evidence.
    caveat: ClassVar[str] = ""
    # Why a log of this format may hold no timing, and what to do (for the error message).
    no_timing_hint: ClassVar[str] = ""

    def __init__(self) -> None:
        self.meta: dict[str, Any] = {}
        self.notes: list[str] = []
        # Pieces of a spliced line that failed while another piece of it parsed.
        self.dropped: dict[str, int] = {}

    # -- detection ------------------------------------------------------------------------
    def sniff(self, line: str) -> bool:
        """Whether this line is (or holds) a record of this format."""
        try:
            return bool(self.feed(line, 0))
        except Skip:
            return False

    # -- parsing --------------------------------------------------------------------------
    def feed(self, line: str, lineno: int) -> list[StepRecord]:
        if self.anchor is None:
            rec = self.parse_piece(line, lineno)
            return [] if rec is None else [rec]
        starts = [m.start() for m in self.anchor.finditer(line)]
        if not starts:
            if self.ignore is not None and self.ignore.search(line):
                raise Skip("evaluation line")
            raise Skip(OTHER)
        ts = line_timestamp(line)
        out: list[StepRecord] = []
        first_reason: str | None = None
        understood = False   # a piece that is no step but fine (a header)
        for a, b in zip(starts, starts[1:] + [len(line)]):
            try:
                rec = self.parse_piece(line[a:b], lineno)
            except Skip as e:
                first_reason = first_reason or e.reason
                continue
            if rec is None:
                understood = True
                continue
            if rec.end_time is None and ts is not None and a == starts[0]:
                rec.end_time = ts
            out.append(rec)
        if not out and not understood:
            raise Skip(first_reason or TRUNCATED)
        if first_reason is not None:
            self.dropped[first_reason] = self.dropped.get(first_reason, 0) + 1
        return out

    def parse_piece(self, piece: str, lineno: int) -> StepRecord | None:
        raise NotImplementedError

    def finish(self) -> list[ProfileSummary]:
        return []
