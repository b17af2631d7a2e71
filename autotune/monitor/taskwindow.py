"""One window of the task sampler (autotune.monitor.tasks): each thread's open files and
its figures since the window's start, the window's sweep counts, and the TimeBudget summed
from them per class (main, workers), with the notes that say what could not be seen."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from autotune.monitor.timebudget import WCHAN_NOTE, ClassBudget, TimeBudget

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class _Thread:
    """One thread's open files and its figures since the window's start."""

    pid: int
    tid: int
    worker: bool
    fd_sched: int
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
    implausible = 0
    for t in threads:
        if t.alive_s <= 0 and t.last == t.base:
            continue
        name = "workers" if t.worker else "main"
        c = classes[name]
        c.threads += 1
        pids[name].add(t.pid)
        procs[t.pid] = max(procs.get(t.pid, 0.0), t.alive_s)
        on_cpu = max(0, t.last[0] - t.base[0]) / 1e9
        runnable = max(0, t.last[1] - t.base[1]) / 1e9
        if da and not t.pre_switch:
            io = max(0, t.last[2] - t.base[2]) / CLK_TCK
            if io > t.alive_s + 2.0 / CLK_TCK:
                # Blocked longer than it was alive in the window: a count that is not
                # this window's (seen once behind a cap: 210x the window). The sampled
                # state is the figure then, and the budget says so.
                io = t.d_s
                implausible += 1
        else:
            io = t.d_s
            if t.pre_switch:
                pre.add(t.pid)
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
    if implausible:
        b.notes.append(f"{implausible} thread(s)' delay-accounting I/O exceeded their time "
                       "alive in the window: their I/O is sampled from task states")
    if delayacct and not da:
        b.notes.append("kernel.task_delayacct was switched off during the run: I/O is "
                       "sampled from task states")
    return b

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
