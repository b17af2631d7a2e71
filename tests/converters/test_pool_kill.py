"""A conversion worker killed in the middle of reporting progress cannot block the parent.

Seen in CI: `convert --on-error fail` with 2 workers hung until the test's 300 s timeout.
One worker's unit failed; the pool killed the other, which was inside the shared counter's
lock at that moment; the parent's next read of the counter (for the run's figures) waited
on that lock forever. The counter now has one pair of slots per worker and no lock."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

import pytest

from autotune_converters.pool import WorkerPool
from autotune_converters.records import report_progress


def _work(unit: int) -> None:
    """Unit 0 fails after a moment; every other unit reports progress until it is killed
    (so the kill lands mid-update, where the old counter held its lock)."""
    if unit == 0:
        time.sleep(0.5)
        raise ValueError("unit 0 is unreadable")
    while True:
        report_progress(1, 1)


def test_a_worker_killed_while_reporting_progress_does_not_block_the_parent() -> None:
    pool = WorkerPool(2, _work, mp.get_context("forkserver"))
    with pytest.raises(ValueError, match="unit 0 is unreadable"):
        try:
            for _ in pool.run([0, 1], window=2):
                pass
        finally:
            pool.close(kill=True)
    seen: list[tuple[int, int]] = []
    reader = threading.Thread(target=lambda: seen.append((pool.progress[0], pool.progress[1])),
                              daemon=True)
    reader.start()
    reader.join(10)
    assert seen, "reading the progress of a killed pool blocked"
    samples, nbytes = seen[0]
    assert samples > 0 and nbytes in (samples, samples - 1)   # maybe killed between the adds
