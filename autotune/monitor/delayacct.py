"""`--delayacct`: switch per-task delay accounting on for a run, and back after, safely
beside other autotune runs.

kernel.task_delayacct (5.14+) gates the blkio delay of every task (/proc/PID/stat field
42): while it is 1, the time a task sits blocked on I/O is counted exactly, the one figure
task-state sampling can only estimate. Runs share the switch through holder files in
RUN_DIR (/run/autotune-delayacct):

    RUN_DIR/.lock           flock'd (exclusive) while a holder joins or leaves
    RUN_DIR/previous        "VALUE SINCE": the value to restore, the boottime it was set on
    RUN_DIR/holder-PID-N    one per live holder, flock'd (shared) for the holder's life

The first holder in records the previous value and switches on; the last one out restores
it. A holder that died leaves its file unlocked: it is not counted (so a crash never pins
the switch on for ever, nor switches it off under a live run).

Where the switch cannot be set (not root, a read-only /proc/sys, a kernel before 5.14) the
option cannot be honoured here: a UsageError (exit 2, as the exit-status tables say), raised
before the run starts.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
from pathlib import Path

from autotune.errors import UsageError
from autotune.monitor.tasks import DELAYACCT_SYSCTL, boottime

RUN_DIR = "/run/autotune-delayacct"
_seq = itertools.count()


class DelayacctHold:
    """Context manager: delay accounting on from enter to exit (see the module docstring).

    `since` is the boottime from which it counts for every process (None: it was on before
    any autotune run took hold, so for all processes alike).
    """

    def __init__(self, run_dir: str = RUN_DIR, sysctl: str = DELAYACCT_SYSCTL) -> None:
        self.dir = Path(run_dir)
        self.sysctl = sysctl
        self.since: float | None = None
        self._fd = -1
        self._path: Path | None = None

    def __enter__(self) -> DelayacctHold:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        """Join the holders, switching delay accounting on when the first."""
        if os.geteuid() != 0 and self.sysctl == DELAYACCT_SYSCTL:
            raise UsageError("--delayacct needs root (it writes kernel.task_delayacct); run "
                             "as root, or without it: I/O is then sampled from task states")
        if not os.path.exists(self.sysctl):
            raise UsageError(f"--delayacct: {self.sysctl}: no such file (a kernel before 5.14 "
                             "has no delay-accounting switch); run without --delayacct")
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except PermissionError:
            raise UsageError(f"--delayacct needs root (cannot create {self.dir}); run as "
                             "root or without --delayacct") from None
        with self._locked():
            prev = self._previous()
            if not self._live_holders() or prev is None:
                cur = self._read_sysctl()
                if prev is None:   # nobody holds it: what is there now is the user's value
                    since = None if cur == "1" else boottime()
                    prev = (cur, since)
                    (self.dir / "previous").write_text(f"{cur} {since or 0}\n")
                if cur != "1":
                    self._write_sysctl("1")
            self.since = prev[1]
            self._path = self.dir / f"holder-{os.getpid()}-{next(_seq)}"
            self._fd = os.open(self._path, os.O_CREAT | os.O_RDWR, 0o644)
            fcntl.flock(self._fd, fcntl.LOCK_SH)

    def release(self) -> None:
        """Leave; the last holder out restores the previous value."""
        if self._fd < 0:
            return
        with self._locked():
            os.close(self._fd)
            self._fd = -1
            if self._path is not None:
                self._path.unlink(missing_ok=True)
            if not self._live_holders():
                prev = self._previous()
                if prev is not None and prev[0] != self._read_sysctl():
                    self._write_sysctl(prev[0])
                (self.dir / "previous").unlink(missing_ok=True)

    # --- helpers ----------------------------------------------------------------------
    def _locked(self) -> _Flock:
        return _Flock(self.dir / ".lock")

    def _live_holders(self) -> int:
        n = 0
        for p in self.dir.glob("holder-*"):
            try:
                fd = os.open(p, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                n += 1          # someone holds it shared: a live run
            else:
                p.unlink(missing_ok=True)   # its holder died
            finally:
                os.close(fd)
        return n

    def _previous(self) -> tuple[str, float | None] | None:
        try:
            value, since = (self.dir / "previous").read_text().split()
        except (FileNotFoundError, ValueError):
            return None
        return value, (float(since) or None)

    def _read_sysctl(self) -> str:
        return Path(self.sysctl).read_text().strip()

    def _write_sysctl(self, value: str) -> None:
        try:
            Path(self.sysctl).write_text(value + "\n")
        except PermissionError:
            raise UsageError(f"--delayacct needs root (cannot write {self.sysctl}); run as "
                             "root or without --delayacct") from None
        except OSError as e:
            raise UsageError(f"--delayacct: cannot write {self.sysctl}: {e.strerror} (a "
                             "read-only /proc/sys: a container's); run without --delayacct, "
                             "or where /proc/sys is writable") from None


def hold_if(on: bool) -> contextlib.AbstractContextManager[DelayacctHold | None]:
    """A DelayacctHold when `on` (the CLI's --delayacct), else a context that does nothing."""
    return DelayacctHold() if on else contextlib.nullcontext()


class _Flock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> _Flock:
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


__all__ = ["RUN_DIR", "DelayacctHold", "hold_if"]
