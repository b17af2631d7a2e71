"""The trial loop: ask Optuna for a configuration, answer a duplicate from the study,
measure a new one, tell Optuna, stop at the budget, the deadline or a ceiling."""

from __future__ import annotations

import contextlib
import errno
import random
import time
from typing import Any

from autotune.errors import AutotuneError
from autotune.params import config_key
from autotune.search import guard
from autotune.search import shared as shared_mod
from autotune.search.records import TrialRecord
from autotune.search.session import CEILING_TOLERANCE, Session, _stored

MAX_DUPLICATES = 40  # TPE proposing only measured points this often: the space is exhausted


def run_trials(s: Session, measured: dict[tuple, TrialRecord],
               last: TrialRecord | None = None) -> str:
    """Measure until the budget is spent; returns why the loop stopped. `last`: the
    measurement before the first trial (the baseline), for the step rule below.

    `--trials N` is the study's total: on a study other hosts share, what they measured
    and are measuring counts too (`measured` is refreshed from the study before each
    trial), a configuration claimed by another host's running trial is skipped, and a
    trial whose host went silent is reclaimed (interrupted, measured again)."""
    opts = s.opts
    shared = s.shared.enabled
    budget = _enqueue_grid(s, measured) if opts.grid else opts.trials
    if not opts.grid:   # the grid queues every unmeasured configuration, these too
        _enqueue_interrupted(s, measured)
    runs = dupes = 0
    rng = random.Random(opts.seed)
    while True:
        if shared:
            s.reclaim_orphans(exclusive=False)
            measured.clear()
            measured.update(s.measured())
        stop = _out_of_budget(s, measured, runs, budget)
        if stop:
            return stop
        trial, params = _ask(s)
        key = config_key(params)
        claim = shared_mod.config_claim(s.shared.host_key, key)
        if _answered(s, trial, params, measured.get(key), claim):
            # Not a trial of the budget. Ask again, and make the next one an unmeasured
            # point of the space (TPE would keep proposing this).
            dupes += 1
            if not _enqueue_unmeasured(s, measured, rng) or dupes > MAX_DUPLICATES:
                return "space exhausted"
            continue
        trial.set_user_attr("claim", claim)
        runs += 1
        which = (f"trial {runs} of {budget}" if opts.grid else
                 f"trial {len(measured) + 1} of {opts.trials}" + (" (study total)" if shared else ""))
        with s.shared.heartbeats.during(trial):
            rec = _measure(s, trial, params, measured, which, claim)
        stop = _at_ceiling(s, rec) or _step_fails_alike(last, rec) or _cannot_send(rec)
        if stop:
            return stop
        last = rec


def _step_fails_alike(prev: TrialRecord | None, rec: TrialRecord) -> str | None:
    """Why to stop: the user's --step raised the same error in two configurations in a
    row. A loader setting does not fix a bug in the step, and each further trial would
    spend its window failing; one failure alone is a trial's, not the search's (a step
    may fail in one configuration and not another)."""
    if (rec.failure_kind == "step_error" and prev is not None
            and prev.failure_kind == "step_error" and prev.reason == rec.reason):
        return f"the step failed the same way in two configurations in a row: {rec.reason}"
    return None


def _cannot_send(rec: TrialRecord) -> str | None:
    """Why to stop: a worker could not pickle its batch (the dataset's samples hold a
    generator, a lock, ...). Every configuration with workers fails alike, each after the
    whole batch timeout; a loader setting does not fix it."""
    if rec.failure_kind == "unsendable":
        return (f"{rec.reason}; every configuration with workers fails alike: {rec.hint}")
    return None


def _out_of_budget(s: Session, measured: dict[tuple, TrialRecord], runs: int,
                   budget: int) -> str | None:
    """Why to stop before the next trial (the grid done, --trials measured, the deadline),
    or None."""
    if s.opts.grid:
        if runs >= budget:
            return "grid complete"
    elif s.opts.trials - len(measured) - (s.running_elsewhere() if s.shared.enabled else 0) <= 0:
        return "trials" if runs else "trials (already measured)"
    if s.timed_out():
        return "timeout"
    return None


def _ask(s: Session) -> tuple[Any, dict[str, Any]]:
    """The next trial from Optuna, marked as this host's and beating from the start (a
    silent trial can be reclaimed), and its configuration."""
    trial = s.study.ask()
    trial.set_user_attr("owner", guard.owner_tag())
    trial.set_user_attr("host", s.shared.host)
    s.shared.heartbeats.beat(trial)
    params = s.space.suggest(trial)  # type: ignore[union-attr]
    trial.set_user_attr("params", params)  # whole, for its record if it is reclaimed
    return trial, params


