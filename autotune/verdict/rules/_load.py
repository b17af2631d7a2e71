"""The time budget of the job's loading: where the loading processes' time went
(autotune.monitor.timebudget), read into shares of their loading time (`Load`), with the
evidence lines that show it."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.monitor.figures import SystemFigures
from autotune.monitor.timebudget import ClassBudget, TimeBudget
from autotune.verdict.rules._inputs import RuleInputs, num, pct


def budget_of(system: SystemFigures | None) -> tuple[TimeBudget | None, str]:
    """The window's time budget, or None and a line naming what is missing and why."""
    if system is None:
        return None, ("no system metrics: the time budget (where each loading process's "
                      "time goes) is measured by `autotune monitor`")
    d = system.budget
    if not d:
        return None, ("the monitor's samples carry no time budget (SystemFigures.budget): "
                      "run the job under `autotune monitor` (a version that records it), on a "
                      "kernel with /proc/PID/task/TID/schedstat")
    if not d.get("available", True):
        return None, (f"the time budget was not measured: {d.get('reason') or 'no reason given'}"
                      f"; {d.get('fix') or 'run under `autotune monitor` on a kernel with schedstat'}")
    b = TimeBudget.from_dict(d)
    if not b.classes or b.wall_s <= 0:
        return None, ("the time budget is empty (no process of the job seen in the window): "
                      "check that `autotune monitor` wraps the training command itself")
    return b, ""


@dataclass
class Load:
    """Where the loading class's time went, as shares of its loading time."""

    name: str           # "workers", or "main" when the main process loads (num_workers=0)
    procs: int          # loading processes (reads they can have in flight)
    on_cpu: float
    runnable: float
    io: float
    storage_wait: float
    idle: float
    read_cpu: float = 0.0   # of `cpu`, the part the pipeline's clock puts inside the read stage
    timer: float = 0.0      # of `idle`, the part asleep in a timer (nanosleep)

    @property
    def cpu(self) -> float:
        return self.on_cpu + self.runnable

    @property
    def blocked(self) -> float:
        return self.io + self.storage_wait

    @property
    def main_only(self) -> bool:
        return self.name == "main"

    @property
    def who(self) -> str:
        return ("the main process (num_workers=0)" if self.main_only
                else f"the {self.procs} worker{'s' if self.procs != 1 else ''}")

    @property
    def whose(self) -> str:
        return "its loading" if self.main_only else "its" if self.procs == 1 else "their"

    @property
    def verb(self) -> str:
        return "is" if self.main_only or self.procs == 1 else "are"

    def dominant(self) -> str:
        """The state that took most of the time: states compared with each other, never
        one share against a fixed line (ties: blocked, then cpu)."""
        states = {"blocked": self.blocked + self.read_cpu, "cpu": self.cpu - self.read_cpu,
                  "idle": self.idle}
        return max(states, key=lambda k: states[k])

    @property
    def threads_note(self) -> str:
        """Said beside a share over 100 %: each state is its threads' time per second of
        each process, and a process's threads (torch's intra-op pool, the pin-memory
        thread) can run at once."""
        return (" (its threads together: several ran at once)"
                if self.cpu + self.blocked > 1.0 else "")

    def shares(self) -> str:
        return (f"blocked on storage {pct(self.blocked)} (I/O {pct(self.io)}, storage wait "
                f"{pct(self.storage_wait)}), on a CPU {pct(self.on_cpu)}, runnable "
                f"{pct(self.runnable)}, idle {pct(self.idle)}{self.threads_note}")


def _class_line(name: str, c: ClassBudget, b: TimeBudget) -> str:
    src = "delay accounting" if b.io_source == "delayacct" else "task-state sampling"
    # As the table and the report show it: asleep is what the other states leave of one
    # thread (idle helper threads would otherwise read as 226 % asleep).
    sh = c.display_shares()
    # A distributed launcher's ranks are the main class (autotune.monitor.tasks).
    label = ("workers" if name == "workers" else "main process" if c.processes <= 1
             else "ranks")
    their = "their" if name == "workers" or c.processes > 1 else "its"
    return (f"{label} ({c.procs_text(b.wall_s)}, {c.threads} "
            f"threads): I/O {pct(sh['io'])} of {their} time, storage wait "
            f"{pct(sh['storage_wait'])}, on a CPU {pct(sh['on_cpu'])}, runnable "
            f"{pct(sh['runnable'])}, asleep {pct(sh['asleep'])}"
            + (f" (in a timer {pct(c.timer())})" if c.timer() >= 0.05 else "")
            + f" ({src}, {b.samples:,} "
            f"samples at {b.hz:.0f} Hz over {b.wall_s:.1f} s)")


