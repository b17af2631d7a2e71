"""The semseg-style logger (hszhao/semseg PSPNet/PSANet train.py and the many segmentation,
point-cloud and re-id repositories that copied it).

    [2024-05-01 12:00:00,123 INFO train.py line 240 4567] Epoch: [1/200][10/1488] Data 0.001 (0.143) Batch 4.110 (4.190) Remain 01:23:45 MainLoss 0.5316 AuxLoss 0.5401 Loss 0.7476 Accuracy 0.7712.

`Batch` is the whole iteration (from the end of the previous one, the wait for the batch
included) and `Data` that wait; each printed `current (running average)`, the average over
the epoch so far. The share uses the current values (a sample of the batches, one each
print_freq); the running averages count every batch. Epoch and index are 1-based.
Validation prints `Test: [10/63] Data ... Batch ...`: left out.
"""

from __future__ import annotations

import re

from autotune.analyze.parsers._fields import MeterParser

_HEAD = re.compile(r"Epoch: \[(?P<epoch>\d+)(?:/\d+)?\]\[\s*(?P<index>\d+)/(?P<total>\d+)\]")


class SemsegParser(MeterParser):
    name = "semseg"
    description = "semseg-style (Epoch: [E/N][i/M] Data D (avg) Batch B (avg) Remain ..)"
    anchor = re.compile(r"Epoch: \[\d+(?:/\d+)?\]\[")
    ignore = re.compile(r"Test: \[\s*\d+/\d+\]")
    figures = "Data and Batch: each printed line's current batch"
    head = _HEAD
    data_meter, iter_meter = "Data", "Batch"
