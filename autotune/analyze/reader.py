"""Reading a log as a stream of lines, never whole: a 10 GB log costs one line of memory.

Also the time index `autotune monitor` writes next to the log it tees (LOG.times: one
"BYTE_OFFSET EPOCH_SECONDS" pair per burst of output), which gives each line of a log
without timestamps the time it was printed, so that steps can be joined with metrics.
"""

from __future__ import annotations

import bisect
import gzip
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from autotune.errors import UsageError

MAX_LINE = 1 << 20          # longer "lines" (binary junk, \r progress bars) are cut here
TIMES_SUFFIX = ".times"


@dataclass(slots=True)
class Line:
    """One line: its number (1-based), byte offset just past it, text without newline."""

    lineno: int
    end_offset: int
    text: str
    too_long: bool = False


def _open(path: Path) -> IO[bytes]:
    try:
        f = path.open("rb")
        if f.read(2) == b"\x1f\x8b":
            f.close()
            return gzip.open(path, "rb")  # type: ignore[return-value]
        f.seek(0)
        return f
    except IsADirectoryError:
        raise UsageError(f"{path}: a directory; give the log file (or the `autotune monitor` "
                         "output directory to `autotune analyze`)") from None
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror}") from e


def iter_lines(path: str | os.PathLike[str], *, start: int = 0) -> Iterator[Line]:
    """Lines of a text (or gzip) file, decoded as UTF-8 with replacement.

    A line longer than MAX_LINE is returned cut, `too_long` set, and the rest of it
    skipped without being held in memory.
    """
    p = Path(path)
    with _open(p) as f:
        if start:
            f.seek(start)
        offset = start
        lineno = 0
        while True:
            raw = f.readline(MAX_LINE)
            if not raw:
                return
            offset += len(raw)
            lineno += 1
            too_long = False
            if not raw.endswith(b"\n") and len(raw) >= MAX_LINE:
                too_long = True
                while True:   # drain the rest of the over-long line
                    more = f.readline(MAX_LINE)
                    offset += len(more)
                    if not more or more.endswith(b"\n"):
                        break
            text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            yield Line(lineno, offset, text, too_long)


def head_and_tail(path: str | os.PathLike[str], head_lines: int = 5000,
                  tail_bytes: int = 1 << 20) -> Iterator[str]:
    """The first lines and the last ~1 MiB of lines: enough to recognise a format, also
    one that only prints a summary at the end (Lightning's profiler). A generator: only
    the tail's bytes are held at once."""
    p = Path(path)
    for ln in iter_lines(p):
        yield ln.text
        if ln.lineno >= head_lines:
            break
    else:
        return   # the whole file was read
    try:
        size = p.stat().st_size
        with _open(p) as f:
            if isinstance(f, gzip.GzipFile):
                return   # no cheap seek to the end of a gzip stream
            f.seek(max(0, size - tail_bytes))
            f.readline()     # a partial first line
            tail = f.read(tail_bytes)
    except OSError:
        return
    for b in tail.splitlines():
        yield b.decode("utf-8", errors="replace").rstrip("\r\n")


class LineTimes:
    """Byte offset -> time the bytes were written, from a LOG.times index.

    A line's time is that of the first index entry at or after its end offset (the
    burst that completed it). Entries are small; they are held in two arrays.
    """

    def __init__(self, offsets: list[int], times: list[float], source: str) -> None:
        self.offsets = offsets
        self.times = times
        self.source = source

    @classmethod
    def for_log(cls, log: str | os.PathLike[str]) -> LineTimes | None:
        """The index next to `log` (LOG.times), or None when there is none."""
        p = Path(os.fspath(log) + TIMES_SUFFIX)
        if not p.is_file():
            return None
        offsets: list[int] = []
        times: list[float] = []
        with p.open("rb") as f:
            for raw in f:
                parts = raw.split()
                if len(parts) != 2:
                    continue   # a line cut by a crash of the monitor
                try:
                    o, t = int(parts[0]), float(parts[1])
                except ValueError:
                    continue
                if offsets and o < offsets[-1]:
                    continue
                offsets.append(o)
                times.append(t)
        return cls(offsets, times, str(p)) if offsets else None

    def time_of(self, end_offset: int) -> float | None:
        i = bisect.bisect_left(self.offsets, end_offset)
        return self.times[i] if i < len(self.times) else None
