"""pytorch/examples imagenet/main.py progress lines (ProgressMeter / AverageMeter).

    Epoch: [0][ 10/5005]\tTime  0.345 ( 0.567)\tData  0.123 ( 0.234)\tLoss 6.9e+00 (...)

Meters are joined by tabs; each prints `NAME VAL (AVG)`: the current batch's value, then
the running average over the epoch. `Time` is the whole iteration (it includes `Data`,
the wait for the batch). The share uses the current values (a sample: one batch in
print_freq); the running averages, which count every batch, are the other reading.
Evaluation prints `Test: [ 10/196]` with no Data meter: left out.
The batch size is not in these lines: give `--batch-size`.
"""

from __future__ import annotations

import re

from autotune.analyze.parsers._base import TRUNCATED, LogParser, Skip, StepRecord
from autotune.analyze.parsers._fields import meter, timed

_HEAD = re.compile(r"Epoch: \[(?P<epoch>\d+)\]\[\s*(?P<index>\d+)/(?P<total>\d+)\]\s+Time\s")


class ImagenetParser(LogParser):
    name = "imagenet"
    description = "pytorch/examples imagenet/main.py (Epoch: [E][ i/N]  Time ..  Data ..)"
    anchor = re.compile(r"Epoch: \[\d+\]\[")
    ignore = re.compile(r"Test: \[\s*\d+/\d+\]")
    figures = "Time and Data: each printed line's current batch"
    other_figures = "the running averages in brackets (every batch of the epoch so far)"
    other_kind = "running"

    def parse_piece(self, piece: str, lineno: int) -> StepRecord | None:
        h = _HEAD.match(piece)
        it = meter(piece, "Time") if h else None
        data = meter(piece, "Data") if h else None
        if h is None or it is None or data is None:
            raise Skip(TRUNCATED)
        rec = timed(data=data[0], iter_s=it[0], epoch=int(h["epoch"]), index=int(h["index"]),
                    total=int(h["total"]), lineno=lineno)
        rec.alt_data_s, rec.alt_iter_s = data[1], it[1]
        return rec
