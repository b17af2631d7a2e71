"""The trial loop: ask Optuna for a configuration, answer a duplicate from the study,
measure a new one, tell Optuna, stop at the budget, the deadline or a ceiling."""

from __future__ import annotations

import random
import time
from typing import Any

from autotune.params import config_key
from autotune.search import guard
from autotune.search.records import TrialRecord
from autotune.search.session import CEILING_TOLERANCE, Session, _stored

MAX_DUPLICATES = 40  # TPE proposing only measured points this often: the space is exhausted


def run_trials(s: Session, measured: dict[tuple, TrialRecord]) -> str:
    """Measure until the budget is spent; returns why the loop stopped."""
    opts = s.opts
    budget = _enqueue_grid(s, measured) if opts.grid else max(0, opts.trials - len(measured))
    if budget == 0 and not opts.grid:
        return "trials (already measured)"
    runs = dupes = 0
    rng = random.Random(opts.seed)
    while runs < budget:
        if s.timed_out():
            return "timeout"
        trial = s.study.ask()
        trial.set_user_attr("owner", guard.owner_tag())
        params = s.space.suggest(trial)  # type: ignore[union-attr]
        trial.set_user_attr("params", params)
        prev = measured.get(config_key(params))
        if prev is None and (why := s.unfit(params)):
            # One cold pass cannot hold its measurement: failed without measuring, not a
            # trial of the budget; the next one an unmeasured point that fits.
            dupes += 1
            _answer_unfit(s, trial, params, why, measured)
            if not _enqueue_unmeasured(s, measured, rng) or dupes > MAX_DUPLICATES:
                return "space exhausted"
            continue
        if prev is not None:
            # Answered from the study; not a trial of the budget. Ask again, and make the
            # next one an unmeasured point of the space (TPE would keep proposing this).
            dupes += 1
            _answer_duplicate(s, trial, prev)
            if not _enqueue_unmeasured(s, measured, rng) or dupes > MAX_DUPLICATES:
                return "space exhausted"
            continue
        runs += 1
        rec = _measure(s, trial, params, measured, f"trial {runs} of {budget}")
        stop = _at_ceiling(s, rec)
        if stop:
            return stop
    return "grid complete" if opts.grid else "trials"


def _enqueue_unmeasured(s: Session, measured: dict[tuple, TrialRecord],
                        rng: random.Random) -> bool:
    """Queue a random configuration not measured yet; False when none is left."""
    left = [p for p in s.space.grid()  # type: ignore[union-attr]
            if config_key(p) not in measured and not s.unfit(p)]
    if not left:
        return False
    s.study.enqueue_trial(s.space.optuna_params(rng.choice(left)))  # type: ignore[union-attr]
    return True


def _enqueue_grid(s: Session, measured: dict[tuple, TrialRecord]) -> int:
    todo = [p for p in s.space.grid()  # type: ignore[union-attr]
            if config_key(p) not in measured and not s.unfit(p)]
    for p in todo:
        s.study.enqueue_trial(s.space.optuna_params(p))  # type: ignore[union-attr]
    return len(todo)


def _answer_unfit(s: Session, trial: Any, params: dict[str, Any], why: str,
                  measured: dict[tuple, TrialRecord]) -> None:
    from optuna.trial import TrialState

    rec = TrialRecord(trial.number, params, "failed", reason=why,
                      hint="a smaller batch size, --warm, or a larger dataset")
    trial.set_user_attr("record", _stored(rec.to_dict()))
    s.study.tell(trial, state=TrialState.FAIL)
    measured[config_key(params)] = rec


def _answer_duplicate(s: Session, trial: Any, prev: TrialRecord) -> None:
    """A configuration already measured: recorded as a duplicate of it, not measured."""
    from optuna.trial import TrialState

    rec = TrialRecord.from_dict(prev.to_dict())
    rec.number, rec.state, rec.duplicate_of = trial.number, "duplicate", prev.number
    trial.set_user_attr("record", rec.to_dict())
    if prev.ok:
        s.study.tell(trial, prev.images_per_s)
    else:
        s.study.tell(trial, state=TrialState.PRUNED if prev.state == "pruned"
                     else TrialState.FAIL)


def _measure(s: Session, trial: Any, params: dict[str, Any],
             measured: dict[tuple, TrialRecord], which: str) -> TrialRecord:
    from optuna.trial import TrialState

    best = max((r.images_per_s for r in measured.values() if r.ok), default=None)
    left = (f", {max(0, s.deadline - time.monotonic()):.0f} s left" if s.deadline else "")
    s.say(f"{which}: {params}" + (f" (best so far {best:,.0f} images/s{left})" if best else left))
    try:
        rec = s.bench(params, f"trial-{trial.number:03d}", trial)
    except KeyboardInterrupt:
        rec = TrialRecord(trial.number, params, "interrupted",
                          reason="interrupted (Ctrl-C); measured again on resume")
        trial.set_user_attr("record", rec.to_dict())
        s.study.tell(trial, state=TrialState.FAIL)
        raise
    except Exception as e:  # noqa: BLE001 - a bug of ours: the trial never stays RUNNING
        rec = TrialRecord(trial.number, params, "failed",
                          reason=f"internal error: {type(e).__name__}: {e}",
                          hint="a bug in autotune: rerun with --debug and report the traceback")
    rec.number = trial.number
    trial.set_user_attr("record", _stored(rec.to_dict()))
    measured[config_key(params)] = rec
    if rec.ok:
        s.study.tell(trial, rec.images_per_s)
        s.revise(rec)
    elif rec.state == "pruned":
        s.say(f"{which.split(' of ')[0]}: {rec.reason}")
        s.study.tell(trial, state=TrialState.PRUNED)
    else:
        s.study.tell(trial, state=TrialState.FAIL)
    return rec


def _at_ceiling(s: Session, rec: TrialRecord) -> str | None:
    """Why to stop early: the trial is within the tolerance of the smallest firm ceiling."""
    if not (s.opts.early_stop and not s.opts.grid and rec.ok):
        return None
    lim = s.ceilings.smallest(firm=True)  # type: ignore[union-attr]
    if lim and rec.images_per_s >= (1 - CEILING_TOLERANCE) * lim[1]:  # type: ignore[operator]
        return (f"ceiling reached: {rec.images_per_s:,.0f} images/s is within "
                f"{CEILING_TOLERANCE:.0%} of the {lim[0]} ceiling {lim[1]:,.0f}")
    return None
