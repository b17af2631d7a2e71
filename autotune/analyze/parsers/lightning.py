"""PyTorch Lightning's SimpleProfiler report (`Trainer(profiler="simple")`), in the shapes
people paste it.

    FIT Profiler Report
    ----------------------------------------------------------------------------------
    |  Action                                     \t|  Mean duration (s)\t|  Num calls \t|  Total time (s)\t|  Percentage %\t|
    ----------------------------------------------------------------------------------
    |  Total                                      \t|  -              \t|  5320      \t|  75.3           \t|  100 %         \t|
    |  [_TrainingEpochLoop].train_dataloader_next \t|  0.0521         \t|  1000      \t|  52.1           \t|  69.2          \t|
    |  run_training_batch                         \t|  0.0201         \t|  1000      \t|  20.1           \t|  26.7          \t|

Also: indented or quoted ("> |  ..."), tabs expanded to spaces, no pipes at all (cells split
on tabs or on runs of spaces), a Markdown table (`| a | b |` with a `|---|` row), and the
pre-1.5 layout (`action\t|  mean\t|  total`). Columns are read by the header when there is
one, else by how many numbers a row holds (mean, calls, total, percent / mean, total).

Only totals: the data wait is the `train_dataloader_next` row (`get_train_batch` before
Lightning 1.6), separate from the step, `run_training_batch`; so an iteration is the two
added. Without a `run_training_batch` row (a trimmed paste) the step is `optimizer_step`
(forward, backward and update in its closure), else `run_training_epoch` minus the data
wait; the analysis says which. The last report in the log wins (a log can hold FIT then
TEST reports; only FIT has training rows).
"""

from __future__ import annotations

import re

from autotune.analyze.parsers._base import OTHER, TRUNCATED, LogParser, ProfileSummary, Skip

_DATA_ACTIONS = ("train_dataloader_next", "get_train_batch")
_STEP_ACTIONS = ("run_training_batch",)
_OPT_ACTIONS = ("optimizer_step",)
_EPOCH_ACTIONS = ("run_training_epoch",)
_ACTIONS = _DATA_ACTIONS + _STEP_ACTIONS + _OPT_ACTIONS + _EPOCH_ACTIONS
_RULE = re.compile(r"^:?-{3,}:?$")          # a Markdown |---| cell, or a ----- line
_COLUMNS = {"mean": "mean", "calls": "calls", "total": "total", "percent": "pct"}

_Row = tuple[float, int, float, int]        # mean, calls, total, line


def _float(s: str) -> float | None:
    try:
        v = float(s.replace("%", "").strip())
    except ValueError:
        return None
    return v if v == v and v >= 0 else None


def _pick(rows: dict[str, _Row], names: tuple[str, ...]) -> tuple[str, _Row] | None:
    """The first row whose action holds one of `names`, with its action."""
    for k, v in rows.items():
        if any(n in k for n in names):
            return k, v
    return None


def _cells(line: str) -> tuple[list[str], bool]:
    """A row's cells, and whether it looks like a table row at all (pipes or tabs)."""
    s = line.strip().lstrip(">").strip().replace("`", "").replace("**", "")
    if "|" in s:
        return [c.strip() for c in s.strip("|").split("|")], True
    if "\t" in s:
        return [c.strip() for c in s.split("\t") if c.strip()], True
    return [c for c in re.split(r"\s{2,}", s) if c], False


