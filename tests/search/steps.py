"""Real training-step functions for `--step` in search tests."""

from __future__ import annotations

import os
import time


def fail_once(batch) -> None:
    """Raise on the first call after the flag file appears (then remove it): one trial
    of a study fails for real, the next ones run."""
    flag = os.environ.get("AUTOTUNE_TEST_FAIL_FLAG")
    if flag and os.path.exists(flag):
        os.unlink(flag)
        raise RuntimeError("injected step failure")
    time.sleep(0.005)


def always_fail(batch) -> None:
    """A step with a bug: raises the same error in every configuration."""
    raise ValueError("shapes do not match: a bug in the step")
