"""The time budget of a job's processes: where each one's wall time went over a window.

Per process class (`main`: the training process; `workers`: every DataLoader worker and
other descendant), the thread-seconds each state took over the measured window:

    on_cpu        running on a CPU (schedstat's run time)
    runnable      runnable, waiting for a CPU on a run queue (schedstat's wait time)
    io            blocked on I/O: state D / in_iowait (delay accounting's blkio ticks
                  where it is on, else task-state sampling)
    storage_wait  asleep (S) in a wait that belongs to storage: a FUSE request, an NFS
                  RPC, a storage client's socket receive (from the thread's wchan)
    asleep        asleep otherwise: a queue, a lock, the training step; of it, the
                  class's `timer_s` was asleep in a timer (nanosleep: time.sleep, a
                  backoff), which in a worker is a wait inside its own work, not a wait for
                  work (that is a poll on its index queue)

`process_seconds` is the sum over the class's processes of the part of the window each
was alive (a process that exits mid-window is counted to its exit), so that
`share(state)` is the share of one process's wall time: a worker with one busy thread
that reads half the time shows io 0.5. With several threads a share may exceed 1
(two threads both on a CPU: on_cpu 2.0); `idle()` is what the non-idle states leave of
one thread's time.

This module holds the data and its arithmetic only; the sampler that fills it lives
beside it in the monitor, the verdict engine reads it (autotune.verdict.rules).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STATES = ("on_cpu", "runnable", "io", "storage_wait", "asleep")
CLASSES = ("main", "workers")
IO_SOURCES = ("delayacct", "state-sampling")
# Said by a window in which every S/D thread read "0" for its wchan. One such window (every
# thread on a CPU or just woken between the stat and the wchan read) does not make it true
# of the kernel: a window that read a named wchan shows the kernel gives them.
WCHAN_NOTE = ("wchan reads 0 on this kernel: storage waits in S (FUSE, NFS, sockets) "
              "cannot be seen")
LABELS = {"on_cpu": "on CPU", "runnable": "runnable", "io": "I/O",
          "storage_wait": "storage wait", "asleep": "asleep"}


@dataclass
class ClassBudget:
    """Thread-seconds per state of one process class over a window."""

    processes: int = 0                  # processes of the class seen in the window
    threads: int = 0                    # threads of the class seen in the window
    process_seconds: float = 0.0        # sum of each process's alive time in the window
    seconds: dict[str, float] = field(default_factory=lambda: {s: 0.0 for s in STATES})
    timer_s: float = 0.0                # of `asleep`, the thread-seconds asleep in a timer

    def at_once(self, wall_s: float) -> int:
        """How many of the class's processes were alive at once, on average over a window
        of `wall_s`. `processes` is the most seen in one sample: a DataLoader without
        persistent_workers starts its workers anew each epoch while the old ones are still
        exiting, so 2 workers read as 4 there."""
        if wall_s <= 0 or self.process_seconds <= 0:
            return self.processes
        return max(1, min(self.processes, round(self.process_seconds / wall_s)))

    def procs_text(self, wall_s: float) -> str:
        """"2 procs", or "2 procs at once, 4 seen" where processes came and went."""
        n = self.at_once(wall_s)
        if n == self.processes:
            return f"{n} proc{'s' if n != 1 else ''}"
        return f"{n} proc{'s' if n != 1 else ''} at once, {self.processes} seen"

    def timer(self) -> float:
        """Share asleep in a timer (nanosleep), per process-second: part of idle, and never
        more than it (several threads of a process can sleep at once; idle is one thread's)."""
        t = self.timer_s / self.process_seconds if self.process_seconds else 0.0
        return min(t, self.idle())

    def share(self, state: str) -> float:
        """Thread-seconds in `state` per process-second (0 when nothing was seen)."""
        if state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)}, but got {state!r}.")
        return self.seconds.get(state, 0.0) / self.process_seconds if self.process_seconds else 0.0

    def blocked(self) -> float:
        """Share blocked on storage: I/O (D) plus storage waits in S."""
        return self.share("io") + self.share("storage_wait")

    def idle(self) -> float:
        """What on_cpu, runnable and blocked leave of one thread's time (>= 0)."""
        return max(0.0, 1.0 - self.share("on_cpu") - self.share("runnable") - self.blocked())

    def display_shares(self) -> dict[str, float]:
        """The shares a person reads (a table line, a stacked bar): each state per
        process-second, asleep as what the others leave of one thread (`idle()`), so that a
        class of single-busy-thread processes sums to 100 %."""
        out = {s: self.share(s) for s in STATES if s != "asleep"}
        out["asleep"] = self.idle()
        return out

    def add(self, other: ClassBudget) -> None:
        """Accumulate another interval's budget of the same class (counts take the max)."""
        self.processes = max(self.processes, other.processes)
        self.threads = max(self.threads, other.threads)
        self.process_seconds += other.process_seconds
        for s in STATES:
            self.seconds[s] = self.seconds.get(s, 0.0) + other.seconds.get(s, 0.0)
        self.timer_s += other.timer_s

    def to_dict(self) -> dict[str, Any]:
        return {"processes": self.processes, "threads": self.threads,
                "process_seconds": self.process_seconds, "seconds": dict(self.seconds),
                "shares": {s: self.share(s) for s in STATES}, "timer_seconds": self.timer_s}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClassBudget:
        secs = {s: float((d.get("seconds") or {}).get(s, 0.0)) for s in STATES}
        return cls(processes=int(d.get("processes", 0)), threads=int(d.get("threads", 0)),
                   process_seconds=float(d.get("process_seconds", 0.0)), seconds=secs,
                   timer_s=float(d.get("timer_seconds", 0.0)))


