"""Where autotune's own sample pipeline spends its time: read, decode, transform, collate.

The kernel's time budget (autotune.monitor.timebudget) says what each loader process was
doing; for a dataset autotune reads itself (a preset over a folder, LMDB or WebDataset
shards) the pipeline can also say which of its stages the time went to, measured inside
each DataLoader worker:

    read       open and read the sample's bytes (a file, an LMDB value, a tar member)
    decode     parse the header and decode the pixels (Pillow or simplejpeg)
    transform  everything else the sample's transform does (crop, resize, flip, jitter,
               to a tensor, normalise)
    collate    stack a batch's samples (in the worker; in the main process without workers)

Each process adds its own seconds to its own row of a small file mapped shared (row 0:
the main process, row 1 + k: worker k), so nothing crosses a queue and no lock is taken;
whoever made the clock reads the rows' sums at a window's start and end and takes the
difference (`StageClock.totals`, `stage_budget`). A spawned or forkserver worker reopens
the file by its path. A user's own dataset (a factory) is not timed: the kernel's figures
are its budget.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from pathlib import Path
from typing import Any, Callable

STAGES = ("read", "decode", "transform", "collate")
_FIELDS = STAGES + ("samples", "batches")
_ROW = len(_FIELDS) * 8
_MAX_ROWS = 1025      # the main process and up to 1,024 workers


class StageClock:
    """Seconds per pipeline stage, per process, in a file mapped shared.

        clock = StageClock.create(scratch / "stages.bin", num_workers)
        before = clock.totals()
        ...                                   # workers call clock.add(...)
        budget = stage_budget(before, clock.totals(), workers=num_workers, wall_s=...)
    """

    def __init__(self, path: str, rows: int) -> None:
        self.path, self.rows = path, rows
        self._map: mmap.mmap | None = None
        self._pid = -1

    @classmethod
    def create(cls, path: str | os.PathLike[str], num_workers: int) -> StageClock:
        """A zeroed clock for the main process and `num_workers` workers (a new file,
        mode 0600: nobody else writes into it)."""
        rows = num_workers + 1
        if not 1 <= rows <= _MAX_ROWS:
            raise ValueError(f"a stage clock holds 0 to {_MAX_ROWS - 1} workers, but got "
                             f"{num_workers}.")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, rows * _ROW)
        finally:
            os.close(fd)
        return cls(str(path), rows)

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "rows": self.rows}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["rows"])  # type: ignore[misc]

    def _view(self) -> mmap.mmap:
        # A forked worker shares the parent's MAP_SHARED mapping; a spawned one (or this
        # object unpickled) opens the file itself.
        if self._map is None:
            fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW)
            try:
                if os.fstat(fd).st_size != self.rows * _ROW:
                    raise ValueError(f"{self.path}: not a stage clock of {self.rows} rows")
                self._map = mmap.mmap(fd, self.rows * _ROW)
            finally:
                os.close(fd)
        return self._map

    def _row(self) -> int:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        return 0 if info is None else min(1 + info.id, self.rows - 1)

    def add(self, read: float = 0.0, decode: float = 0.0, transform: float = 0.0,
            collate: float = 0.0, samples: int = 0, batches: int = 0) -> None:
        """Add this process's seconds (and counts) to its row."""
        m, off = self._view(), self._row() * _ROW
        vals = struct.unpack_from("6d", m, off)
        struct.pack_into("6d", m, off, vals[0] + read, vals[1] + decode, vals[2] + transform,
                         vals[3] + collate, vals[4] + samples, vals[5] + batches)

    def totals(self) -> dict[str, float]:
        """The sums over every row so far: seconds per stage, samples, batches."""
        m = self._view()
        sums = [0.0] * len(_FIELDS)
        for r in range(self.rows):
            for i, v in enumerate(struct.unpack_from("6d", m, r * _ROW)):
                sums[i] += v
        return dict(zip(_FIELDS, sums))

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None

    def timed_collate(self, collate_fn: Callable[[list[Any]], Any]) -> TimedCollate:
        """`collate_fn` with its time added to this clock's collate stage."""
        return TimedCollate(collate_fn, self)


class TimedCollate:
    """A collate function that adds its own time to a StageClock (picklable, for spawned
    workers, when `fn` is)."""

    def __init__(self, fn: Callable[[list[Any]], Any], clock: StageClock) -> None:
        self.fn, self.clock = fn, clock

    def __call__(self, samples: list[Any]) -> Any:
        t0 = time.perf_counter()
        out = self.fn(samples)
        self.clock.add(collate=time.perf_counter() - t0, batches=1)
        return out


def stage_budget(before: dict[str, float], after: dict[str, float], *, workers: int,
                 wall_s: float) -> dict[str, Any] | None:
    """The window's stage budget from two `totals()`: seconds, the share of the pipeline's
    time and ms per sample of each stage (collate: ms per batch), and `busy`, the pipeline's
    seconds over the loading processes' wall time (the workers', or the main process's
    without workers: the rest they waited for work, a queue or a lock). None when no
    sample was timed in the window."""
    d = {k: max(0.0, after.get(k, 0.0) - before.get(k, 0.0)) for k in _FIELDS}
    samples, batches = int(round(d["samples"])), int(round(d["batches"]))
    total = sum(d[s] for s in STAGES)
    if samples == 0 or total <= 0:
        return None
    procs = max(1, workers)
    return {
        "source": "autotune's pipeline, timed in each loading process",
        "samples": samples, "batches": batches,
        "seconds": {s: d[s] for s in STAGES},
        "share": {s: d[s] / total for s in STAGES},
        "ms_per_sample": {s: 1000 * d[s] / samples for s in STAGES if s != "collate"},
        "collate_ms_per_batch": 1000 * d["collate"] / batches if batches else None,
        "busy": total / (procs * wall_s) if wall_s > 0 else None,
        "workers": workers,
    }


def stage_line(b: dict[str, Any] | None) -> str | None:
    """'read 71 % (3.1 ms/sample), decode 22 % (1.0), transform 5 % (0.2), collate 2 %
    (1.4 ms/batch); the workers were in the pipeline 96 % of their time', or None."""
    if not b:
        return None
    sh, ms = b["share"], b["ms_per_sample"]
    parts = [f"read {sh['read']:.0%} ({ms['read']:.2g} ms/sample)",
             f"decode {sh['decode']:.0%} ({ms['decode']:.2g})",
             f"transform {sh['transform']:.0%} ({ms['transform']:.2g})"]
    cb = b.get("collate_ms_per_batch")
    parts.append(f"collate {sh['collate']:.0%}" + (f" ({cb:.2g} ms/batch)" if cb else ""))
    tail = f"; {busy_text(b)}" if b.get("busy") is not None else ""
    return ", ".join(parts) + f" over {b['samples']:,} samples" + tail


def busy_text(b: dict[str, Any]) -> str:
    """'the 2 workers were in the pipeline 77% of their time'."""
    w = b.get("workers") or 0
    who = ("the main process (no workers) was" if w == 0 else
           "the worker was" if w == 1 else f"the {w} workers were")
    return f"{who} in the pipeline {b['busy']:.0%} of {'its' if w <= 1 else 'their'} time"


def clock_path(scratch: str | os.PathLike[str], pid: int | None = None) -> Path:
    """Where a bench process keeps its clock: its own file in the run's scratch folder."""
    return Path(scratch) / f"stages-{pid or os.getpid()}.bin"
