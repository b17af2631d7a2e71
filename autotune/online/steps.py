"""The controller's next step (autotune.online.controller): from the best configuration, one
knob at a time (num_workers one more, then prefetch_factor doubled), each step refused at the
worker bound, past MAX_PREFETCH, where a pool needing as much failed, or over a budget
(autotune.online.limits); at the worker bound, a pause while the loader samples whether the
workers are blocked on I/O, and the bound their blocked share gives."""

from __future__ import annotations

from typing import Any

from autotune.online.config import Config
from autotune.online.decisions import emit
from autotune.online.limits import over_budget, shm_room

MAX_PREFETCH = 8
PAUSE = object()   # propose: wait for the workers' time budget before the next knob


def propose(ctl: Any) -> Any:
    """The next configuration the controller `ctl` tries from its best; None when no knob
    helps further, PAUSE while the workers' time budget is sampled at the bound; each step
    refused is said."""
    base = ctl._best_cfg()
    knobs = ctl.knobs
    if ctl._reopen:
        ctl._reopen, ctl._knob = False, 0
    while ctl._knob < len(knobs):
        knob = knobs[ctl._knob]
        cand, why = step(ctl, base, knob)
        if cand is not None and why is None and cand not in ctl._rejected:
            return cand
        if cand is None and knob == "num_workers" and ctl.bound_hit \
                and ctl.sample_bound and not ctl.bound_checked and ctl._current == base:
            # Before the next knob: are the workers blocked on I/O (then more of them
            # than cores help)? Stay here while the loader samples their time budget.
            ctl.phase = "budget"
            emit("bound", f"{knob}: {why}; first, whether the workers are blocked on "
                 "I/O (a time-budget sample of a few seconds)", knob=knob, why=why)
            return PAUSE
        if why:
            emit("bound", f"{knob}: {why}", knob=knob, why=why)
        ctl._knob += 1
    return None


def step(ctl: Any, base: Config, knob: str) -> tuple[Config | None, str | None]:
    """One step of `knob` from `base`, and why it is refused (None: it may be tried)."""
    if knob == "num_workers":
        w = base.num_workers + 1
        if w > ctl.bound:
            ctl.bound_hit = True
            return None, f"{w} workers would exceed the worker bound ({ctl.bound})"
        cand = ctl.make(w, base.prefetch_factor or 2)
    else:
        if not base.num_workers:
            return None, None
        pf = (base.prefetch_factor or 2) * 2
        if pf > MAX_PREFETCH:
            return None, f"prefetch_factor {pf} is over {MAX_PREFETCH}"
        cand = ctl.make(base.num_workers, pf)
    dead = ctl.needs_as_much(cand)
    if dead is not None:
        return None, (f"{cand.short()} needs as much as {dead.short()}, whose pool failed "
                      "in this run")
    mem = ctl.memory()
    return cand, over_budget(cand, ctl._current or ctl._best_cfg(), mem, ctl.budget,
                             shm_room(ctl))


def raise_bound(ctl: Any, blocked: float | None, bound: int, why: str) -> None:
    """The bound the workers' blocked share gives (autotune.verdict.bounds.worker_bound):
    said when it stays; a higher one re-opens the walk on num_workers from the best
    configuration (a settled controller measures again)."""
    if bound <= ctl.bound:
        emit("bound", f"num_workers: worker bound stays {ctl.bound} ({why})",
             knob="num_workers", why=why, blocked=blocked)
        return
    emit("bound-raised", f"worker bound {ctl.bound} -> {bound}: {why}",
         old=ctl.bound, bound=bound, blocked=blocked)
    if ctl.cores_bound is None:
        ctl.cores_bound = ctl.bound
    ctl.bound, ctl.bound_hit, ctl.bound_checked = bound, False, False
    ctl._reopen = True      # taken by the next proposal (after a trial in flight)
    if ctl.phase == "settled":
        ctl.phase = "measure"  # from the settled (best) configuration's next window


def past_cores(cores_bound: int | None, trial: Config, best: Config) -> bool:
    """A num_workers trial past the cores, allowed by a bound raised for blocked workers
    (`cores_bound`: the bound before it was raised)."""
    return (cores_bound is not None and trial.num_workers > best.num_workers
            and trial.num_workers > cores_bound)
