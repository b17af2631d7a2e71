"""Which processes of a job's tree run Python, their children, autotune's own helpers
among them, and the distributed launchers (torchrun, `accelerate launch`, deepspeed),
whose ranks are the training processes (autotune.monitor.tasks)."""

from __future__ import annotations

import os
from autotune.monitor.proctree import read_proc


def _argv(pid: int) -> list[bytes]:
    return (read_proc(f"/proc/{pid}/cmdline", 4096) or b"").split(b"\0")


def runs_python(pid: int, argv: list[bytes] | None = None) -> bool:
    """Whether `pid` runs a Python interpreter (by argv[0], or its comm); `argv`: its
    command line, where the caller has read it."""
    argv = _argv(pid) if argv is None else argv
    if not argv[0]:
        return False
    comm = (read_proc(f"/proc/{pid}/comm", 64) or b"").strip()
    return os.path.basename(argv[0]).startswith(b"python") or comm.startswith(b"python")


OWN_MODULES = (b"autotune.monitor.burst",)   # `python -m` helpers of autotune's in a job


def autotunes_own(pid: int, argv: list[bytes] | None = None) -> bool:
    """Whether `pid` runs one of autotune's own helpers (OWN_MODULES), not the job's code."""
    argv = _argv(pid) if argv is None else argv
    return len(argv) > 2 and argv[1] == b"-m" and argv[2] in OWN_MODULES


# A distributed launcher runs no training itself: its ranks are the training processes.
LAUNCHERS = (b"torchrun", b"torch.distributed.run", b"torch.distributed.launch", b"accelerate",
             b"accelerate.commands.launch", b"deepspeed", b"deepspeed.launcher.launch",
             b"deepspeed.launcher.runner")


def is_launcher(pid: int, argv: list[bytes] | None = None) -> bool:
    """Whether `pid` runs a distributed launcher (LAUNCHERS: `torchrun`, `python -m
    torch.distributed.run`, `accelerate launch`, `deepspeed`)."""
    argv = _argv(pid) if argv is None else argv
    if len(argv) > 2 and argv[1] == b"-m":
        return argv[2] in LAUNCHERS
    return len(argv) > 1 and os.path.basename(argv[1]) in LAUNCHERS


def children(pid: int) -> list[int]:
    """`pid`'s child processes, from every one of its threads' children list."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        data = read_proc(f"/proc/{pid}/task/{tid}/children", 65536)
        if data:
            out.extend(int(x) for x in data.split())
    return out


def ranks_of(main: int) -> tuple[set[int], set[int]]:
    """(the ranks, the launchers) where `main` is a distributed launcher: the Python
    processes below it, through launchers that start launchers (deepspeed's runner), but
    autotune's own helpers; two empty sets otherwise, or while it has no rank. Each
    process's command line is read once."""
    ranks: set[int] = set()
    launchers: set[int] = set()
    todo = [main] if is_launcher(main) else []
    while todo:
        pid = todo.pop()
        argv = _argv(pid)
        if pid == main or is_launcher(pid, argv):
            launchers.add(pid)
            todo.extend(children(pid))
        elif runs_python(pid, argv) and not autotunes_own(pid, argv):
            ranks.add(pid)
    return (ranks, launchers) if ranks else (set(), set())


__all__ = ["LAUNCHERS", "OWN_MODULES", "autotunes_own", "children", "is_launcher", "ranks_of",
           "runs_python"]
