"""The tuning's decisions as records: one logging record on "autotune.online" each, its
fields riding along for handlers and tests (autotune.online.controller re-exports `emit`)."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("autotune.online")


def emit(event: str, msg: str, *, warn: bool = False, **fields: Any) -> None:
    """One decision, one record; the fields ride along for handlers and tests. `warn`:
    at WARNING, which Python shows without any logging set up (a decision the user must
    act on), not INFO."""
    log.log(logging.WARNING if warn else logging.INFO, msg,
            extra={"autotune_event": event, "autotune": fields})
