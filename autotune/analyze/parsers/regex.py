"""Any other log, through a regular expression in a YAML file (`--regex FILE`).

    # myformat.yaml
    pattern: 'ep (?P<epoch>\\d+) it (?P<index>\\d+) data (?P<data>[\\d.]+) iter (?P<iter>[\\d.]+)'
    anchor: 'ep \\d+ it '      # optional: where a record starts (splits spliced lines)
    units: s                   # s (default) or ms: the unit of data/iter/step

Named groups (Python `re` syntax), all optional except a data time and one of iter/step:
  data, iter, step   the wait for the batch, the whole iteration, the step alone
  epoch, index, total, batch, rate (samples/s), rank
  time               epoch seconds, or an ISO timestamp '2024-05-01 12:00:00.123'
The pattern is searched in each line (re.search), so a logging prefix does not matter.
"""

from __future__ import annotations

import os
import re

from pathlib import Path
from typing import Any

from autotune.analyze.parsers._base import (BAD_NUMBER, TRUNCATED, LogParser, Skip,
                                            StepRecord, finite, line_timestamp)
from autotune.errors import UsageError

_KNOWN = {"data", "iter", "step", "epoch", "index", "total", "batch", "rate", "rank", "time"}


def _num(s: str | None, kind: type = float) -> Any:
    """The group as `kind` (float or int), None when the group did not match."""
    if s is None:
        return None
    try:
        return kind(s)
    except ValueError:
        raise Skip(BAD_NUMBER) from None


class RegexParser(LogParser):
    name = "regex"
    description = "a user regex from a YAML file (--regex FILE)"

    def __init__(self, pattern: str, *, anchor: str | None = None, units: str = "s",
                 source: str = "<pattern>") -> None:
        super().__init__()
        where = f"{source}: "
        try:
            self.pattern = re.compile(pattern)
        except re.error as e:
            raise UsageError(f"{where}pattern is not a valid regular expression ({e}); "
                             "check the escaping (in YAML single quotes, write \\d as \\d)") from e
        groups = set(self.pattern.groupindex)
        unknown = sorted(groups - _KNOWN)
        if unknown:
            raise UsageError(f"{where}unknown group name(s) {', '.join(unknown)}; use "
                             f"{', '.join(sorted(_KNOWN))}")
        if "data" not in groups or not groups & {"iter", "step"}:
            raise UsageError(f"{where}the pattern needs a (?P<data>...) group (the wait for "
                             "the batch) and a (?P<iter>...) or (?P<step>...) group; it has "
                             f"{', '.join(sorted(groups)) or 'none'}")
        if units not in ("s", "ms"):
            raise UsageError(f"{where}units must be 's' or 'ms', not {units!r}")
        self.scale = 1e-3 if units == "ms" else 1.0
        try:
            self.anchor_re = re.compile(anchor) if anchor else None
        except re.error as e:
            raise UsageError(f"{where}anchor is not a valid regular expression ({e})") from e
        self.anchor = self.anchor_re  # type: ignore[misc]  (the base class splits on it)
        self.source = source

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> RegexParser:
        """Load `pattern`, `anchor` and `units` from a YAML file."""
        from autotune.configfiles import load_yaml

        p = Path(path)
        try:
            raw = load_yaml(p, "log pattern")
        except UsageError as e:
            raise UsageError(f"{e}; a log pattern file holds 'pattern' (quote it with single "
                             "quotes)", setting="regex") from None
        if not isinstance(raw.get("pattern"), str):
            raise UsageError(f"log pattern {p}: expected a mapping with a 'pattern' string, e.g. "
                             "pattern: 'data (?P<data>[\\d.]+) iter (?P<iter>[\\d.]+)'",
                             setting="regex")
        extra = sorted(set(raw) - {"pattern", "anchor", "units", "name"})
        if extra:
            raise UsageError(f"log pattern {p}: unknown key(s) {', '.join(extra)}; known: "
                             "pattern, anchor, units, name", setting="regex")
        return cls(raw["pattern"], anchor=raw.get("anchor"), units=str(raw.get("units", "s")),
                   source=f"log pattern {p}")

    def sniff(self, line: str) -> bool:
        return self.pattern.search(line) is not None

    def feed(self, line: str, lineno: int) -> list[StepRecord]:
        if self.anchor_re is None:
            return [self.parse_piece(line, lineno)]
        return super().feed(line, lineno)

    def parse_piece(self, piece: str, lineno: int) -> StepRecord:
        m = self.pattern.search(piece)
        if m is None:
            raise Skip(TRUNCATED if self.anchor_re is not None else "other output")
        g: dict[str, Any] = m.groupdict()
        data, it, step = (_num(g.get(k)) for k in ("data", "iter", "step"))
        data = None if data is None else data * self.scale
        it = None if it is None else it * self.scale
        step = None if step is None else step * self.scale
        rate = _num(g.get("rate"))
        if not finite(data, it, step, rate):
            raise Skip(BAD_NUMBER)
        end: float | None = None
        if g.get("time"):
            try:
                end = float(g["time"])
            except ValueError:
                end = line_timestamp(g["time"])
        elif (ts := line_timestamp(piece)) is not None:
            end = ts
        rec = StepRecord(data_s=data, iter_s=it, step_s=step, epoch=_num(g.get("epoch"), int),
                         index=_num(g.get("index"), int), total=_num(g.get("total"), int),
                         batch=_num(g.get("batch"), int), rate=rate, rank=_num(g.get("rank"), int),
                         end_time=end, lineno=lineno)
        return rec.complete()


