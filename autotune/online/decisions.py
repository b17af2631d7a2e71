"""The tuning's decisions as records: one logging record on "autotune.online" each, its
fields riding along for handlers and tests (autotune.online.controller re-exports `emit`).

Under torchrun every rank is a process with a loader of its own. What is the same on every
rank of a node (NODE: its /dev/shm fit, a dataset's kind), and the decisions the ranks take
together (DECIDED, once a loader of this process joined the ranks' group: map-style, under
an initialised torch.distributed), are said at their level by the node's first rank
(LOCAL_RANK 0, or none set) and at DEBUG by the others, as Lightning's and Accelerate's
messages are. What a rank saw of itself (its verdict, its failure), and the decisions of
ranks that tune apart, each rank says, its rank named where RANK and WORLD_SIZE are set.
torch.multiprocessing.spawn sets none of these: there every rank says everything."""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger("autotune.online")

# The same on each rank of a node: said once a node.
NODE = frozenset({"fit", "iterable", "set-epoch", "cache", "oom-group", "whole-dataset",
                  "unsendable"})
# Taken by the ranks together where they decide together (autotune.online.ddp.RankSync).
DECIDED = frozenset({"start", "try", "keep", "reject", "settle", "retune", "bound",
                     "bound-raised", "switch", "switched"})
_together = False


def decided_together() -> None:
    """This process's ranks decide together (a RankSync was made): DECIDED events are
    said once a node from now on."""
    global _together
    _together = True


def _rank_env(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def emit(event: str, msg: str, *, warn: bool = False, **fields: Any) -> None:
    """One decision, one record; the fields ride along for handlers and tests. `warn`:
    at WARNING, which Python shows without any logging set up (a decision the user must
    act on), not INFO. On a node's other ranks a NODE event, and a DECIDED one where the
    ranks decide together, is at DEBUG; any other event of a job of several ranks names
    its rank."""
    level = logging.WARNING if warn else logging.INFO
    if event in NODE or (event in DECIDED and _together):
        if (_rank_env("LOCAL_RANK") or 0) > 0:  # one of this node's ranks, not the first
            level = logging.DEBUG
    elif (_rank_env("WORLD_SIZE") or 1) > 1 and (rank := _rank_env("RANK")) is not None:
        msg = f"rank {rank}: {msg}"
    log.log(level, msg, extra={"autotune_event": event, "autotune": fields})