class LightningParser(LogParser):
    name = "lightning"
    description = "PyTorch Lightning SimpleProfiler report (train_dataloader_next row)"
    figures = "the profiler's totals: train_dataloader_next against run_training_batch"

    def __init__(self) -> None:
        super().__init__()
        self._cols: dict[str, int] | None = None     # column -> index, from the header
        self._rows: dict[str, _Row] = {}
        self._tables: list[dict[str, _Row]] = []

    def sniff(self, line: str) -> bool:
        if not any(a in line for a in _DATA_ACTIONS):
            return False
        cells, _ = _cells(line)
        return sum(_float(c) is not None for c in cells[1:]) >= 2

    def feed(self, line: str, lineno: int) -> list:
        if "Profiler Report" in line:
            self._close_table()
            return []
        cells, tabular = _cells(line)
        if not any(cells):
            raise Skip(OTHER)
        if all(_RULE.match(c) for c in cells if c):
            return []         # a ----- rule, or a Markdown |---|---| row
        if cells[0] == "Action":
            if self._rows:
                self._close_table()   # a new header without a "Profiler Report" line
            self._cols = {}
            for i, c in enumerate(cells):
                for word, col in _COLUMNS.items():
                    if word in c.lower():
                        self._cols[col] = i
            return []
        action = cells[0]
        if not any(a in action for a in _ACTIONS):
            if tabular:
                return []     # a profiler row of no interest here: part of the table
            raise Skip(OTHER)
        row = self._row(cells)
        if row is None:
            raise Skip(TRUNCATED if tabular or action.startswith(("[", "run_", "get_"))
                       else OTHER)
        self._rows[action] = (*row, lineno)
        return []

    def _row(self, cells: list[str]) -> tuple[float, int, float] | None:
        """(mean, calls, total) of a row, by the header's columns or by the count of numbers."""
        cols = self._cols or {}
        if "mean" in cols and "total" in cols and max(cols.values()) < len(cells):
            mean, total = _float(cells[cols["mean"]]), _float(cells[cols["total"]])
            calls = _float(cells[cols["calls"]]) if "calls" in cols else None
        else:
            nums = [_float(c) for c in cells[1:] if c]
            if len(nums) < 2 or None in nums[:2]:
                return None
            if len(nums) >= 4:
                mean, calls, total = nums[0], nums[1], nums[2]
            elif len(nums) == 3 and nums[1] is not None and nums[1] == int(nums[1]) and \
                    nums[0] and nums[2] and abs(nums[0] * nums[1] - nums[2]) <= 0.05 * nums[2]:
                mean, calls, total = nums[0], nums[1], nums[2]     # mean, calls, total
            else:
                mean, calls, total = nums[0], None, nums[1]        # mean, total (, percent)
        if mean is None or total is None:
            return None
        n = int(calls) if calls is not None else (round(total / mean) if mean > 0 else 0)
        return mean, n, total

    def _close_table(self) -> None:
        if self._rows:
            self._tables.append(self._rows)
        self._rows = {}
        self._cols = None

    def finish(self) -> list[ProfileSummary]:
        self._close_table()
        for rows in reversed(self._tables):
            data = _pick(rows, _DATA_ACTIONS)
            if data is None:
                continue
            source, (_, calls, data_total, line) = data
            step, opt, epoch = (_pick(rows, names) for names in
                                (_STEP_ACTIONS, _OPT_ACTIONS, _EPOCH_ACTIONS))
            note = ("Lightning's profiler gives totals only: no p95, no trend, no times to "
                    "join metrics by; ")
            step_total: float | None = None
            step_calls: int | None = None
            if step is not None:
                step_total, step_calls = step[1][2], step[1][1]
                note += "the step time is the mean of run_training_batch"
            elif opt is not None:
                step_total, step_calls = opt[1][2], opt[1][1]
                note += ("the table has no run_training_batch row, so the step is the "
                         f"{opt[0]} row (forward, backward and update)")
            elif epoch is not None and epoch[1][2] > data_total:
                step_total, step_calls = epoch[1][2] - data_total, calls
                note += ("the table has no run_training_batch row, so the step is "
                         "run_training_epoch minus the data wait (callbacks and validation "
                         "inside the epoch included)")
            else:
                note += "the table has no row for the step: no share"
            return [ProfileSummary(
                data_total_s=data_total, data_calls=calls, step_total_s=step_total,
                step_calls=step_calls, epoch_total_s=epoch[1][2] if epoch else None,
                lineno=line, source=source, note=note)]
        return []
