"""Which processes of a job's tree run Python, their children, and the distributed
launchers among them (torchrun, `accelerate launch`, deepspeed), whose ranks are the
training processes (autotune.monitor.tasks)."""

from __future__ import annotations

import os
from collections.abc import Callable

from autotune.monitor.proctree import read_proc


def runs_python(pid: int) -> bool:
    """Whether `pid` runs a Python interpreter (by argv[0], or its comm)."""
    data = read_proc(f"/proc/{pid}/cmdline", 512)
    if not data:
        return False
    argv0 = os.path.basename(data.split(b"\0", 1)[0])
    comm = (read_proc(f"/proc/{pid}/comm", 64) or b"").strip()
    return argv0.startswith(b"python") or comm.startswith(b"python")


# A distributed launcher runs no training itself: its ranks are the training processes.
LAUNCHERS = (b"torchrun", b"torch.distributed.run", b"torch.distributed.launch", b"accelerate",
             b"accelerate.commands.launch", b"deepspeed", b"deepspeed.launcher.launch",
             b"deepspeed.launcher.runner")


def is_launcher(pid: int) -> bool:
    """Whether `pid` runs a distributed launcher (LAUNCHERS: `torchrun`, `python -m
    torch.distributed.run`, `accelerate launch`, `deepspeed`)."""
    argv = (read_proc(f"/proc/{pid}/cmdline", 4096) or b"").split(b"\0")
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


def ranks_of(main: int, own: Callable[[int], bool]) -> tuple[set[int], set[int]]:
    """(the ranks, the launchers) where `main` is a distributed launcher: the Python
    processes below it, through launchers that start launchers (deepspeed's runner), but
    `own(pid)` (autotune's helpers); two empty sets otherwise, or while it has no rank."""
    ranks: set[int] = set()
    launchers: set[int] = set()
    todo = [main] if is_launcher(main) else []
    while todo:
        pid = todo.pop()
        if pid == main or is_launcher(pid):
            launchers.add(pid)
            todo.extend(children(pid))
        elif runs_python(pid) and not own(pid):
            ranks.add(pid)
    return (ranks, launchers) if ranks else (set(), set())


__all__ = ["LAUNCHERS", "children", "is_launcher", "ranks_of", "runs_python"]
