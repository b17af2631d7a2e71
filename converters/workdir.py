"""The conversion's work directory, DST/.autotune-convert/: plan, progress, temporaries.

    plan/      records.bin, order.npy, plan.json, scan-skipped.jsonl (the scan, reusable)
    done/      unit-000012.json: a finished unit's result, written before it is published
    tmp/       shards being written (name.tar.PID); emptied at every start
    lmdb/      the LMDB environment while it is being written
    lock       flock'ed by the running conversion (one writer per DST)

It lives inside DST so that renames into DST stay on one filesystem (atomic), and it is
removed once manifest.json is written.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
from pathlib import Path
from typing import Any

from converters._base import ConvertError, UnitResult

NAME = ".autotune-convert"


def write_json_atomic(path: Path, obj: Any, *, indent: int | None = None,
                      durable: bool = True) -> None:
    """JSON to `path` via a temporary file (fsynced when `durable`) and rename: never half
    written. Compact separators keep the bytes reproducible between runs."""
    from autotune.report import write_text_atomic

    text = json.dumps(obj, ensure_ascii=True, sort_keys=False, indent=indent,
                      separators=(",", ": ") if indent else (",", ":")) + "\n"
    write_text_atomic(path, text, durable=durable)


class WorkDir:
    """Paths and durable records of one conversion's work directory."""

    def __init__(self, dst: Path) -> None:
        self.dst = dst
        self.path = dst / NAME
        self.plan = self.path / "plan"
        self.done = self.path / "done"
        self.tmp = self.path / "tmp"
        self.lmdb = self.path / "lmdb"
        self._lock_fd: int | None = None

    def exists(self) -> bool:
        return self.path.is_dir()

    def create(self) -> None:
        for d in (self.path, self.plan, self.done, self.tmp):
            d.mkdir(parents=True, exist_ok=True)

    def lock(self) -> None:
        """Take the per-DST lock; a second conversion into DST is refused."""
        self.create()
        fd = os.open(self.path / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise ConvertError(f"{self.dst}: another `autotune convert` (pid {other}) is "
                                   "writing here; wait for it, or stop it and rerun to "
                                   "resume.") from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    def clear_tmp(self) -> None:
        """Remove leftovers of a killed run: partial shards are redone, never reused."""
        if self.tmp.is_dir():
            for p in self.tmp.iterdir():
                try:
                    p.unlink()
                except OSError:
                    pass
        self.tmp.mkdir(parents=True, exist_ok=True)

    def done_path(self, unit: int) -> Path:
        return self.done / f"unit-{unit:06d}.json"

    def write_done(self, res: UnitResult, *, durable: bool = True) -> None:
        write_json_atomic(self.done_path(res.unit), res.to_dict(), durable=durable)

    def read_done(self, unit: int) -> UnitResult | None:
        try:
            return UnitResult.from_dict(json.loads(self.done_path(unit).read_text()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            return None  # unreadable record: the unit is redone

    def remove(self) -> None:
        self.unlock()
        shutil.rmtree(self.path, ignore_errors=True)
