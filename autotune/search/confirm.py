"""Confirmation: before one configuration is named, the fastest few, the knee and the
baseline are measured again in a longer window (the best of many short noisy windows is
flattered by its noise). Kept in the study, one attribute per configuration and class of hosts, so searches
sharing a server database add theirs without overwriting each other's, and a resumed
search does not measure a confirmed configuration twice (unless the window changed)."""

from __future__ import annotations

import json
import time
from typing import Any

from autotune.params import config_key
from autotune.search import recommend as rec_mod
from autotune.search.records import TrialRecord
from autotune.search.session import CONFIRMED, Session, _stored


def confirmed(study: Any, host_key: str) -> dict[str, TrialRecord]:
    """Configuration key -> its confirmation on this class of hosts, from the study."""
    prefix = f"{CONFIRMED}{host_key}:"
    return {k[len(prefix):]: TrialRecord.from_dict(d) for k, d in study.user_attrs.items()
            if k.startswith(prefix)}


def ckey(params: dict[str, Any]) -> str:
    return json.dumps(config_key(params))


def window(s: Session, params: dict[str, Any]) -> float:
    step_s = s.base.compute_ms / 1000 if s.base.compute_ms else None
    # From the trial's own window, which follows from the step and the queue.
    return s.opts.confirm_seconds or rec_mod.confirm_window(params, s.config(params).seconds,
                                                            step_s)


def confirm(s: Session, pool: list[TrialRecord], baseline: TrialRecord | None) -> bool:
    """Measure the candidates again, each in a longer window. False when the deadline
    came first."""
    # A resumed study, or one shared with hosts of a larger /dev/shm, holds figures for
    # configurations whose batches do not fit here: never run them again, not even to confirm.
    gate = getattr(s, "shm_gate", None)
    if gate is not None:
        unfit = {id(t) for t in pool if gate.why(t.params)}
        if unfit:
            s.say(f"not confirmed: {len(unfit)} measured configuration(s) whose batches do not "
                  "fit in this host's /dev/shm")
            pool = [t for t in pool if id(t) not in unfit]
            if baseline is not None and id(baseline) in unfit:
                baseline = None
    cands = rec_mod.confirm_candidates(pool, s.opts.confirm, baseline)
    if len(cands) < 2:
        return True  # nothing to choose between
    done = confirmed(s.study, s.shared.host_key)
    windows = [(t, window(s, t.params)) for t in cands]
    todo = [(t, win) for t, win in windows
            if (prev := done.get(ckey(t.params))) is None
            or (prev.requested_window_s or prev.window_s) != win]
    for i, (t, win) in enumerate(todo, 1):
        if s.deadline is not None and time.monotonic() >= s.deadline:
            return False
        label = "baseline" if t.number == -1 else f"trial {t.number}"
        s.say(f"confirming {i} of {len(todo)}: {label} {t.params} ({t.images_per_s:,.0f} "
              f"images/s in {s.config(t.params).seconds:g} s) again in a {win:g} s window")
        r = s.bench(t.params, f"confirm-{'baseline' if t.number == -1 else f'{t.number:03d}'}",
                    seconds=win)
        r.number, r.first_images_per_s, r.requested_window_s = t.number, t.images_per_s, win
        r.window_s = r.measured_s or win
        s.study.set_user_attr(f"{CONFIRMED}{s.shared.host_key}:{ckey(t.params)}",
                              _stored(r.to_dict()))
        short = (f" (measured over {r.window_s:.1f} s, not the {win:g} s asked: its pass of "
                 "the dataset ended first)" if r.ok and r.window_s < 0.9 * win else "")
        s.say(f"  {label}: {r.images_per_s:,.0f} images/s{short}" if r.ok
              else f"  {label}: {r.reason}")
    return True
