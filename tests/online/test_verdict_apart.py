"""The verdict's time budget describes the loader at work, not at rest.

A validation loader is iterated for a moment between the training loop's epochs; the burst
that samples its workers' time budget (3 s, a process of its own) saw them idle while the
training ran and the verdict said "loader-configuration-bound (main process): the 2 workers
are idle 90% of their time", about workers that were busy decoding whenever the loop took
batches from them (a 30-epoch run in a container, review long-run). A pool not kept
between epochs (an IterableDataset) is replaced by new workers the sample does not count:
"the 1 worker ... too few workers" about 2. Such a sample is not the verdict's: a fresh
one is taken, and when none describes the loader the verdict says the budget is missing
and why.
"""

from __future__ import annotations

import time

import pytest
from torch.utils.data import IterableDataset, get_worker_info

import autotune
from online_datasets import Burn


class _BurnStream(IterableDataset):
    """`n` items, each after `cost_s` of CPU, split between the workers."""

    def __init__(self, n: int, cost_s: float) -> None:
        self.n, self.cost_s = n, cost_s

    def __iter__(self):
        info = get_worker_info()
        k, w = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(k, self.n, w):
            end = time.perf_counter() + self.cost_s
            while time.perf_counter() < end:
                pass
            yield i


def _verdict(loader, decisions, gap_s: float, seconds: float = 180.0) -> dict:
    """Epochs until the loader's verdict, `gap_s` of someone else's work after each: the
    one verdict said. `seconds` only guards against a verdict that never comes: the one
    between epochs took 35 s alone here, 47-55 s beside a spinning core (settling, then
    three bursts of 3 s that each see the loader at rest), and a 50 s guard failed CI on
    a busy machine."""
    deadline = time.perf_counter() + seconds
    while loader.verdict is None and time.perf_counter() < deadline:
        for _ in loader:
            pass
        time.sleep(gap_s)
    loader.close()
    verdicts = [r for e, r in decisions() if e == "verdict"]
    assert len(verdicts) == 1, [r.getMessage() for r in verdicts]
    return verdicts[0].autotune["verdict"]


@pytest.mark.slow
@pytest.mark.alone
def test_a_loader_idle_between_its_epochs_is_not_called_main_process_bound(decisions):
    # 5 batches of decode (about 0.2 s on 2 workers), then 1.2 s of the training epoch.
    v = _verdict(autotune.DataLoader(Burn(20, 0.02), batch_size=4, num_workers=2),
                 decisions, gap_s=1.2)
    assert v["bottleneck"] != "loader", v["summary"]
    assert "main process" not in v["summary"], v["summary"]
    assert any("the loop took batches from this loader" in line for line in v["evidence"]), v


@pytest.mark.slow
@pytest.mark.alone
def test_workers_replaced_at_each_epoch_are_not_counted_as_one(decisions):
    # An IterableDataset keeps persistent_workers=False: new workers every 1.5 s epoch.
    v = _verdict(autotune.DataLoader(_BurnStream(240, 0.01), batch_size=4, num_workers=2),
                 decisions, gap_s=0.0)
    assert "the 1 worker" not in v["summary"], v["summary"]
    assert any("replaced by another pool" in line for line in v["evidence"]), v


def test_a_batch_slower_than_the_burst_counts_for_the_part_inside_it():
    # Behind a slow disk no batch ends within the 3 s burst: the one that ends after it was
    # the loop's time in this loader for the whole window. Credited only when a batch ended
    # inside the window, every such burst read "0.0 s of 3.0 s" and was thrown away, and the
    # storage verdict and the worker bound with it.
    from types import SimpleNamespace

    from autotune.online.budget import Budget

    now = time.perf_counter()
    b = SimpleNamespace(burst=SimpleNamespace(started=now - 5.0, seconds=3.0), busy=0.0)
    Budget.credit(b, step=0.1, wait=9.9)          # a batch that waited 10 s, ending now
    assert b.busy == pytest.approx(3.0, abs=0.05)
    b.busy = 0.0
    Budget.credit(b, step=None, wait=0.5)          # wholly after the window: none of it
    assert b.busy == 0.0
    b.burst = SimpleNamespace(started=now - 1.0, seconds=3.0)
    Budget.credit(b, step=0.2, wait=0.3)           # inside the window: all of it
    assert b.busy == pytest.approx(0.5, abs=0.05)
