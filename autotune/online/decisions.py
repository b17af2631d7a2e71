"""The tuning's decisions as records: one logging record on "autotune.online" each, its
fields riding along for handlers and tests (autotune.online.controller re-exports `emit`).

Under torchrun every rank is a process with a loader of its own: a decision the node's
ranks take together, or one about what they share (the node's /dev/shm), is said at its
level by the node's first rank (LOCAL_RANK 0, or none set) and at DEBUG by the others, as
Lightning's and Accelerate's messages are; what one rank saw of itself (its verdict, its
failure) is said by each, its rank named."""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger("autotune.online")

# Taken by the node's ranks together (or the same for each): said once a node.
SHARED = frozenset({"start", "try", "keep", "reject", "settle", "retune", "bound",
                    "bound-raised", "switch", "switched", "fit", "iterable", "set-epoch",
                    "cache", "oom-group", "whole-dataset"})


def _rank_env(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def emit(event: str, msg: str, *, warn: bool = False, **fields: Any) -> None:
    """One decision, one record; the fields ride along for handlers and tests. `warn`:
    at WARNING, which Python shows without any logging set up (a decision the user must
    act on), not INFO. On a node's other ranks a SHARED event is at DEBUG; any other event
    of a job of several ranks names its rank."""
    level = logging.WARNING if warn else logging.INFO
    if event in SHARED:
        if _rank_env("LOCAL_RANK"):  # one of this node's ranks, not the first
            level = logging.DEBUG
    elif (_rank_env("WORLD_SIZE") or 1) > 1 and (rank := _rank_env("RANK")) is not None:
        msg = f"rank {rank}: {msg}"
    log.log(level, msg, extra={"autotune_event": event, "autotune": fields})