def _answered(s: Session, trial: Any, params: dict[str, Any], prev: TrialRecord | None,
              claim: str) -> bool:
    """Answer the trial without measuring it where that is the answer, and say so: a
    configuration one cold pass cannot hold (skipped), one already measured (a duplicate
    of it), one another host measures now (skipped). False: it is to be measured, and
    this process holds its claim."""
    if prev is None and (why := s.unfit(params)):
        _answer_unfit(s, trial, params, why)
        return True
    if prev is not None:
        _answer_duplicate(s, trial, prev)
        return True
    held = s.shared.claims.claim(claim, s.shared.holder(trial))
    if held is not None:
        _answer_taken(s, trial, params, held)
        return True
    return False


def _answer_taken(s: Session, trial: Any, params: dict[str, Any], held: dict[str, Any]) -> None:
    """A configuration another search process is measuring now: skipped, not measured."""
    from optuna.trial import TrialState

    rec = TrialRecord(trial.number, params, "skipped", host=s.shared.host,
                      duplicate_of=held.get("trial"),
                      reason=(f"skipped: {held.get('hostname', '?')} (pid {held.get('pid', '?')}) "
                              f"measures this configuration in trial {held.get('trial', '?')}"))
    trial.set_user_attr("record", rec.to_dict())
    s.study.tell(trial, state=TrialState.FAIL)
    s.say(f"trial {trial.number}: {rec.reason}")


def _unmeasured(s: Session, measured: dict[tuple, TrialRecord]) -> list[dict[str, Any]]:
    """The space's configurations not measured yet that one cold pass can hold."""
    return [p for p in s.space.grid()  # type: ignore[union-attr]
            if config_key(p) not in measured and not s.unfit(p)]


def _enqueue_interrupted(s: Session, measured: dict[tuple, TrialRecord]) -> None:
    """Queue first the configurations whose trial a search that died left (interrupted,
    still unmeasured), so that a resumed search measures them again rather than leave
    that to the sampler; once: one interrupted twice may be what kills the search, and
    is left to the sampler, said."""
    from optuna.trial import TrialState

    lost: dict[tuple, list[int]] = {}
    waiting: list[dict[str, Any]] = []   # queued already, as Optuna records them
    for t in s.study.get_trials(deepcopy=False):
        d = t.user_attrs.get("record")
        if d and d.get("state") == "interrupted" and d.get("params"):
            lost.setdefault(config_key(d["params"]), []).append(t.number)
        elif t.state == TrialState.WAITING:   # its params are set only when it runs
            waiting.append(t.system_attrs.get("fixed_params") or t.params)
    for p in _unmeasured(s, measured):
        numbers = lost.get(config_key(p))
        if not numbers or s.space.optuna_params(p) in waiting:  # type: ignore[union-attr]
            continue
        if len(numbers) > 1:
            s.say(f"trials {', '.join(map(str, numbers))} were all interrupted measuring "
                  f"{p}: not measured again first (it may be what stops the search)")
            continue
        s.study.enqueue_trial(s.space.optuna_params(p))  # type: ignore[union-attr]
        s.say(f"trial {numbers[0]} was interrupted: {p} is measured again first")


def _enqueue_unmeasured(s: Session, measured: dict[tuple, TrialRecord],
                        rng: random.Random) -> bool:
    """Queue a random configuration not measured yet; False when none is left."""
    left = _unmeasured(s, measured)
    if not left:
        return False
    s.study.enqueue_trial(s.space.optuna_params(rng.choice(left)))  # type: ignore[union-attr]
    return True


def _enqueue_grid(s: Session, measured: dict[tuple, TrialRecord]) -> int:
    todo = _unmeasured(s, measured)
    for p in todo:
        s.study.enqueue_trial(s.space.optuna_params(p))  # type: ignore[union-attr]
    return len(todo)


def _answer_unfit(s: Session, trial: Any, params: dict[str, Any], why: str) -> None:
    from optuna.trial import TrialState

    rec = TrialRecord(trial.number, params, "skipped", host=s.shared.host, reason=why,
                      hint=s.unfit_hint(params))
    trial.set_user_attr("record", _stored(rec.to_dict()))
    s.study.tell(trial, state=TrialState.FAIL)


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


