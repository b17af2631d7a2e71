"""OpenMMLab mmengine `LogProcessor` (mmdet 3.x, mmseg 1.x, mmpretrain, mmocr 1.x ...).

    05/01 12:00:00 - mmengine - INFO - Epoch(train)  [1][ 50/1000]  lr: 1.0000e-01  eta: 1:23:45  time: 0.4123  data_time: 0.0123  memory: 4521  loss: 2.3012
    Iter(train) [  50/90000]  lr: ...  time: ...  data_time: ...      (by iteration)

Items are joined by two spaces; `time` may come before or after `data_time` (the end-of-
validation line puts them last, in the other order). `time` is the whole iteration
(IterTimerHook: the wait for the batch included) and `data_time` that wait, both the mean
of the last `window_size` (default 10) iterations at each line. `Epoch(val)` and
`Epoch(test)` lines carry time and data_time too: left out.
"""

from __future__ import annotations

from autotune.analyze.parsers.mmcv import MMCVParser


class MMEngineParser(MMCVParser):
    name = "mmengine"
    description = ("OpenMMLab mmengine LogProcessor (Epoch(train) [E][i/N]  lr: ..  "
                   "time: T  data_time: D  ..)")
    figures = "time and data_time: the mean of the last window_size iterations at each line"
    comma_separated = False
