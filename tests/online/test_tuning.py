"""The controller at work in a real loop: decisions logged, tuned_kwargs, the first epoch's
summary, the memory budget against the workers' real PSS, no thread of its own."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

import autotune
from autotune.cpus import usable_cores
from autotune.online import cache, controller
from autotune.online.config import TUNED
from autotune.online.memory import footprint
from online_datasets import Slow


def test_decisions_tuned_kwargs_and_summary(decisions):
    loader = autotune.DataLoader(Slow(240, 0.002), batch_size=4, shuffle=True,
                                 persistent_workers=True, key="tuning-test")
    for _ in range(3):
        for _ in loader:
            time.sleep(0.004)
            names = {t.name for t in threading.enumerate()} - {"MainThread"}
            # torch's own queue feeders only: the loader runs no thread of its own.
            assert names <= {"QueueFeederThread"}
    loader.close()
    recs = decisions()
    events = [e for e, _ in recs]
    assert all(e is not None for e in events)  # one record per decision, each labelled
    assert events[0] == "start" and "settle" in events and events.count("summary") == 1
    summary = next(r for e, r in recs if e == "summary").getMessage()
    assert summary.startswith("first epoch: ") and " wait " in summary and "x" in summary
    assert loader.summary in summary
    kw = loader.tuned_kwargs
    assert "persistent_workers" not in kw and set(kw) <= set(TUNED)
    settled = [r for e, r in recs if e == "settle"][-1].autotune["config"]
    assert kw == {k: v for k, v in settled.items() if k in kw}
    assert kw["num_workers"] >= 1


def test_given_settings_are_not_tuned(decisions):
    loader = autotune.DataLoader(Slow(40, 0.0), batch_size=4, num_workers=0)
    assert [len(b) for b in loader] == [4] * 10
    # pin_memory is tuned only where CUDA is present.
    cuda = torch.cuda.is_available()
    assert loader.num_workers == 0
    assert loader.tuned_kwargs == ({"pin_memory": True} if cuda else {})
    assert not [e for e, _ in decisions() if e in ("try", "switched")]


@pytest.mark.slow
def test_memory_budget_too_small_for_a_second_worker_keeps_one(monkeypatch, decisions):
    monkeypatch.setattr(controller, "_worker_bound", lambda: 4)
    ds = Slow(400, 0.002)
    key = cache.dataset_key(ds, "budget-test", 4, usable_cores())
    cache.store(key, {"num_workers": 1, "prefetch_factor": 2})
    loader = autotune.DataLoader(ds, batch_size=4, prefetch_factor=2, key="budget-test")
    it = iter(loader)
    next(it)
    mem = loader._memory()
    assert mem.measured and mem.per_worker > 0  # read from the worker's smaps_rollup
    one = footprint(1, 2, mem.per_worker, mem.per_batch)
    # Room for one worker twice over; a second needs three alive during the switch.
    loader.memory_budget = 2 * one
    workers = set()
    for _ in it:
        workers.add(loader.num_workers)
    for _ in range(2):
        for _ in loader:
            workers.add(loader.num_workers)
    loader.close()
    assert workers == {1}
    refusals = [r.getMessage() for e, r in decisions() if e == "bound"]
    assert any("over the memory budget" in m and "num_workers=2" in m for m in refusals)
    assert "settle" in [e for e, _ in decisions()]


def test_step_lines_through_instrument(tmp_path):
    """`autotune.instrument` wraps it like any loader: the step lines `analyze` reads."""
    log = tmp_path / "steps.jsonl"
    loader = autotune.DataLoader(Slow(40, 0.0), batch_size=4, _controller=False)
    for _ in autotune.instrument(loader, log=str(log)):
        pass
    loader.close()
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    steps = [x for x in lines if "wait_s" in x]
    assert len(steps) == 10
    assert "num_workers" in json.dumps(lines[0])


def test_input_bound_after_tuning_says_why_once(decisions):
    """Workers that sleep in __getitem__ (a slow read) and a loop with no step: no setting
    reaches AU 0.90; the loader says once that the workers are off the CPU, waiting."""
    loader = autotune.DataLoader(Slow(200, 0.004), batch_size=4)
    for _ in range(3):
        for _ in loader:
            pass
    loader.close()
    verdicts = [r for e, r in decisions() if e == "verdict"]
    assert len(verdicts) == 1
    assert verdicts[0].autotune["bottleneck"] == "storage"
    assert "off the CPU" in verdicts[0].getMessage()