def _out_of_files(s: Session, trial: Any, claim: str, params: dict[str, Any],
                  e: Exception) -> bool:
    """Whether `e` is this process's own open-files limit, met starting a measurement: not
    the configuration's failure (every trial would meet it), so the trial is ended as
    interrupted and the command says so in one line."""
    if not (isinstance(e, OSError) and e.errno in (errno.EMFILE, errno.ENFILE)):
        return False
    with contextlib.suppress(Exception):  # ending it may need a descriptor too
        _end(s, trial, claim, TrialRecord(
            trial.number, params, "interrupted", host=s.shared.host,
            reason=f"the search ran out of file descriptors ({e}); measured again on resume"))
    return True


def _measure(s: Session, trial: Any, params: dict[str, Any],
             measured: dict[tuple, TrialRecord], which: str, claim: str) -> TrialRecord:
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    best = max((r.images_per_s for r in measured.values() if r.ok), default=None)
    left = (f", {max(0, s.deadline - time.monotonic()):.0f} s left" if s.deadline else "")
    s.say(f"{which}: {params}" + (f" (best so far {best:,.0f} images/s{left})" if best else left))
    try:
        rec = s.bench(params, f"trial-{trial.number:03d}", trial)
    except AutotuneError as e:
        # What stops the whole search (the user's step cannot run): recorded failed, and
        # the error goes on to the command.
        _end(s, trial, claim, TrialRecord(trial.number, params, "failed", host=s.shared.host,
                                          reason=str(e)))
        raise
    except Exception as e:  # noqa: BLE001 - a bug of ours: the trial never stays RUNNING
        if _out_of_files(s, trial, claim, params, e):
            raise
        rec = TrialRecord(trial.number, params, "failed",
                          reason=f"internal error: {type(e).__name__}: {e}",
                          hint="a bug in autotune: rerun with --debug and report the traceback")
    except BaseException as e:
        # Ctrl-C, or SIGTERM (the CLI raises it as an exception of its own) or an exit:
        # recorded interrupted now, not left RUNNING for the next run to find.
        why = ("interrupted (Ctrl-C)" if isinstance(e, KeyboardInterrupt)
               else "stopped (SIGTERM, or an exit)")
        _end(s, trial, claim, TrialRecord(trial.number, params, "interrupted",
                                          host=s.shared.host,
                                          reason=f"{why}; measured again on resume"))
        raise
    rec.number = trial.number
    try:
        trial.set_user_attr("record", _stored(rec.to_dict()))
        if rec.ok:
            s.study.tell(trial, rec.images_per_s)
        elif rec.state == "pruned":
            s.study.tell(trial, state=TrialState.PRUNED)
        else:
            s.study.tell(trial, state=TrialState.FAIL)
    except UpdateFinishedTrialError:
        # Another host declared this trial interrupted (no heartbeat within the grace
        # period) and released its configuration: these figures are not kept, so that no
        # configuration counts as measured twice.
        rec.state, rec.reason = "interrupted", (
            f"declared interrupted by another host (no heartbeat for {s.shared.grace} s) "
            "while it was measured; its figures were discarded")
        s.say(f"trial {trial.number}: {rec.reason}")
        return rec
    measured[config_key(params)] = rec
    if rec.ok:
        s.revise(rec)
    elif rec.state == "pruned":
        s.say(f"{which.split(' of ')[0]}: {rec.reason}")
    return rec


def _end(s: Session, trial: Any, claim: str, rec: TrialRecord) -> None:
    """Record a trial the search stops in (failed or interrupted), never left RUNNING, and
    release its configuration's claim."""
    from optuna.trial import TrialState

    try:
        trial.set_user_attr("record", _stored(rec.to_dict()))
        s.study.tell(trial, state=TrialState.FAIL)
    finally:
        s.shared.claims.release(claim, trial.number)


def _at_ceiling(s: Session, rec: TrialRecord) -> str | None:
    """Why to stop early: the trial is within the tolerance of the smallest firm ceiling."""
    if not (s.opts.early_stop and not s.opts.grid and rec.ok):
        return None
    lim = s.ceilings.smallest(firm=True)  # type: ignore[union-attr]
    if lim and rec.images_per_s >= (1 - CEILING_TOLERANCE) * lim[1]:  # type: ignore[operator]
        return (f"ceiling reached: {rec.images_per_s:,.0f} images/s is within "
                f"{CEILING_TOLERANCE:.0%} of the {lim[0]} ceiling {lim[1]:,.0f}")
    return None
