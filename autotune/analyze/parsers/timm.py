"""timm (pytorch-image-models) train.py lines from train_one_epoch.

    Train: 0 [  50/5004 (  1%)]  Loss: 6.90 (6.92)  Time: 0.370s, 691.04/s  (0.419s, 611.41/s)  LR: 1.000e-05  Data: 0.012 (0.045)

`Time` is the whole update (data included) and its rate the samples per second of that
update (all ranks together), so batch = rate x time. `Data` is the wait for the batch.
Values before the brackets are the current update's, in brackets the epoch's running
average. `Test: [  10/195]` evaluation lines are left out.
"""

from __future__ import annotations

import re

from autotune.analyze.parsers._base import (BAD_NUMBER, NUM, TRUNCATED, LogParser, Skip,
                                            StepRecord, finite)

_HEAD = re.compile(r"Train: (?P<epoch>\d+) \[\s*(?P<index>\d+)/(?P<total>\d+)")
_TIME = re.compile(rf"Time: (?P<iter>{NUM})s,\s*(?P<rate>{NUM})/s\s+"
                   rf"\(\s*(?P<iter_avg>{NUM})s,\s*(?P<rate_avg>{NUM})/s\)")
_DATA = re.compile(rf"Data: (?P<data>{NUM}) \(\s*(?P<data_avg>{NUM})\)")


class TimmParser(LogParser):
    name = "timm"
    description = "timm train.py (Train: E [ i/N (p%)]  ...  Time: Xs, R/s  ...  Data: D (A))"
    anchor = re.compile(r"Train: \d+ \[")
    ignore = re.compile(r"Test(?: \(EMA\))?: \[\s*\d+/\d+\]")
    figures = "Time and Data: each printed line's current update"
    other_figures = "the running averages in brackets (every update of the epoch so far)"
    other_kind = "running"

    def parse_piece(self, piece: str, lineno: int) -> StepRecord | None:
        h = _HEAD.match(piece)
        t = _TIME.search(piece)
        d = _DATA.search(piece)
        if h is None or t is None or d is None:
            raise Skip(TRUNCATED)
        it, rate, data = float(t["iter"]), float(t["rate"]), float(d["data"])
        if not finite(it, rate, data):
            raise Skip(BAD_NUMBER)
        rec = StepRecord(data_s=data, iter_s=it, rate=rate, epoch=int(h["epoch"]),
                         index=int(h["index"]), total=int(h["total"]), lineno=lineno).complete()
        rec.alt_data_s, rec.alt_iter_s = float(d["data_avg"]), float(t["iter_avg"])
        return rec
