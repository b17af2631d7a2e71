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

from autotune.analyze.parsers._fields import MeterParser

_HEAD = re.compile(r"Epoch: \[(?P<epoch>\d+)\]\[\s*(?P<index>\d+)/(?P<total>\d+)\]\s+Time\s")


class ImagenetParser(MeterParser):
    name = "imagenet"
    description = "pytorch/examples imagenet/main.py (Epoch: [E][ i/N]  Time ..  Data ..)"
    anchor = re.compile(r"Epoch: \[\d+\]\[")
    ignore = re.compile(r"Test: \[\s*\d+/\d+\]")
    figures = "Time and Data: each printed line's current batch"
    head = _HEAD
    data_meter, iter_meter = "Data", "Time"
