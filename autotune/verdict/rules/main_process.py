"""Loader (main process): the loaders are idle, asleep but not on storage, while the step
waits: the wait is in the main process (collate, pin_memory, IPC, a lock). The family's
last rule: what the time budget leaves."""

from __future__ import annotations

from autotune.verdict._types import Verdict
from autotune.verdict.rules._case import BudgetRule, Case
from autotune.verdict.rules._inputs import pct


class MainProcess(BudgetRule):
    name = "main process"
    state = "idle"          # after timer_waits: what the time budget leaves

    def conclude(self, case: Case) -> Verdict:
        inp, load, ev, cmd = case.inp, case.loaded, case.evidence, case.cmd
        adv = ["look at the main process between batches: collate_fn, pin_memory (its thread), "
               "the batch's IPC (large tensors through shared memory), a lock or a sleep; "
               "`py-spy dump --pid PID` shows where it waits"]
        if load.main_only:
            return Verdict("loader", f"loader-configuration-bound (main process): the main process "
                           f"(num_workers=0) is idle {pct(load.idle)} of its loading time, neither "
                           f"on a CPU ({pct(load.cpu)}) nor on storage ({pct(load.blocked)}), while "
                           f"the step waits {pct(inp.data_share)}: it waits on something else "
                           "(a lock, a sleep, a queue)", ev, cmd["search"], adv)
        mc = case.budget.cls("main")  # type: ignore[union-attr]
        main = ("" if mc is None else
                f"; the main process is on a CPU {pct(mc.share('on_cpu'))}, runnable "
                f"{pct(mc.share('runnable'))}, blocked {pct(mc.blocked())} of its time"
                + (" (its collate, pin or unpickling)" if mc.share("on_cpu") + mc.share("runnable")
                   > mc.idle() else " and asleep the rest (IPC, a lock)"))
        return Verdict("loader", f"loader-configuration-bound (main process): {load.who} are idle "
                       f"{pct(load.idle)} of their time (asleep, not on storage; on a CPU "
                       f"{pct(load.cpu)}, blocked {pct(load.blocked)}) while the step waits "
                       f"{pct(inp.data_share)}: the wait is in the main process (collate, pin, "
                       f"IPC, a lock){main}", ev, cmd["search"], adv)
