"""One window of the task sampler (autotune.monitor.tasks): each thread's open files and
its figures since the window's start, the window's sweep counts, and the TimeBudget summed
from them per class (main, workers), with the notes that say what could not be seen.

A job may hold two DataLoaders' workers at once: a validation loader with
`persistent_workers=True` keeps its workers, asleep on their index queues, through every
training epoch (and the training loader's sleep through validation). Counted with the
loader at work they halve its shares: a decode-bound job read "the 4 workers are idle
50 %", the main process blamed. So a worker process that did nothing in a window (under
PARKED_SHARE of its time on a CPU, runnable, blocked, waiting on storage or asleep in a
timer, which is a wait inside a worker's own work) while other workers worked
(ACTIVE_SHARE or more) is left out of that window's figures, and said, when it is
another loader's: one loop forks a loader's workers together, so workers of one parent
whose starts lie more than GROUP_GAP_S apart are two loaders', and so are those more than
GROUP_SHORT_GAP_S apart where that is GROUP_RATIO times the parent's usual gap between
forks (Lightning's sanity check starts the training loader a few tenths of a second after
the validation loader, each loader's forks a few hundredths apart); or when it has done
nothing for PARKED_S (loaders of one worker each started back to back, whose forks give
no usual gap to compare with: a loader's own workers take turns, and each is given work
far more often than that). A loader whose workers all wait (the main process is the
bottleneck) leaves no worker at work: nothing is left out then.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from autotune.monitor.timebudget import WCHAN_NOTE, ClassBudget, TimeBudget

CLK_TCK = os.sysconf("SC_CLK_TCK")
GROUP_GAP_S = 1.0        # forks of one loader's workers further apart than this: two loaders
GROUP_SHORT_GAP_S = 0.1  # ... or further apart than this and GROUP_RATIO x the parent's
GROUP_RATIO = 8.0        # usual gap between forks (Lightning's sanity check: 0.25-0.36 s, 0.02 s)
PARKED_SHARE = 0.01      # a group busy less than this share of its time did nothing ...
ACTIVE_SHARE = 0.05      # ... while a group busy this share or more worked
PARKED_S = 30.0          # a worker that did nothing this long while others of its group worked
PARKED_NOTE = ("processes of the job that did nothing while its other workers worked (a "
               "validation loader's kept workers, persistent_workers; a logger's helper) are "
               "left out of those windows' figures")


@dataclass
class _Thread:
    """One thread's open files and its figures since the window's start."""

    pid: int
    tid: int
    worker: bool
    fd_sched: int
    ppid: int = 0
    start_s: float = 0.0                        # the thread's start, boottime s
    idle_since: float | None = None             # its process has done nothing since (boottime)
    fd_stat: int = -1
    fd_wchan: int = -1
    base: tuple[int, int, int] = (0, 0, 0)      # run ns, wait ns, blkio ticks at window start
    last: tuple[int, int, int] = (0, 0, 0)      # the latest read
    pcount: int = -1
    raw: bytes = b""                            # schedstat's bytes at the last read
    quiet: int = 0                              # sweeps in a row it has not run
    skip: int = 0                               # sweeps left before it is read again
    state: bytes = b"S"
    storage: str | None = None
    alive_s: float = 0.0                        # wall time seen in this window
    d_s: float = 0.0                            # sampled time in D, not a storage wait
    s_storage_s: float = 0.0                    # sampled time in S or D on a storage wait
    timer: bool = False                         # asleep in a timer (nanosleep) at the last read
    s_timer_s: float = 0.0                      # sampled time asleep in a timer
    pre_switch: bool = False                    # born before delay accounting was switched on
    gone: bool = False

    def charge(self, dt: float) -> None:
        """Count `dt` seconds of wall time to the state seen at the last read."""
        self.alive_s += dt
        if self.storage:
            self.s_storage_s += dt
        elif self.state == b"D":
            self.d_s += dt
        elif self.timer:
            self.s_timer_s += dt

    def close(self) -> None:
        # Without schedstat, fd_sched is the stat file's fd: close it once.
        for fd in {self.fd_sched, self.fd_stat, self.fd_wchan}:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.fd_sched = self.fd_stat = self.fd_wchan = -1


@dataclass
class _Window:
    started: float                       # boottime of the window's first sweep
    sweeps: int = 0
    wchan_zero: int = 0                  # S reads whose wchan was "0" / empty
    wchan_named: int = 0


def window_budget(threads: Iterable[_Thread], win: _Window, wall: float, *, delayacct: bool,
                  da: bool, schedstat: bool) -> TimeBudget:
    """The budget of one window of `wall` seconds from each thread's figures since its
    start. `delayacct`: the sampler uses delay accounting; `da`: it still counts at the
    window's end (read by the sampler); `schedstat`: /proc/PID/task/TID/schedstat exists."""
    classes = {"main": ClassBudget(), "workers": ClassBudget()}
    procs: dict[int, float] = {}
    pids: dict[str, set[int]] = {"main": set(), "workers": set()}
    pre: set[int] = set()
    seen = [(t, *_figures(t, da, pre)) for t in threads
            if t.alive_s > 0 or t.last != t.base]
    parked = _parked(seen, win.started + wall)
    for t, on_cpu, runnable, io, _ in seen:
        if t.pid in parked:
            continue
        name = "workers" if t.worker else "main"
        c = classes[name]
        c.threads += 1
        pids[name].add(t.pid)
        procs[t.pid] = max(procs.get(t.pid, 0.0), t.alive_s)
        secs = c.seconds
        secs["on_cpu"] += on_cpu
        secs["runnable"] += runnable
        secs["io"] += io
        secs["storage_wait"] += t.s_storage_s
        asleep = max(0.0, t.alive_s - on_cpu - runnable - io - t.s_storage_s)
        secs["asleep"] += asleep
        c.timer_s += min(asleep, t.s_timer_s)
    for name, c in classes.items():
        c.processes = len(pids[name])
        c.process_seconds = sum(procs[p] for p in pids[name])
    b = TimeBudget(wall_s=wall, classes=classes,
                   io_source="delayacct" if da and not pre else "state-sampling",
                   samples=win.sweeps, hz=win.sweeps / wall if wall > 0 else 0.0)
    b.notes.extend(_notes(win, pre, schedstat))
    b.wchan_named = win.wchan_named
    if parked:
        b.parked = len(parked)
        b.notes.append(PARKED_NOTE)
    implausible = sum(1 for *_, odd in seen if odd)
    if implausible:
        b.notes.append(f"{implausible} thread(s)' delay-accounting I/O exceeded their time "
                       "alive in the window: their I/O is sampled from task states")
    if delayacct and not da:
        b.notes.append("kernel.task_delayacct was switched off during the run: I/O is "
                       "sampled from task states")
    return b


