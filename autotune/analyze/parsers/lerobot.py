"""LeRobot `train.py` lines (MetricsTracker, or log_train_info in 2024 versions).

    INFO 2025-01-20 12:34:56 ts/train.py:232 step:200 smpl:6K ep:10 epch:0.05 loss:0.512 grdn:12.345 lr:1.0e-05 updt_s:0.123 data_s:0.646

Here the wait for the batch is **not** inside the update: `data_s` is the time to fetch
the batch, `updt_s` the policy update after it, so one step takes updt_s + data_s. Both
are the mean over the log interval (MetricsTracker resets them after each line; the 2024
logger printed the last step's). `step` counts steps done, rounded above 999 ("12K",
format_big_number): the interval between lines is learnt from two exact steps; without
them (an excerpt from late in a run) each line counts the same. Evaluation lines carry
`eval_s:` instead of `updt_s:`: left out.
"""

from __future__ import annotations

import re

from autotune.analyze.parsers._base import TRUNCATED, LogParser, Skip, StepRecord
from autotune.analyze.parsers._fields import fields, timed

_SUFFIX = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12, "Q": 10**15}
_STEP = re.compile(r"(?<![\w])step:(?P<num>\d+(?:\.\d+)?)(?P<suffix>[KMBTQ]?)\s")


class LerobotParser(LogParser):
    name = "lerobot"
    description = "LeRobot train.py (step:N smpl:.. ep:.. ... updt_s:U data_s:D)"
    anchor = _STEP
    figures = ("updt_s + data_s: the mean over each log interval (the fetch of the batch is "
               "not inside the update)")

    def __init__(self) -> None:
        super().__init__()
        self._last: int | None = None       # index of the previous line
        self._interval: int | None = None   # steps between lines, once two were exact

    def _index(self, num: str, suffix: str) -> int:
        if not suffix:
            step = int(float(num))
            if self._last is not None and step > self._last:
                self._interval = step - self._last
        elif self._last is not None and self._interval is not None:
            step = self._last + self._interval
        else:
            # Rounded and no interval known: count lines (equal weights), from the rounded
            # value so that an excerpt is not taken for the run's first steps (warm-up).
            step = (self._last + 1) if self._last is not None else int(float(num) * _SUFFIX[suffix])
        self._last = step
        return step

    def parse_piece(self, piece: str, lineno: int) -> StepRecord | None:
        m = _STEP.match(piece)
        f = fields(piece)
        if m is None:
            raise Skip(TRUNCATED)
        if "eval_s" in f and "updt_s" not in f:
            raise Skip("evaluation line")
        if "updt_s" not in f or "data_s" not in f:
            raise Skip(TRUNCATED)
        return timed(data=f["data_s"], step=f["updt_s"], index=self._index(m["num"], m["suffix"]),
                     lineno=lineno)
