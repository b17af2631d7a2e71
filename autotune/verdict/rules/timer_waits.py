"""Loader (waits inside the dataset): idle workers asleep in a timer (nanosleep:
time.sleep in the Dataset, a client's backoff, a rate limiter) for most of their idle
time while the step waits. A worker waiting for work polls its index queue's pipe
instead, so the wait is inside their own work, which more workers overlap as they
overlap a storage latency."""

from __future__ import annotations

from autotune.verdict._types import Verdict
from autotune.verdict.bounds import worker_bound
from autotune.verdict.rules._case import BudgetRule, Case
from autotune.verdict.rules._inputs import pct, usable_cores


class TimerWaits(BudgetRule):
    name = "timer waits"
    state = "idle"

    def applies(self, case: Case) -> bool:
        return (super().applies(case) and not case.loaded.main_only
                and case.loaded.timer >= 0.5 * case.loaded.idle)

    def conclude(self, case: Case) -> Verdict:
        inp, load, ev = case.inp, case.loaded, case.evidence
        cores = usable_cores(inp) or 1
        bound = worker_bound(cores, blocked_share=min(1.0, load.blocked + load.timer))
        ev.append(f"the workers' sleeps are timer sleeps (nanosleep) {pct(load.timer)} of their "
                  f"time: inside their work, not a wait for work; worker bound {bound} "
                  f"({cores} usable core(s), raised while they sleep or block: cores / (1 - share))")
        return Verdict("loader", f"loader-configuration-bound (waits inside the dataset): "
                       f"{load.who} {load.verb} asleep in a timer {pct(load.timer)} of "
                       f"{load.whose} time (time.sleep, a client's backoff or a rate limiter in "
                       f"the Dataset; on a CPU {pct(load.cpu)}, blocked {pct(load.blocked)}) while "
                       f"the step waits {pct(inp.data_share)}: more workers overlap such waits",
                       ev, case.cmd["search"],
                       [f"raise num_workers (up to about {bound}: a sleeping worker needs no core), "
                        "or remove the wait from __getitem__; a client backing off means the "
                        "service is throttling its requests"])