@dataclass
class TimeBudget:
    """The budget of a window: one ClassBudget per class, and how it was measured."""

    wall_s: float = 0.0
    classes: dict[str, ClassBudget] = field(default_factory=dict)
    io_source: str = "state-sampling"   # one of IO_SOURCES
    samples: int = 0                    # task-state samples taken in the window
    hz: float = 0.0                     # the sampling rate achieved
    psi_io: dict[str, Any] | None = None    # {"scope": "cgroup"|"machine", "some_pct", "full_pct"}
    notes: list[str] = field(default_factory=list)   # what could not be seen, and why
    wchan_named: int = 0                # S/D reads whose wchan named a kernel function
    parked: int = 0                     # most workers of another, idle loader left out of
                                        # one window (autotune.monitor.taskwindow)

    def cls(self, name: str) -> ClassBudget | None:
        c = self.classes.get(name)
        return c if c is not None and c.process_seconds > 0 else None

    def cpus(self, *states: str) -> float:
        """The job's threads' seconds in `states`, all classes, per second of the window:
        CPUs' worth ("on_cpu", "runnable": the CPUs the job wants); 0 for an empty window."""
        if self.wall_s <= 0:
            return 0.0
        return sum(c.seconds.get(st, 0.0) for c in self.classes.values()
                   for st in states) / self.wall_s

    def add(self, other: TimeBudget) -> None:
        """Accumulate a later interval (the same job): seconds add, rates re-averaged."""
        total = self.wall_s + other.wall_s
        if total > 0:
            self.hz = (self.hz * self.wall_s + other.hz * other.wall_s) / total
        if other.psi_io is not None and self.psi_io is not None and total > 0:
            for k in ("some_pct", "full_pct"):
                a, b = self.psi_io.get(k), other.psi_io.get(k)
                if a is not None and b is not None:
                    self.psi_io[k] = (a * self.wall_s + b * other.wall_s) / total
        elif other.psi_io is not None:
            self.psi_io = dict(other.psi_io)
        self.wall_s = total
        self.samples += other.samples
        for name, c in other.classes.items():
            self.classes.setdefault(name, ClassBudget()).add(c)
        if other.io_source != self.io_source and self.samples:
            # Mixed sources over one window: the weaker one is what it rests on.
            self.io_source = "state-sampling"
        for n in other.notes:
            if n not in self.notes:
                self.notes.append(n)
        self.wchan_named += other.wchan_named
        self.parked = max(self.parked, other.parked)
        if self.wchan_named and WCHAN_NOTE in self.notes:
            self.notes.remove(WCHAN_NOTE)

    def source_text(self) -> str:
        """How the I/O figure was measured, and the rate: "I/O from delay accounting, 50 Hz"."""
        src = ("delay accounting" if self.io_source == "delayacct"
               else f"task-state sampling ({self.samples:,} samples)")
        return f"I/O from {src}, {self.hz:.0f} Hz"

    def class_line(self, name: str) -> str | None:
        """"workers (4 procs, 9 threads): on CPU 6 %, runnable 1 %, I/O 88 %, storage wait
        0 %, asleep 5 %" (None when the class was not seen)."""
        c = self.cls(name)
        if c is None:
            return None
        sh = c.display_shares()
        parts = ", ".join(f"{LABELS[s]} {sh[s] * 100:.0f} %" for s in STATES)
        n = c.at_once(self.wall_s)
        procs = f"{c.processes} procs" if n == c.processes else c.procs_text(self.wall_s)
        return f"{name} ({procs}, {c.threads} threads): {parts}"

    def psi_text(self) -> str | None:
        """"I/O pressure (PSI, machine): some 12 %, full 3 %" (None when not measured)."""
        p = self.psi_io
        if not p or p.get("some_pct") is None:
            return None
        full = p.get("full_pct")
        return (f"I/O pressure (PSI, {p.get('scope', '?')}): some {p['some_pct']:.0f} %"
                + (f", full {full:.0f} %" if full is not None else ""))

    def lines(self) -> list[str]:
        """What the CLI tables print: a line per class (with the source on the first),
        PSI, then the notes."""
        out: list[str] = []
        for name in CLASSES:
            line = self.class_line(name)
            if line is not None:
                out.append(line + ("; " + self.source_text() if not out else ""))
        psi = self.psi_text()
        if psi:
            out.append(psi)
        out += [f"note: {n}" for n in self.notes]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"available": True, "wall_s": self.wall_s,
                "classes": {k: v.to_dict() for k, v in self.classes.items()},
                "io_source": self.io_source, "samples": self.samples, "hz": self.hz,
                "psi_io": self.psi_io, "notes": list(self.notes), "wchan_named": self.wchan_named,
                "parked": self.parked}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TimeBudget:
        return cls(wall_s=float(d.get("wall_s", 0.0)),
                   classes={k: ClassBudget.from_dict(v)
                            for k, v in (d.get("classes") or {}).items()},
                   io_source=str(d.get("io_source", "state-sampling")),
                   samples=int(d.get("samples", 0)), hz=float(d.get("hz", 0.0)),
                   psi_io=d.get("psi_io"), notes=list(d.get("notes") or []),
                   wchan_named=int(d.get("wchan_named") or 0),
                   parked=int(d.get("parked") or 0))


def sum_budgets(parts: list[dict[str, Any]]) -> TimeBudget | None:
    """One budget of several intervals' `to_dict()`s (None when none is available)."""
    out: TimeBudget | None = None
    for p in parts:
        if not p or not p.get("available"):
            continue
        b = TimeBudget.from_dict(p)
        if out is None:
            out = b
        else:
            out.add(b)
    return out


__all__ = ["CLASSES", "IO_SOURCES", "LABELS", "STATES", "WCHAN_NOTE", "ClassBudget", "TimeBudget", "sum_budgets"]