def _budget_lines(b: TimeBudget, ev: list[str]) -> None:
    for name in ("workers", "main"):
        c = b.cls(name)
        if c is not None:
            ev.append(_class_line(name, c, b))
    psi = b.psi_io
    if psi:
        scope = "the job's cgroup" if psi.get("scope") == "cgroup" else "the machine's: /proc/pressure/io"
        ev.append(f"PSI io: some {num(psi.get('some_pct'))} %, full {num(psi.get('full_pct'))} % "
                  f"({scope})")
    ev.extend(f"time budget: {n}" for n in b.notes)


def loading(inp: RuleInputs, b: TimeBudget, ev: list[str]) -> tuple[Load | None, str]:
    """The loading class's budget: the workers', or the main process's loading time when
    num_workers=0 (its step's share, AU, taken from its idle time first: a step waiting on
    the GPU sleeps; then from its CPU time)."""
    _budget_lines(b, ev)
    workers = (inp.loader or {}).get("num_workers")
    wc, mc = b.cls("workers"), b.cls("main")
    if workers == 0 or (workers is None and wc is None):
        if mc is None:
            return None, ("the time budget has no main process (the training process was not "
                          "seen in the window): run the training command itself under "
                          "`autotune monitor`")
        au = inp.au or 0.0
        load_t = max(inp.data_share if inp.data_share is not None else 1.0 - au, 1e-9)
        idle = mc.idle()
        step_idle = min(idle, au)
        cpu_cut = max(0.0, au - step_idle)
        # A step on a CPU waits its turn as loading does, on a busy machine: its share is
        # taken from on-CPU and runnable time alike (all from on-CPU read "on a CPU 0 %,
        # runnable 97 %" for a main process decoding beside a matmul step).
        on, run = mc.share("on_cpu"), mc.share("runnable")
        part = on / (on + run) if on + run > 0 else 1.0
        on, run = max(0.0, on - cpu_cut * part), max(0.0, run - cpu_cut * (1.0 - part))
        load = Load("main", 1, on / load_t, run / load_t, mc.share("io") / load_t,
                    mc.share("storage_wait") / load_t, (idle - step_idle) / load_t)
        ev.append(f"the main process loads every batch (num_workers={workers if workers is not None else '0: no worker seen'}): "
                  f"its step's {pct(au)} of the time taken out, in its loading time it is "
                  + load.shares())
        return load, ""
    if wc is None:
        return None, (f"the time budget has no DataLoader worker, yet num_workers={workers}: "
                      "the workers were not seen in the window (run the training command "
                      "itself under `autotune monitor`, not a shell that forks it away)")
    return Load("workers", wc.at_once(b.wall_s) or int(workers or 1), wc.share("on_cpu"),
                wc.share("runnable"), wc.share("io"), wc.share("storage_wait"), wc.idle(),
                timer=wc.timer()), ""


def hidden_read_wait(inp: RuleInputs, load: Load, ev: list[str]) -> None:
    """A wait the kernel cannot name, seen by the pipeline's own clock: workers inside the
    read stage while neither on a CPU nor blocked (a storage client polls its socket with
    a timeout, `poll_schedule_timeout`, as the DataLoader's own pipes do: no wchan tells
    them apart) are waiting on storage. That part of their asleep time is counted as
    storage wait, and said."""
    st = inp.stages
    if load.main_only or not st or st.get("busy") is None:
        return
    busy = min(1.0, st["busy"])
    in_read = busy * st["share"]["read"]
    hidden = min(load.idle, max(0.0, in_read - load.cpu - load.blocked))
    if hidden >= 0.05:
        load.storage_wait += hidden
        load.idle -= hidden
        ev.append(f"the pipeline's clock saw {load.who} inside the read stage {pct(in_read)} "
                  f"of their time, {pct(hidden)} of it neither on a CPU nor in a wait the "
                  "kernel names (a storage client polling its socket): counted as storage wait")
    # CPU time that cannot have been spent decoding: the stages after read took at most
    # (busy - in_read) of the loaders' time, so the rest of their CPU (and runnable) time
    # was inside read: the storage client's per-request work (signing, HTTP, TLS), which
    # shards cut as they cut requests. Counted with the read only where the read also waits
    # on storage: a read that is CPU alone (a local shard's parser) stays CPU.
    read_cpu = min(in_read, max(0.0, load.cpu - (busy - in_read)))
    if read_cpu >= 0.05 and load.blocked >= 0.1:
        load.read_cpu = read_cpu
        ev.append(f"of {load.whose} {pct(load.cpu)} on a CPU or runnable, at least "
                  f"{pct(read_cpu)} was inside the read stage (the other stages took at most "
                  f"{pct(busy - in_read)} of their time): the storage client's per-request "
                  "work, counted with the read, not as decode")


__all__ = ["Load", "budget_of", "hidden_read_wait", "loading"]
