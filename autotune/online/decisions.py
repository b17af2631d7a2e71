"""The tuning's decisions as records: one logging record on "autotune.online" each, its
fields riding along for handlers and tests (autotune.online.controller re-exports `emit`)."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("autotune.online")


def emit(event: str, msg: str, **fields: Any) -> None:
    """One decision, one record; the fields ride along for handlers and tests."""
    log.info(msg, extra={"autotune_event": event, "autotune": fields})
