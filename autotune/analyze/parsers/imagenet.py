"""pytorch/examples imagenet/main.py progress lines (ProgressMeter / AverageMeter).

    Epoch: [0][ 10/5005]\tTime  0.345 ( 0.567)\tData  0.123 ( 0.234)\tLoss 6.9e+00 (...)

Meters are joined by tabs; each prints `NAME VAL (AVG)`: the current batch's value, then
the running average over the epoch. `Time` is the whole iteration (it includes `Data`,
the wait for the batch). Evaluation prints `Test: [ 10/196]` with no Data meter: left out.
The batch size is not in these lines: give `--batch-size`.
"""

from __future__ import annotations

import re

from autotune.analyze.parsers._base import (BAD_NUMBER, NUM, TRUNCATED, LogParser, Skip,
                                            StepRecord, finite)

_RECORD = re.compile(
    r"Epoch: \[(?P<epoch>\d+)\]\[\s*(?P<index>\d+)/(?P<total>\d+)\]"
    rf"\s+Time\s+(?P<iter>{NUM})\s+\(\s*(?P<iter_avg>{NUM})\)"
    rf"\s+Data\s+(?P<data>{NUM})\s+\(\s*(?P<data_avg>{NUM})\)")


class ImagenetParser(LogParser):
    name = "imagenet"
    description = "pytorch/examples imagenet/main.py (Epoch: [E][ i/N]  Time ..  Data ..)"
    anchor = re.compile(r"Epoch: \[\d+\]\[")
    ignore = re.compile(r"Test: \[\s*\d+/\d+\]")

    def parse_piece(self, piece: str, lineno: int) -> StepRecord | None:
        m = _RECORD.match(piece)
        if m is None:
            raise Skip(TRUNCATED)
        it, data = float(m["iter"]), float(m["data"])
        if not finite(it, data):
            raise Skip(BAD_NUMBER)
        return StepRecord(data_s=data, iter_s=it, epoch=int(m["epoch"]), index=int(m["index"]),
                          total=int(m["total"]), lineno=lineno).complete()
