"""Ending a measurement process and everything it started, and proving nothing is left.

The child runs in its own session, so its process group holds the DataLoader workers
too. When the child dies first (a crash, or our kill), its workers are orphaned; they
would be re-parented to init, and where init does not reap (a bare container) they stay
zombies for ever. While a bench runs, this process is therefore a child subreaper
(prctl PR_SET_CHILD_SUBREAPER): orphans of the measurement come to us and are reaped by
pid, never with a wildcard wait that could steal another subprocess's status.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import threading
import time
from dataclasses import dataclass, field

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
_lock = threading.Lock()
_users = 0
_was_subreaper = False


def _prctl(option: int, arg: int | ctypes.c_int | ctypes._Pointer) -> int:  # type: ignore[type-arg]
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(option, arg, 0, 0, 0)


def acquire_subreaper() -> None:
    """Become a child subreaper (reference-counted across concurrent benches)."""
    global _users, _was_subreaper
    with _lock:
        if _users == 0:
            try:
                cur = ctypes.c_int(0)
                _prctl(_PR_GET_CHILD_SUBREAPER, ctypes.pointer(cur))
                _was_subreaper = bool(cur.value)
                _prctl(_PR_SET_CHILD_SUBREAPER, 1)
            except (OSError, AttributeError):
                pass
        _users += 1


def release_subreaper() -> None:
    """Undo acquire_subreaper() once the last bench is done."""
    global _users
    with _lock:
        _users = max(0, _users - 1)
        if _users == 0 and not _was_subreaper:
            try:
                _prctl(_PR_SET_CHILD_SUBREAPER, 0)
            except (OSError, AttributeError):
                pass


@dataclass(frozen=True)
class Member:
    pid: int
    ppid: int
    state: str   # /proc/PID/stat state: R, S, D, T, Z, ...


def stat_fields(pid: int | str = "self") -> list[bytes] | None:
    """/proc/PID/stat's fields after the command name (index 0 is field 3, the state),
    or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2:].split()


def child_env(env: dict[str, str]) -> dict[str, str]:
    """`env` for a measurement process: the folder holding this autotune first on
    PYTHONPATH (the checkout or site dir), so it imports the same code as its parent."""
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[2])
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [repo, env.get("PYTHONPATH")]))}


def group_members(pgid: int) -> list[Member]:
    """Processes whose process group is `pgid` (one pass over /proc)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        rest = stat_fields(name)
        try:
            state, ppid, pgrp = rest[0].decode(), int(rest[1]), int(rest[2])  # type: ignore[index]
        except (TypeError, IndexError, ValueError):
            continue
        if pgrp == pgid:
            out.append(Member(int(name), ppid, state))
    return out


@dataclass
class Cleanup:
    """What ending the group took: pids killed, reaped, and any left alive."""

    killed: list[int] = field(default_factory=list)
    reaped: list[int] = field(default_factory=list)
    stray: list[int] = field(default_factory=list)       # still running after the grace
    zombies: list[int] = field(default_factory=list)     # dead, not ours to reap
    seen: set[int] = field(default_factory=set)         # every member met, zombies too

    def to_dict(self) -> dict:
        return {"killed": self.killed, "reaped": self.reaped, "stray": self.stray,
                "zombies": self.zombies}


def end_group(pgid: int, grace_s: float = 5.0, *, leader: int | None = None) -> Cleanup:
    """SIGKILL every live process of group `pgid`, reap those that are our children,
    and wait up to `grace_s` for the rest to vanish. Anything still running is `stray`.

    `leader` (the measurement process, a subprocess.Popen) is killed but never reaped
    here: Popen.wait() must collect its exit status.
    """
    me = os.getpid()
    res = Cleanup()
    deadline = time.monotonic() + grace_s
    while True:
        members = group_members(pgid)
        res.seen.update(m.pid for m in members)
        live = [m for m in members if m.state != "Z"]
        for m in live:
            try:
                os.kill(m.pid, signal.SIGKILL)
                if m.pid not in res.killed:
                    res.killed.append(m.pid)
            except ProcessLookupError:
                pass
        ours = [m for m in members if m.ppid == me and m.pid != leader]
        for m in ours:
            try:
                if os.waitpid(m.pid, os.WNOHANG)[0] == m.pid:
                    res.reaped.append(m.pid)
            except ChildProcessError:
                pass
        if (not live and not ours) or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    members = [m for m in group_members(pgid) if m.pid != leader]
    res.stray = [m.pid for m in members if m.state != "Z"]
    res.zombies = [m.pid for m in members if m.state == "Z"]
    return res


def write_status(fd: int, line: str) -> None:
    """One line to the parent's status pipe (the writing end of a StatusPipe)."""
    try:
        os.write(fd, (line + "\n").encode())
    except OSError:
        pass  # the parent stopped listening; the result file still tells


class StatusPipe:
    """Line reader for a measurement process's status pipe (non-blocking, with a timeout)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = b""
        self.eof = False

    def read(self, timeout: float) -> list[str]:
        if self.eof:
            time.sleep(min(timeout, 0.05))
            return []
        r, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        if r:
            data = os.read(self.fd, 4096)
            if not data:
                self.eof = True
            self.buf += data
        lines = self.buf.split(b"\n")
        self.buf = lines.pop()
        return [ln.decode(errors="replace") for ln in lines]


def oom_first() -> None:
    """Make this process, and the workers and ranks it starts (they inherit it), the kernel
    OOM killer's first choice (oom_score_adj 1000; raising it needs no privilege). In a
    container's memory cgroup the search or bench that started it was often the largest
    process and was killed instead: the whole search ended, exit 137, nothing said. A
    measurement killed is a failed trial, recorded with its reason."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