def _figures(t: _Thread, da: bool, pre: set[int]) -> tuple[float, float, float, bool]:
    """The thread's on-CPU, runnable and I/O seconds in the window, and whether delay
    accounting's I/O was implausible; `pre` gathers the processes born before delay
    accounting was switched on."""
    on_cpu = max(0, t.last[0] - t.base[0]) / 1e9
    runnable = max(0, t.last[1] - t.base[1]) / 1e9
    if da and not t.pre_switch:
        io = max(0, t.last[2] - t.base[2]) / CLK_TCK
        if io > t.alive_s + 2.0 / CLK_TCK:
            # Blocked longer than it was alive in the window: a count that is not this
            # window's (seen once behind a cap: 210x the window). The sampled state is the
            # figure then, and the budget says so.
            return on_cpu, runnable, t.d_s, True
    else:
        io = t.d_s
        if t.pre_switch:
            pre.add(t.pid)
    return on_cpu, runnable, io, False


def _parked(seen: list[tuple[_Thread, float, float, float, bool]], end: float) -> set[int]:
    """The worker processes of a loader that did nothing in the window, ending at `end`,
    while other workers worked (see the module doc). Updates each thread's `idle_since`."""
    busy: dict[int, float] = {}
    alive: dict[int, float] = {}
    start: dict[int, tuple[int, float]] = {}
    for t, on_cpu, runnable, io, _ in seen:
        if t.worker:
            busy[t.pid] = (busy.get(t.pid, 0.0) + on_cpu + runnable + io + t.s_storage_s
                           + t.s_timer_s)
            alive[t.pid] = max(alive.get(t.pid, 0.0), t.alive_s)
            # The process's start is its first thread's: a worker's other threads start
            # with its first batch (a queue's feeder), a batch later in the training
            # loader's workers than in the validation loader's, and blurred the gap.
            start[t.pid] = (t.ppid, min(t.start_s, start.get(t.pid, (0, t.start_s))[1]))
    share = {p: busy[p] / max(1e-9, alive[p]) for p in busy}
    since: dict[int, float] = {}
    for t, *_ in seen:
        if t.worker:
            if share[t.pid] >= PARKED_SHARE:
                t.idle_since = None
            elif t.idle_since is None:
                t.idle_since = max(end - t.alive_s, t.start_s)
            since[t.pid] = t.idle_since if t.idle_since is not None else end
    group = _groups(start)
    at_work = {group[p] for p, s in share.items() if s >= ACTIVE_SHARE}
    if not at_work:
        return set()
    return {p for p, s in share.items()
            if s < PARKED_SHARE and (group[p] not in at_work or end - since[p] >= PARKED_S)}


def _groups(start: dict[int, tuple[int, float]]) -> dict[int, int]:
    """Each worker's loader, a number, from its (parent, start): one loop forks a loader's
    workers back to back, so a gap far longer than the parent's usual gap between forks
    starts another loader. An absolute gap alone missed Lightning's sanity check, which
    starts the training loader 0.34 s after the validation loader (its forks 0.02 s apart):
    the validation workers, counted, halved the decode-bound workers' shares (2 of 2 runs)."""
    gaps: dict[int, list[float]] = {}
    order = sorted(start, key=lambda p: start[p])
    for a, b in zip(order, order[1:]):
        if start[a][0] == start[b][0]:
            gaps.setdefault(start[a][0], []).append(start[b][1] - start[a][1])
    # The lower median: with two loaders of two workers, half the gaps are the long one.
    usual = {k: sorted(v)[(len(v) - 1) // 2] for k, v in gaps.items()}
    group: dict[int, int] = {}
    prev: tuple[int, float] | None = None
    gid = -1
    for pid in order:
        gap = start[pid][1] - prev[1] if prev is not None else 0.0
        if (prev is None or start[pid][0] != prev[0] or gap > GROUP_GAP_S
                or (gap > GROUP_SHORT_GAP_S and gap > GROUP_RATIO * usual[prev[0]])):
            gid += 1
        group[pid] = gid
        prev = start[pid]
    return group


def _notes(win: _Window, pre: set[int], schedstat: bool) -> list[str]:
    out: list[str] = []
    if not schedstat:
        out.append("no /proc/PID/task/TID/schedstat on this kernel: on CPU from stat's "
                   "utime+stime (10 ms ticks), runnable not seen")
    if pre:
        out.append(f"process(es) {', '.join(map(str, sorted(pre)))} started before delay "
                   "accounting was switched on (they read 0): their I/O is sampled")
    if win.wchan_zero and not win.wchan_named:
        out.append(WCHAN_NOTE)
    return out
