"""Run-queue wait of a process tree: is it waiting for a CPU, or for something else?

A loader process that shows 25 % CPU may be waiting for reads (storage) or for a CPU that
other processes hold (contention): CPU % alone cannot tell. The scheduler can: each task's
/proc/PID/task/TID/schedstat holds the nanoseconds it ran and the nanoseconds it sat
runnable on a run queue. Their sum over an interval is the CPU the tree *wanted*; a task
that sleeps (on I/O, on a queue) adds to neither. `autotune monitor` adds these figures
to each metrics line as "sched" (see autotune.monitor.run).

Also the machine's run queue (procs_running in /proc/stat), the "r" column of vmstat, and
the CPUs the job may run on (its affinity), so that a job pinned to 2 of 64 cores is
judged on those 2.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from autotune.monitor.proctree import read_proc


def _read(path: str) -> bytes | None:
    return read_proc(path, 65536)  # children lists and status can exceed a page


def descendants(root: int) -> list[int]:
    """root and every process below it, from /proc/PID/task/TID/children (no /proc scan)."""
    out: list[int] = []
    todo = [root]
    seen: set[int] = set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        out.append(pid)
        for tid in tids:
            data = _read(f"/proc/{pid}/task/{tid}/children")
            if data:
                todo.extend(int(x) for x in data.split())
    return out


def allowed_cpus(pid: int) -> list[int] | None:
    """The CPUs `pid` may run on (its affinity: taskset, cpuset, Slurm), from
    /proc/PID/status Cpus_allowed_list ("0-3,8-11")."""
    data = _read(f"/proc/{pid}/status")
    if not data:
        return None
    i = data.find(b"Cpus_allowed_list:")
    if i < 0:
        return None
    out: list[int] = []
    try:
        for part in data[i + 18:data.index(b"\n", i)].decode().strip().split(","):
            a, _, b = part.partition("-")
            out.extend(range(int(a), int(b or a) + 1))
    except ValueError:
        return None
    return out or None


def procs_running() -> int | None:
    """Tasks runnable right now on the whole machine (vmstat's r)."""
    data = _read("/proc/stat")
    if not data:
        return None
    i = data.find(b"procs_running ")
    if i < 0:
        return None
    try:
        return int(data[i + 14:data.index(b"\n", i)])
    except ValueError:
        return None


@dataclass(frozen=True)
class SchedUsage:
    """One interval of a tree, in % of one core (250 = 2.5 cores' worth)."""

    tasks: int
    on_cpu_pct: float       # ran on a CPU
    run_wait_pct: float     # runnable, waiting for a CPU
    procs_running: int | None
    cpus: list[int] | None = None   # the root process's allowed CPUs

    @property
    def wanted_pct(self) -> float:
        """CPU the tree wanted: ran plus waited to run."""
        return self.on_cpu_pct + self.run_wait_pct

    def to_dict(self) -> dict[str, Any]:
        return {"available": True, "tasks": self.tasks, "on_cpu_pct": self.on_cpu_pct,
                "run_wait_pct": self.run_wait_pct, "wanted_pct": self.wanted_pct,
                "procs_running": self.procs_running, "cpus": self.cpus}


def thread_schedstats(root_pid: int) -> dict[tuple[int, int], tuple[int, int]]:
    """{(pid, tid): (ns on a CPU, ns waiting on a run queue)} of every thread of `root_pid`
    and its descendants, so far; threads that cannot be read are left out."""
    cur: dict[tuple[int, int], tuple[int, int]] = {}
    for pid in descendants(root_pid):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            data = _read(f"/proc/{pid}/task/{tid}/schedstat")
            if not data:
                continue
            parts = data.split()
            try:
                cur[(pid, int(tid))] = (int(parts[0]), int(parts[1]))
            except (IndexError, ValueError):
                continue
    return cur


class RunQueueSampler:
    """Per-interval on-CPU and run-queue time of a process tree, threads included."""

    def __init__(self, root_pid: int) -> None:
        self.root_pid = root_pid
        self._last: dict[tuple[int, int], tuple[int, int]] = {}
        self._last_t: float | None = None

    def sample(self, now_mono: float) -> SchedUsage | None:
        """None for the first call (the baseline) and when nothing can be read."""
        cur = thread_schedstats(self.root_pid)
        last, last_t = self._last, self._last_t
        self._last, self._last_t = cur, now_mono
        if last_t is None or not cur or now_mono <= last_t:
            return None
        ran = waited = 0
        for key, (r, w) in cur.items():
            r0, w0 = last.get(key, (0, 0))   # a task born in the interval: all of it counts
            ran += max(0, r - r0)
            waited += max(0, w - w0)
        dt_ns = (now_mono - last_t) * 1e9
        return SchedUsage(tasks=len(cur), on_cpu_pct=ran / dt_ns * 100.0,
                          run_wait_pct=waited / dt_ns * 100.0, procs_running=procs_running(),
                          cpus=allowed_cpus(self.root_pid))
