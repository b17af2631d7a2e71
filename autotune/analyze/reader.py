"""Reading a log as a stream of lines, never whole: a 10 GB log costs one line of memory.

Each line is given as it reads on a terminal, which is what the parsers expect:
  - a progress bar redrawn in place (`\\r`) leaves its states and the next line printed after
    it on one line: only what follows the last carriage return is kept (also when the bar
    ran on for more than MAX_LINE bytes);
  - torchrun's `[rank0]:` / `[default0]:` prefix is taken off and kept as the line's rank;
  - a line identical to the previous non-blank one (a logger with two handlers writing to
    one file: every line twice) is flagged `duplicate`.
A log may be gzip-compressed, or standard input (`spooled`: copied to a temporary file,
since the analysis reads the head twice and seeks to the end).

Also the time index `autotune monitor` writes next to the log it tees (LOG.times: one
"BYTE_OFFSET EPOCH_SECONDS" pair per burst of output), which gives each line of a log
without timestamps the time it was printed, so that steps can be joined with metrics.
"""

from __future__ import annotations

import bisect
import gzip
import zlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

from autotune.errors import UsageError

MAX_LINE = 1 << 20          # longer "lines" (binary junk, \r progress bars) are cut here
TIMES_SUFFIX = ".times"
STDIN = "-"
_RANK = re.compile(r"^\[(?:rank|default)(\d+)\]:\s?")


@dataclass(slots=True)
class Line:
    """One line: its number (1-based), byte offset just past it, text without newline (as
    `clean` leaves it), and the rank of a torchrun prefix."""

    lineno: int
    end_offset: int
    text: str
    too_long: bool = False
    rank: int | None = None
    duplicate: bool = False


def clean(text: str) -> tuple[int | None, str]:
    """(rank, text) of a raw line: torchrun's rank prefix taken off (it starts the physical
    line), then only the last non-blank part after a carriage return kept."""
    rank = None
    m = _RANK.match(text)
    if m is not None:
        rank, text = int(m[1]), text[m.end():]
    if "\r" in text:
        parts = [p for p in text.split("\r") if p.strip()]
        text = parts[-1] if parts else ""
    return rank, text


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


SPOOL_PREFIX = "autotune-stdin-"   # standard input's temporary copy: its folder is no run's


@contextmanager
def spooled(stream: BinaryIO) -> Iterator[Path]:
    """A byte stream (standard input) copied to a temporary file, removed afterwards."""
    fd, name = tempfile.mkstemp(prefix=SPOOL_PREFIX, suffix=".log")
    try:
        with os.fdopen(fd, "wb") as f:
            shutil.copyfileobj(stream, f, 1 << 20)
        yield Path(name)
    finally:
        os.unlink(name)


def _drain(f: IO[bytes], raw: bytes) -> tuple[bytes | None, int]:
    """The rest of an over-long line: (what follows its last carriage return, when there is
    one and that fits in MAX_LINE, else None; the bytes read). Holds at most ~MAX_LINE."""
    tail = raw.rsplit(b"\r", 1)[-1] if b"\r" in raw else None
    read = 0
    while True:
        more = f.readline(MAX_LINE)
        read += len(more)
        end = len(more) - (2 if more.endswith(b"\r\n") else 1 if more.endswith(b"\n") else 0)
        body = more[:end]
        if b"\r" in body:
            tail = body.rsplit(b"\r", 1)[-1]
        elif tail is not None:
            tail = tail + body if len(tail) + len(body) <= MAX_LINE else None
        if not more or end < len(more):
            return (tail if tail is not None and tail.strip() else None), read


def bounded_lines(f: IO[bytes]) -> Iterator[bytes | None]:
    """The raw lines of a side file (LOG.times, metrics.jsonl, a step log's head), each at
    most MAX_LINE bytes: a longer one is read past in MAX_LINE pieces, never held whole, and
    given as None (the caller counts it as a bad line)."""
    while True:
        raw = f.readline(MAX_LINE)
        if not raw:
            return
        if raw.endswith(b"\n") or len(raw) < MAX_LINE:
            yield raw
            continue
        while raw and not raw.endswith(b"\n"):
            raw = f.readline(MAX_LINE)
        yield None


# What a damaged gzip stream raises while it is read: cut short (EOFError), bad bytes.
_GZIP_DAMAGE = (EOFError, gzip.BadGzipFile, zlib.error)


def iter_lines(path: str | os.PathLike[str], *, start: int = 0,
               notes: list[str] | None = None) -> Iterator[Line]:
    """Lines of a text (or gzip) file, decoded as UTF-8 with replacement, cleaned (`clean`).

    A line longer than MAX_LINE is returned cut, `too_long` set, and the rest of it
    skipped without being held in memory, unless what follows its last carriage return
    (a log line printed after a long-running progress bar) fits.

    A gzip log cut short (or damaged) ends where its readable lines end; the line
    "LOG: truncated gzip after N lines" is appended to `notes` (when given).
    """
    n = 0
    try:
        for ln in _lines(Path(path), start):
            n = ln.lineno
            yield ln
    except _GZIP_DAMAGE as e:
        if n == 0:  # nothing readable: the file is the problem, not a log without timings
            raise UsageError(f"{path}: not a readable gzip file ({e or type(e).__name__}); "
                             "give the log itself, or a complete .gz of it") from None
        if notes is not None:
            notes.append(f"{path}: truncated gzip after {n} lines (the lines before it are "
                         "analyzed; the rest of the log is lost)")


def _lines(p: Path, start: int) -> Iterator[Line]:
    previous: tuple[int | None, str] | None = None
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
                tail, read = _drain(f, raw)
                offset += read
                if tail is None:
                    too_long = True
                else:   # the torchrun prefix starts the physical line: keep it
                    m = _RANK.match(raw[:32].decode("ascii", errors="replace"))
                    raw = (raw[:m.end()] if m else b"") + tail
            rank, text = clean(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
            dup = bool(text.strip()) and previous == (rank, text)
            if text.strip():
                previous = (rank, text)
            yield Line(lineno, offset, text, too_long, rank, dup)


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
    for b in tail.split(b"\n"):
        yield clean(b.decode("utf-8", errors="replace").rstrip("\r\n"))[1]


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
            for raw in bounded_lines(f):
                parts = raw.split() if raw is not None else ()
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
