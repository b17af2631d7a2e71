"""Which processes of a job's tree run Python, their children, autotune's own helpers
and multiprocessing's among them, and the ranks of a distributed job, which are its
training processes (autotune.monitor.tasks): those of a launcher (torchrun, `accelerate
launch`, deepspeed), those torch.multiprocessing.spawn starts, and those a training
script starts by running itself again (Lightning's DDP)."""

from __future__ import annotations

import json
import os
import socket

from autotune.monitor.proctree import read_proc, read_proc_stat


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


# multiprocessing's own processes (`python -c "from multiprocessing.X import main; ..."`):
# they serve the job's processes and run none of its code.
MP_HELPERS = (b"multiprocessing.resource_tracker", b"multiprocessing.forkserver")


def multiprocessings_own(argv: list[bytes]) -> bool:
    """Whether a command line (`argv`) is multiprocessing's resource tracker or forkserver
    (`python [flags such as -B] -c CODE`)."""
    return any(h in _code(argv) for h in MP_HELPERS)


def _code(argv: list[bytes]) -> bytes:
    # `python [flags] -c CODE ...`: CODE, else b"".
    return argv[argv.index(b"-c") + 1] if b"-c" in argv[:-1] else b""


def helper(pid: int) -> bool:
    """Whether `pid` is autotune's own helper or multiprocessing's (its resource tracker, its
    forkserver): in the job's tree, but none of the job's workers. The forkserver's
    children (DataLoader workers with the forkserver context, Python 3.14's default) are
    forked without an exec: they keep its command line, and are the job's."""
    argv = _argv(pid)
    if autotunes_own(pid, argv):
        return True
    if not multiprocessings_own(argv):
        return False
    st = read_proc_stat(pid)
    return st is not None and _argv(st.ppid) != argv


def _spawned(argv: list[bytes]) -> bool:
    # `python -c "from multiprocessing.spawn import spawn_main; ..." --multiprocessing-fork`
    return b"--multiprocessing-fork" in argv


def local_rank(pid: int) -> bytes | None:
    """$LOCAL_RANK in `pid`'s environment as it was started (None: unset or unreadable).
    Only that variable is looked for; nothing else of the environment is kept."""
    env = read_proc(f"/proc/{pid}/environ", 1 << 20) or b""
    for var in env.split(b"\0"):
        if var.startswith(b"LOCAL_RANK="):
            return var[len(b"LOCAL_RANK="):]
    return None


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


def _job_children(pid: int, forkserver: bool = False) -> dict[int, list[bytes]]:
    """`pid`'s children that run the job's Python (not autotune's or multiprocessing's own
    helpers, but a forkserver where `forkserver`), with their command lines, each read
    once."""
    out = {}
    for kid in children(pid):
        argv = _argv(kid)
        if runs_python(kid, argv) and not autotunes_own(kid, argv) and (
                not multiprocessings_own(argv)
                or forkserver and b"multiprocessing.forkserver" in _code(argv)):
            out[kid] = argv
    return out


def _starts_workers(pid: int) -> bool:
    """Whether `pid` has started processes of the job's: Python children, or a forkserver
    (a DataLoader's forkserver context, Python 3.14's default, forks its workers from
    one); a DataLoader worker starts none."""
    return bool(_job_children(pid, forkserver=True))


def _launchers_ranks(main: int) -> tuple[set[int], set[int]]:
    ranks: set[int] = set()
    launchers: set[int] = set()
    todo = [main]
    while todo:
        pid = todo.pop()
        argv = _argv(pid)
        if pid == main or is_launcher(pid, argv):
            launchers.add(pid)
            todo.extend(children(pid))
        elif runs_python(pid, argv) and not autotunes_own(pid, argv):
            ranks.add(pid)
    return ranks, launchers


def ranks_of(main: int, trainers: frozenset[int] = frozenset(),
             known: frozenset[int] = frozenset()) -> tuple[set[int], set[int]]:
    """(the ranks, the processes in neither class) of the job whose training process is
    `main`; two empty sets where it is not distributed, or while no rank is seen.
    `trainers`: the processes seen writing a step log (StepWriters), training for sure;
    `known`: the ranks found before (spawned ranks between epochs have no workers).

    - `main` a distributed launcher (LAUNCHERS): the Python processes below it, through
      launchers that start launchers (deepspeed's runner); the launchers in neither class;
    - `main` a training script that runs itself again per rank (Lightning's DDP): `main`
      (local rank 0) and its children started with a LOCAL_RANK of 1 or more, which
      `main` was not started with;
    - `main` a torch.multiprocessing.spawn: its spawned children once one of them has a
      Python child of its own (its DataLoader workers or their forkserver; a DataLoader
      worker starts none) or writes steps, and from then on; `main`, which only waits for
      them, in neither class unless it writes steps too. Ranks with no workers that write no step log are not told from
      spawned DataLoader workers: they stay counted as workers;
    - any child of `main` that writes steps.
    """
    if is_launcher(main):
        ranks, launchers = _launchers_ranks(main)
        return (ranks, launchers) if ranks else (set(), set())
    kids = _job_children(main)
    mine = local_rank(main)
    again = {k for k, argv in kids.items()
             if not _spawned(argv) and (lr := local_rank(k)) not in (None, mine)
             and lr.isdigit() and int(lr) > 0}
    spawned = {k for k, argv in kids.items() if _spawned(argv)}
    ranks = again | (kids.keys() & trainers)
    if spawned & (trainers | known) or any(_starts_workers(k) for k in spawned):
        ranks |= spawned
    if not ranks:
        return set(), set()
    if again or main in trainers:
        return ranks | {main}, set()
    return ranks, {main}


class StepWriters:
    """The processes of this host that have written a step log's header (autotune.instrument
    and the Lightning callback give their pid there): processes seen training. Read on from
    where the last call stopped, at most READ_CAP bytes a call; a line longer than
    LINE_CAP (a stranger's file) is passed over."""

    READ_CAP = 8 << 20
    LINE_CAP = 64 << 10

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._offset = 0
        self._tail = b""
        self._pids: set[int] = set()
        self._host = socket.gethostname()

    def __call__(self) -> frozenset[int]:
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < self._offset:           # truncated: a new run's log
                    self._offset, self._tail = 0, b""
                f.seek(self._offset)
                data = f.read(min(size - self._offset, self.READ_CAP))
        except OSError:
            return frozenset(self._pids)
        self._offset += len(data)
        *lines, self._tail = (self._tail + data).split(b"\n")
        if len(self._tail) > self.LINE_CAP:
            self._tail = b""
        for line in lines:
            if line.startswith(b'{"autotune": "steps"') and len(line) <= self.LINE_CAP:
                self._add(line)
        return frozenset(self._pids)

    def _add(self, line: bytes) -> None:
        try:
            head = json.loads(line)
        except (ValueError, RecursionError):   # a stranger's file: deeply nested
            return
        if not isinstance(head, dict):
            return
        pid = head.get("pid")
        if type(pid) is int and pid > 0 and head.get("host") in (None, self._host):
            self._pids.add(pid)


__all__ = ["LAUNCHERS", "MP_HELPERS", "OWN_MODULES", "autotunes_own", "children",
           "helper", "is_launcher", "local_rank", "multiprocessings_own", "ranks_of", "runs_python", "StepWriters"]
