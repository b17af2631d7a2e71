"""YOLOX (Megvii) `Trainer.after_iter` lines (also ByteTrack and other YOLOX forks).

    2024-05-01 12:00:00 | INFO     | yolox.core.trainer:259 - epoch: 1/300, iter: 10/1000, gpu mem: 4521Mb, mem: 3.2Gb, iter_time: 0.512s, data_time: 0.095s, total_loss: 12.3, iou_loss: 3.1, lr: 1.000e-04, size: 640, ETA: 1 day, 2:03:04

`iter_time` is the whole iteration (from before the prefetcher's next() to after the
optimizer step) and `data_time` the wait for the batch and its preprocessing; both the mean
over the print interval (the meters are cleared after each line). Epoch and iter are
1-based. Evaluation prints `Average forward time: 5.12 ms, ...`: left out.
"""

from __future__ import annotations

import re

from autotune.analyze.parsers._fields import KeyValueParser

_HEAD = re.compile(r"epoch: (?P<epoch>\d+)/\d+, iter: (?P<index>\d+)/(?P<total>\d+)")


class YoloxParser(KeyValueParser):
    name = "yolox"
    description = "YOLOX trainer (epoch: E/N, iter: i/M, ..., iter_time: Ts, data_time: Ds, ..)"
    anchor = re.compile(r"epoch: \d+/\d+, iter: \d+/")
    ignore = re.compile(r"Average (?:forward|inference|NMS) time")
    figures = "iter_time and data_time: the mean over each print interval"
    head = _HEAD
    data_key, iter_key = "data_time", "iter_time"
