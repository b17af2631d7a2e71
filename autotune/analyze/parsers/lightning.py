"""PyTorch Lightning's SimpleProfiler report (`Trainer(profiler="simple")`).

    FIT Profiler Report
    ----------------------------------------------------------------------------------
    |  Action                                     \t|  Mean duration (s)\t|  Num calls \t|  Total time (s)\t|  Percentage %\t|
    ----------------------------------------------------------------------------------
    |  Total                                      \t|  -              \t|  5320      \t|  75.3           \t|  100 %         \t|
    |  [_TrainingEpochLoop].train_dataloader_next \t|  0.0521         \t|  1000      \t|  52.1           \t|  69.2          \t|
    |  run_training_batch                         \t|  0.0201         \t|  1000      \t|  20.1           \t|  26.7          \t|

Only totals: data wait = the `train_dataloader_next` row (`get_train_batch` before
Lightning 1.6), the step = `run_training_batch`. Without `extended` the table has no
"Num calls" column; the mean and total still give the count. The last report in the log
wins (a log can hold FIT then TEST reports; only FIT has training rows).
"""

from __future__ import annotations


from autotune.analyze.parsers._base import OTHER, TRUNCATED, LogParser, ProfileSummary, Skip

_DATA_ACTIONS = ("train_dataloader_next", "get_train_batch")
_STEP_ACTIONS = ("run_training_batch",)
_EPOCH_ACTIONS = ("run_training_epoch",)


def _float(s: str) -> float | None:
    try:
        v = float(s)
    except ValueError:
        return None
    return v if v == v and v >= 0 else None


class LightningParser(LogParser):
    name = "lightning"
    description = "PyTorch Lightning SimpleProfiler report (train_dataloader_next row)"

    def __init__(self) -> None:
        super().__init__()
        self._extended: bool | None = None
        self._rows: dict[str, tuple[float, int | None, float, int]] = {}
        self._tables: list[dict[str, tuple[float, int | None, float, int]]] = []

    def sniff(self, line: str) -> bool:
        return "|" in line and any(a in line for a in _DATA_ACTIONS)

    def feed(self, line: str, lineno: int) -> list:
        s = line.strip()
        if "Profiler Report" in s:
            self._close_table()
            return []
        if not s.startswith("|"):
            raise Skip(OTHER)
        cells = [c.strip() for c in s.strip("|").split("|")]
        if cells and cells[0] == "Action":
            self._extended = any("Num calls" in c for c in cells)
            return []
        if len(cells) < 3:
            raise Skip(TRUNCATED)
        action = cells[0]
        if not any(a in action for a in _DATA_ACTIONS + _STEP_ACTIONS + _EPOCH_ACTIONS):
            return []   # a profiler row of no interest here: part of the table, not an error
        extended = self._extended if self._extended is not None else len(cells) >= 5
        mean = _float(cells[1])
        if extended:
            if len(cells) < 4:
                raise Skip(TRUNCATED)
            calls_f, total = _float(cells[2]), _float(cells[3])
            calls = int(calls_f) if calls_f is not None else None
        else:
            total, calls = _float(cells[2]), None
        if mean is None or total is None:
            raise Skip(TRUNCATED)
        if calls is None:
            calls = round(total / mean) if mean > 0 else 0
        self._rows[action] = (mean, calls, total, lineno)
        return []

    def _close_table(self) -> None:
        if self._rows:
            self._tables.append(self._rows)
        self._rows = {}
        self._extended = None

    def finish(self) -> list[ProfileSummary]:
        self._close_table()
        for rows in reversed(self._tables):
            def pick(names: tuple[str, ...]) -> tuple[float, int | None, float, int] | None:
                for k, v in rows.items():
                    if any(n in k for n in names):
                        return v
                return None
            data, step, epoch = pick(_DATA_ACTIONS), pick(_STEP_ACTIONS), pick(_EPOCH_ACTIONS)
            if data is None:
                continue
            return [ProfileSummary(
                data_total_s=data[2], data_calls=data[1] or 0,
                step_total_s=step[2] if step else None, step_calls=step[1] if step else None,
                epoch_total_s=epoch[2] if epoch else None, lineno=data[3],
                source=next(k for k in rows if any(n in k for n in _DATA_ACTIONS)))]
        return []
