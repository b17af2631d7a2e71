"""Field extraction shared by the text-log parsers, so that each parser only names its keys.

Two shapes cover the logs read here:

    key: value pairs    mmcv, mmengine, detectron2, YOLOX, LeRobot, torchvision MetricLogger
        time: 0.4123  data_time: 0.0123            {"time": 0.4123, "data_time": 0.0123}
        iter_time: 0.512s, data_time: 95ms         units dropped, ms turned into seconds
        updt_s:0.123 data_s:0.646                  no space after the colon (LeRobot)
    meters              pytorch/examples, semseg: `Name current (running average)`
        Data 0.001 (0.143)  Batch 4.110 (4.190)    ("Data", "Batch") -> (current, average)

A key is matched whole: `time:` never matches inside `data_time:`, `iter_time:` or
`last_time:` (the character before a key may not be a word character).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import ClassVar

from autotune.analyze.parsers._base import (BAD_NUMBER, NUM, TRUNCATED, LogParser, Skip,
                                            StepRecord, finite)

_UNIT = r"(?P<unit>ms|sec|s)?"
# `key: 1.5` / `key:1.5s` / `key: 12ms`; the value may not run on into letters ("4521Mb":
# not a time) and the key may not continue a longer key ("data_time" holds "time").
_KV = re.compile(rf"(?<![\w/.])(?P<key>[A-Za-z_][\w/]*)\s*:\s*(?P<num>{NUM}){_UNIT}(?![\w.])")
_SCALE = {"ms": 1e-3, "s": 1.0, "sec": 1.0, None: 1.0}


def fields(text: str) -> dict[str, float]:
    """The numeric `key: value` pairs of a line, the first of each key; values with a time
    unit in seconds."""
    out: dict[str, float] = {}
    for m in _KV.finditer(text):
        key = m["key"]
        if key not in out:
            out[key] = float(m["num"]) * _SCALE[m["unit"]]
    return out


@lru_cache(maxsize=64)
def _meter_re(name: str) -> re.Pattern[str]:
    n = r"(?P<{g}>" + NUM + r")(?:ms|s)?"
    return re.compile(rf"(?<![\w]){re.escape(name)}:?\s+{n.format(g='val')}\s*\(\s*"
                      rf"{n.format(g='avg')}\s*\)")


def meter(text: str, name: str) -> tuple[float, float] | None:
    """(current, running average) of an AverageMeter printed as `Name val (avg)`, or None.
    A value printed in ms is not expected from these loggers; an `s` suffix is dropped."""
    m = _meter_re(name).search(text)
    if m is None:
        return None
    return float(m["val"]), float(m["avg"])


def timed(*, data: float | None, iter_s: float | None = None, step: float | None = None,
          lineno: int, **kw: object) -> StepRecord:
    """A StepRecord from the times of one line (the missing one of iter/step filled in);
    Skip(BAD_NUMBER) for a negative or non-finite figure."""
    if not finite(data, iter_s, step):
        raise Skip(BAD_NUMBER)
    return StepRecord(data_s=data, iter_s=iter_s, step_s=step, lineno=lineno,
                      **kw).complete()  # type: ignore[arg-type]


def _position(h: re.Match[str]) -> dict[str, int | None]:
    g = h.groupdict()
    return {k: int(g[k]) if g.get(k) else None for k in ("epoch", "index", "total")}


class MeterParser(LogParser):
    """A head with the epoch, index and total, then `Name current (average)` meters: a
    format is its head and the names of its data and iteration meters."""

    head: ClassVar[re.Pattern[str]]
    data_meter: ClassVar[str] = "Data"
    iter_meter: ClassVar[str] = "Time"
    other_figures = "the running averages in brackets (every batch of the epoch so far)"
    other_kind = "running"

    def parse_piece(self, piece: str, lineno: int) -> StepRecord | None:
        h = self.head.match(piece)
        data = meter(piece, self.data_meter) if h else None
        it = meter(piece, self.iter_meter) if h else None
        if h is None or data is None or it is None:
            raise Skip(TRUNCATED)
        rec = timed(data=data[0], iter_s=it[0], lineno=lineno, **_position(h))
        rec.alt_data_s, rec.alt_iter_s = data[1], it[1]
        return rec


class KeyValueParser(LogParser):
    """A head with the epoch, index and total, then `key: value` fields: a format is its
    head and the keys of its data and iteration times."""

    head: ClassVar[re.Pattern[str]]
    data_key: ClassVar[str] = "data_time"
    iter_key: ClassVar[str] = "time"

    def parse_piece(self, piece: str, lineno: int) -> StepRecord | None:
        h = self.head.match(piece)
        f = fields(piece[h.end():]) if h else {}
        if h is None or self.data_key not in f or self.iter_key not in f:
            raise Skip(TRUNCATED)
        return timed(data=f[self.data_key], iter_s=f[self.iter_key], lineno=lineno,
                     **_position(h))

