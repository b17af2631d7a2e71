"""Conversion workers read the converter's environment, not the fork server's: the fork
server keeps the environment of the moment it started (an earlier conversion in a
long-lived process), so credentials set since were missing in the workers (seen in CI:
"no credentials" from a bucket conversion with 2 workers, after an earlier test had
started the fork server)."""

from __future__ import annotations

import multiprocessing as mp
import os
from functools import partial

from autotune_converters.pool import WorkerPool


def _run(ctx, name: str) -> str | int:
    """The worker's value of `name` (os.getenv(name, unit): the unit 0 when unset).
    partial(os.getenv): importable by reference in the fork server's children."""
    pool = WorkerPool(1, partial(os.getenv, name), ctx)
    try:
        return [out for _, out in pool.run([0], window=1)][0]
    finally:
        pool.close()


def test_workers_see_credentials_set_after_the_fork_server_started(monkeypatch) -> None:
    ctx = mp.get_context("forkserver")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.setenv("AWS_PROFILE", "old")
    assert _run(ctx, "AWS_PROFILE") == "old"     # the fork server is running from here on
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIA-set-later")
    monkeypatch.delenv("AWS_PROFILE")
    assert _run(ctx, "AWS_ACCESS_KEY_ID") == "AKIA-set-later"   # set since
    assert _run(ctx, "AWS_PROFILE") == 0                         # unset since
