"""The study's trials as the searches sharing it left them (this host's earlier runs, other
hosts'): the configurations measured on this class of hosts, the trials other searches are
measuring now, and those a search that died left running (reclaimed: marked interrupted).
`s` is the search's Session (autotune.search.session), which answers through these."""

from __future__ import annotations

from typing import Any

from autotune.params import config_key
from autotune.search import guard
from autotune.search.records import TrialRecord

# A trial's record is measured (not a duplicate or an interruption) in these states.
MEASURED_STATES = ("complete", "failed", "rejected", "pruned")


def reclaim_orphans(s: Any, exclusive: bool) -> None:
    """Trials a search that died left RUNNING (its process is gone from this host, or
    its host has sent no heartbeat for the grace period): marked interrupted, their
    configuration released to be measured again."""
    import optuna
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    stale = {t.number: t for t in s.shared.heartbeats.stale(s.study)}
    dead = {t.number: t for t in guard.orphaned_trials(s.study, exclusive=exclusive)}
    for number, t in sorted({**dead, **stale}.items()):
        owner = t.user_attrs.get("owner")
        reason = guard.interrupted_reason(owner)
        if number in stale and number not in dead:
            reason = guard.silent_reason(owner, s.shared.grace)
        rec = TrialRecord(t.number, dict(t.user_attrs.get("params") or t.params),
                          "interrupted", reason=reason, host=t.user_attrs.get("host"))
        try:
            optuna.trial.Trial(s.study, t._trial_id).set_user_attr("record", rec.to_dict())
            s.study.tell(t.number, state=TrialState.FAIL)
        except (UpdateFinishedTrialError, RuntimeError, ValueError):
            continue  # another host reclaimed it first, or it finished meanwhile
        claim = t.user_attrs.get("claim")
        if claim:
            s.shared.claims.release(claim, t.number)
        s.say(f"trial {t.number}: {rec.reason}")


def measured(s: Any) -> dict[tuple, TrialRecord]:
    """Configuration -> its record, for every configuration the study measured on a
    host of this class (this host, or one with the same CPU model, cores and storage
    class)."""
    out: dict[tuple, TrialRecord] = {}
    for t in s.study.get_trials(deepcopy=False):
        d = t.user_attrs.get("record")
        if d and d.get("state") in MEASURED_STATES and s.shared.same_class(d.get("host")):
            out.setdefault(config_key(d["params"]), TrialRecord.from_dict(d))
    return out


def running_elsewhere(s: Any) -> int:
    """Trials other search processes are measuring now (they count in the budget)."""
    import os

    from optuna.trial import TrialState

    n = 0
    for t in s.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = t.user_attrs.get("owner") or {}
        if t.user_attrs.get("claim") and owner.get("pid") != os.getpid() \
                and s.shared.same_class(t.user_attrs.get("host")):
            n += 1
    return n
