"""torchvision references' `MetricLogger.log_every` (classification, detection, ...) and the
loggers copied from it (DeiT, DINO, MAE, DETR).

    Epoch: [0]  [  10/5005]  eta: 0:55:12  lr: 0.1  img/s: 412.3  loss: 6.9077 (6.9100)  time: 0.5123  data: 0.1012  max mem: 10234
    Epoch: [3/100]  [ 40/1251]  eta: 0:12:01  loss: 11.07 (11.08)  lr: 0.0005  time: 0.6012  data: 0.3005  max mem: 8000   (DINO)

`time` is the whole iteration (from the end of the previous one, the wait for the batch
included) and `data` that wait; both are the mean of the last 20 iterations (SmoothedValue's
window) at the printed line, one line every `print_freq` iterations. The index is 0-based.
DeiT/DINO/MAE print no `img/s`, and no `max mem` without CUDA. `img/s` is the last
iteration's alone, so batch = img/s x time would be off: give --batch-size.
Evaluation prints `Test:  [ 10/196]  ...  time: ...  data: ...`: left out.
"""

from __future__ import annotations

import re

from autotune.analyze.parsers._fields import KeyValueParser

_HEAD = re.compile(r"Epoch: \[(?P<epoch>\d+)(?:/\d+)?\]\s+\[\s*(?P<index>\d+)/(?P<total>\d+)\]")


class MetricLoggerParser(KeyValueParser):
    name = "metriclogger"
    description = ("torchvision references MetricLogger, DeiT/DINO/MAE "
                   "(Epoch: [E]  [ i/N]  ...  time: T  data: D)")
    anchor = re.compile(r"Epoch: \[\d+(?:/\d+)?\]\s+\[\s*\d+/")
    ignore = re.compile(r"Test:\s+(?:\S+\s+)?\[\s*\d+/\d+\]")
    figures = "time and data: the mean of the last 20 iterations at each printed line"
    head = _HEAD
    data_key, iter_key = "data", "time"
