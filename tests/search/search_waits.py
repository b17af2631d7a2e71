"""Waiting on another process in the search tests (imported by the test modules beside it)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `cond` every 0.2 s; fail the test naming `what` after `timeout` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
