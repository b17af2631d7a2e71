"""The conversion's work directory, DST/.autotune-convert/: plan, progress, temporaries.

    plan/      records.bin, order.npy, plan.json, scan-skipped.jsonl (the scan, reusable)
    scan/      a resumed run's scan of SRC, compared with plan/ (SRC changed?), then removed
    done/      unit-000012.json: a finished unit's result, written before it is published
    tmp/       shards being written (name.tar.PID); emptied at every start
    lmdb/      the LMDB environment while it is being written
    lock       flock'ed by the running conversion (one writer per DST)

A conversion by ranks (see autotune_converters.ranks) adds:

    dist.json      published by rank 0 after the plan: world size, plan hash
    ranks/R/       rank R's lock, tmp/ (its shards being written), state.json, and
                   scan/ (its own plan of SRC, hashed to compare with rank 0's, then removed)
    finalize.lock  held by whoever checks the units and writes manifest.json

It lives inside DST so that renames into DST stay on one filesystem (atomic), and it is
removed once manifest.json is written. A symbolic link where one of its folders or its
lock belongs is refused, never followed; a work folder left behind is removed only when
it is this user's and nobody holds its lock (a pid says nothing across pid namespaces).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from stat import S_ISDIR
from typing import Any

from autotune_base.beneath import open_dir, subdir
from autotune_base.errors import ConvertError, UsageError
from autotune_base.fsutil import PidLock, write_json_atomic
from autotune_converters.records import UnitResult

NAME = ".autotune-convert"
DIST_VERSION = 1


def _ancestors(levels: int = 3) -> set[str]:
    """The pids of this process's parent, grandparent, ... (from /proc; as strings)."""
    out, pid = set(), os.getppid()
    for _ in range(levels):
        if pid <= 1:
            break
        out.add(str(pid))
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


class WorkDir:
    """Paths and durable records of one conversion's work directory."""

    def __init__(self, dst: Path, rank: int | None = None) -> None:
        self.dst = dst
        self.path = dst / NAME
        self.plan = self.path / "plan"
        self.rescan = self.path / "scan"
        self.done = self.path / "done"
        self.lmdb = self.path / "lmdb"
        self.dist = self.path / "dist.json"
        self.rank = rank
        # Each rank empties only its own temporaries: another rank's are shards in flight.
        self.tmp = self.path / "tmp" if rank is None else self.rank_dir(rank) / "tmp"
        # The hash of the plan the units are written for (recorded in every done record).
        self.plan_id: str | None = None
        self._lock: PidLock | None = None

    def rank_dir(self, rank: int) -> Path:
        return self.path / "ranks" / str(rank)

    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        d["_lock"] = None  # the lock stays with the process that took it
        return d

    def exists(self) -> bool:
        return self.path.is_dir()

    def create(self) -> None:
        for d in (self.path, self.plan, self.done, self.tmp):
            self.real_dir(d)

    def real_dir(self, d: Path) -> None:
        """Make `d` (inside DST) one component at a time, following no link."""
        self.dst.mkdir(parents=True, exist_ok=True)
        fd = open_dir(self.dst)
        try:
            for part in d.relative_to(self.dst).parts:
                nxt = subdir(fd, part, create=True)
                os.close(fd)
                fd = nxt
        except OSError as e:
            raise ConvertError(f"{self.dst / (e.filename or '')}: {e.strerror} inside the "
                               f"conversion's work folder {d}; it is not followed: remove it "
                               "and rerun.") from None
        finally:
            os.close(fd)

    def lock(self) -> None:
        """Take the per-DST lock; a second conversion into DST is refused."""
        self.create()
        self._lock = PidLock(self.path / "lock", self._busy).acquire()

    def _busy(self, holder: str) -> ConvertError:
        if holder in _ancestors():
            # The holder is an ancestor: this is a conversion worker (or its fork server)
            # importing the user's script again, which calls convert() anew.
            return ConvertError(
                f"{self.dst}: convert() was called again by a child of the conversion (pid "
                f"{holder}) re-importing the main script; put the call under "
                "`if __name__ == \"__main__\":` (worker processes import the script).")
        return ConvertError(f"{self.dst}: another `autotune convert` (pid {holder}) is "
                            "writing here; wait for it, or stop it and rerun to resume.")

    def unlock(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def clear_tmp(self) -> None:
        """Remove leftovers of a killed run: partial shards are redone, never reused."""
        self.real_dir(self.tmp)  # a link there is refused before anything is listed
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
        d = res.to_dict()
        if self.plan_id:
            d["plan"] = self.plan_id
        write_json_atomic(self.done_path(res.unit), d, durable=durable)

    def read_done_plan(self, unit: int) -> str | None:
        """The plan hash a unit's record was written for: None when there is no readable
        record, "" for a record without one (written by a run without ranks, for the plan
        in plan/: a fresh scan empties done/)."""
        try:
            return str(json.loads(self.done_path(unit).read_text()).get("plan") or "")
        except (OSError, ValueError, AttributeError):
            return None

    def read_done(self, unit: int) -> UnitResult | None:
        try:
            p = self.done_path(unit)
            return UnitResult.from_dict(json.loads(p.read_text()), str(p))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            return None  # unreadable record: the unit is redone

    # -- a conversion by ranks (autotune_converters.ranks) -----------------------------------------

    def read_dist(self) -> dict[str, Any] | None:
        """dist.json as rank 0 published it (None: none, or not readable yet)."""
        try:
            d = json.loads(self.dist.read_text())
        except (OSError, ValueError):
            return None  # missing, or half-visible on a network filesystem: read again
        return d if isinstance(d, dict) and d.get("version") == DIST_VERSION else None

    def running_ranks(self) -> dict[int, str]:
        """Ranks whose process holds its lock now: rank -> holder."""
        out: dict[int, str] = {}
        base = self.path / "ranks"
        if not base.is_dir():
            return out
        for d in base.iterdir():
            if d.name.isdigit():
                holder = PidLock(d / "lock", lambda h: ConvertError(h)).held_elsewhere()
                if holder is not None:
                    out[int(d.name)] = holder
        return out

    def refuse_while_ranks_run(self) -> None:
        """A conversion without ranks into a DST that ranks are converting: refused while any
        of them runs; once they are all gone it may finish their job (same units)."""
        busy = self.running_ranks()
        if busy:
            r, holder = sorted(busy.items())[0]
            d = self.read_dist() or {}
            raise UsageError(
                f"{self.dst}: being converted by {d.get('world_size', '?')} ranks (rank {r}: "
                f"{holder}); wait for them and run `autotune convert --finalize`, or run the "
                "missing ranks; a conversion without ranks can take over once none runs.")

    def remove_stale(self) -> bool:
        """Remove a work folder a finished or killed run left behind: only a directory (not
        a link) of this user whose lock, and every rank's, is free; the lock is held while
        it goes. True if removed."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return False
        if not S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or self.running_ranks():
            return False
        lock = PidLock(self.path / "lock", lambda holder: ConvertError(holder))
        try:
            lock.acquire()
        except (ConvertError, UsageError, OSError):
            return False  # held by a live run, or not a lock of ours: left alone
        try:
            shutil.rmtree(self.path, ignore_errors=True)
        finally:
            lock.release()
        return True

    def remove(self) -> None:
        self.unlock()
        shutil.rmtree(self.path, ignore_errors=True)
