"""detectron2 `CommonMetricPrinter` (also Mask2Former, ViTDet, DiffusionDet ... trainers).

    [11/20 09:23:44 d2.utils.events]:  eta: 0:10:00  iter: 19  total_loss: 1.234  loss_cls: 0.5  time: 0.3411  data_time: 0.0123  lr: 0.00019981  max_mem: 2631M
    ...  time: 0.3411  last_time: 0.3350  data_time: 0.0123  last_data_time: 0.0110  lr: ...   (newer)

`time` is the whole iteration (IterationTimer: from before the step to after it, and
run_step fetches the batch) averaged over **every iteration since the start** of training
(global_avg); `data_time` is the wait for the batch averaged over **the last 20 iterations**
only. So the share compares a 20-iteration window with the run's mean: on a steady run
they agree; a slow start weighs on `time` long after. Newer versions also print the last
iteration's `last_time`/`last_data_time`: a second reading, compared with the first. `iter`
is 0-based and printed every 20 iterations. Evaluation prints `Inference done 11/125.
Dataloading: 0.0012 s/iter ...`: left out.
"""

from __future__ import annotations

import re

from autotune.analyze.parsers._base import TRUNCATED, LogParser, Skip, StepRecord
from autotune.analyze.parsers._fields import fields, timed

_ITER = re.compile(r"(?<![\w])iter: (?P<iter>\d+)\s")


class Detectron2Parser(LogParser):
    name = "detectron2"
    description = "detectron2 CommonMetricPrinter (iter: N  ...  time: T  data_time: D  lr: ..)"
    anchor = _ITER
    ignore = re.compile(r"Inference done \d+/\d+|Total inference (?:pure compute )?time")
    figures = ("data_time: the mean of the last 20 iterations; time: the mean iteration "
               "since the start of training (detectron2's global average)")
    other_figures = "last_time and last_data_time: the iteration just before each line"
    other_kind = "sample"
    caveat = ("detectron2 prints `time` as the mean iteration since the start of training and "
              "`data_time` as the mean of the last 20 iterations: the share sets a window "
              "against the run's mean (they agree on a steady run; a slow start weighs on "
              "`time` long after it)")

    def parse_piece(self, piece: str, lineno: int) -> StepRecord | None:
        m = _ITER.match(piece)
        f = fields(piece)
        if m is None or "time" not in f or "data_time" not in f:
            raise Skip(TRUNCATED)
        rec = timed(data=f["data_time"], iter_s=f["time"],
                    # iterations done so far: the weight of the first line is then right
                    index=int(m["iter"]) + 1, lineno=lineno)
        if "last_time" in f and "last_data_time" in f:
            rec.alt_data_s, rec.alt_iter_s = f["last_data_time"], f["last_time"]
        return rec
