"""autotune's own step log: the JSONL that `autotune.instrument(loader)` writes.

    {"autotune": "steps", "version": 1, "pid": ..., "cores": 16, "loader": {...}}   header
    {"t": 1714557600.123456, "epoch": 0, "step": 12, "wait_s": 0.0123, "step_s": 0.1002, "batch": 256}

`t` is when the loop asked for the batch (epoch seconds); the step ends at
t + wait_s + step_s. A header starts each writer (each rank, each run appending).
"""

from __future__ import annotations

import json
import re
from typing import Any

from autotune.analyze.parsers._base import (BAD_NUMBER, TRUNCATED, LogParser, Skip,
                                            StepRecord, finite)

_DECODER = json.JSONDecoder()


def _num(d: dict[str, Any], key: str) -> float | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise Skip(TRUNCATED)
    return float(v)


class OwnParser(LogParser):
    name = "own"
    description = "autotune.instrument() JSONL (one object per step)"
    anchor = re.compile(r'\{"(?:t|autotune)"\s*:')

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[dict[str, Any]] = []

    def sniff(self, line: str) -> bool:
        return '"autotune": "steps"' in line or ('"wait_s"' in line and '"step_s"' in line)

    def parse_piece(self, piece: str, lineno: int) -> StepRecord | None:
        try:
            obj, _ = _DECODER.raw_decode(piece)
        except (ValueError, RecursionError):   # nested deeper than Python's stack: bad line
            raise Skip(TRUNCATED) from None
        if not isinstance(obj, dict):
            raise Skip(TRUNCATED)
        if obj.get("autotune") == "steps":
            self.headers.append(obj)
            self.meta = obj   # the latest header describes the records that follow
            return None
        t, wait, step = _num(obj, "t"), _num(obj, "wait_s"), _num(obj, "step_s")
        if wait is None or step is None:
            raise Skip(TRUNCATED)
        if not finite(wait, step):
            raise Skip(BAD_NUMBER)
        batch = obj.get("batch")
        rank = obj.get("rank")
        return StepRecord(
            data_s=wait, iter_s=wait + step, step_s=step,
            epoch=obj.get("epoch") if isinstance(obj.get("epoch"), int) else None,
            index=obj.get("step") if isinstance(obj.get("step"), int) else None,
            batch=batch if isinstance(batch, int) and batch > 0 else None,
            end_time=None if t is None else t + wait + step,
            rank=rank if isinstance(rank, int) else None, lineno=lineno)

    def feed(self, line: str, lineno: int) -> list[StepRecord]:
        try:
            return super().feed(line, lineno)
        except Skip as e:
            if e.reason == "other output" and line.lstrip().startswith("{"):
                raise Skip(TRUNCATED) from None
            raise
