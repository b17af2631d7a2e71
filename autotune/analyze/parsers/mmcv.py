"""OpenMMLab mmcv `TextLoggerHook` (mmdet 2.x, mmseg 0.x, mmcls, mmaction2 ...).

    2024-05-01 12:00:00,123 - mmdet - INFO - Epoch [1][100/5005]\tlr: 1.000e-01, eta: 1 day, 2:03:04, time: 0.432, data_time: 0.071, memory: 4521, loss: 2.1234
    Epoch(train) [1][100/5005]\tlr: ...      (later mmcv)        Iter [100/160000]\tlr: ...   (by iteration)

Items are joined by ", ". `time` is the whole iteration (IterTimerHook: from the end of
the previous one, so the wait for the batch is in it) and `data_time` that wait, both the
mean over the logging interval. The index is 1-based. Validation prints
`Epoch(val) [1][500]\t...`: left out. mmengine (its successor) is `mmengine`; both parse
the same way, they differ in the separators (used only to tell them apart).
"""

from __future__ import annotations

import re
from typing import ClassVar

from autotune.analyze.parsers._base import NUM, Skip, StepRecord
from autotune.analyze.parsers._fields import KeyValueParser

# Epoch [E][i/N], Epoch(train) [E][ i/N], Iter [i/N], Iter(train) [ i/N]; mmengine pads
# and right-aligns the numbers, and leaves more spaces after "(train)".
# mmengine's test lines have no epoch: Epoch(test) [ 50/500].
_HEAD = re.compile(r"(?:Epoch|Iter)(?:\((?P<mode>\w+)\))?\s*(?:\[\s*(?P<epoch>\d+)\]\s*)?"
                   r"\[\s*(?P<index>\d+)(?:/(?P<total>\d+))?\]")
_COMMA_AFTER_DATA = re.compile(rf"data_time:\s*(?:{NUM})\w*,")


class MMCVParser(KeyValueParser):
    name = "mmcv"
    description = "OpenMMLab mmcv TextLoggerHook (Epoch [E][i/N]\\tlr: .., time: T, data_time: D, ..)"
    anchor = re.compile(r"(?:Epoch|Iter)(?:\(\w+\))?\s*\[\s*\d+\]?")
    figures = "time and data_time: the mean over each logging interval"
    # mmcv joins its items with ", ", mmengine with two spaces: only the sniff tells.
    comma_separated: ClassVar[bool] = True
    head = _HEAD

    def parse_piece(self, piece: str, lineno: int) -> StepRecord | None:
        h = self.head.match(piece)
        if h is not None and (h["mode"] or "train") != "train":
            raise Skip("evaluation line")
        return super().parse_piece(piece, lineno)

    def sniff(self, line: str) -> bool:
        return (super().sniff(line)
                and (_COMMA_AFTER_DATA.search(line) is not None) == self.comma_separated)
