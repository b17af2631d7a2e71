"""What autotune.DataLoader may tune without changing the user's samples: an
IterableDataset keeps the user's worker count; a dataset set up by worker_init_fn is never
run in this process; timeout= reaches only pools with workers; a second iter() inside an
epoch leaves the live epoch alone; a kept pool whose workers died between epochs (a Ctrl-C)
is replaced. A plain torch DataLoader with the same arguments is the reference. Real worker
processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils.data import DataLoader as TorchLoader

import autotune
from autotune.online.config import Config
from autotune.online.failure import PoolFailure
from autotune.online.fallback import fallback
from online_datasets import (Epochal, EpochStream, Scheduled, Slow, Stream, Unsplit,
                             WorkerOnly, open_handle)

HERE = os.path.dirname(os.path.abspath(__file__))


def _batches(loader):
    return [b.flatten().tolist() for b in loader]


# ---- 1. an IterableDataset: the worker count is part of what the samples are

@pytest.mark.parametrize("make, kw", [
    (lambda: Unsplit(200), {}),                                   # torch: 0 workers, 200
    (lambda: Unsplit(200), {"num_workers": 2}),                   # torch: 400, each twice
    (lambda: Stream(90, 0), {"drop_last": True}),                 # 88, not 80
    (lambda: Stream(90, 0), {}),                                  # one partial batch
    (lambda: Stream(90, 0), {"drop_last": True, "num_workers": 2}),
])
def test_an_iterable_dataset_yields_what_torchs_loader_yields(make, kw, decisions):
    ref = [_batches(TorchLoader(make(), batch_size=8, **kw)) for _ in range(2)]
    loader = autotune.DataLoader(make(), batch_size=8, **kw)
    got, workers = [], set()
    for _ in range(2):
        epoch = []
        for b in loader:
            epoch.append(b.flatten().tolist())
            workers.add(loader.num_workers)
        got.append(epoch)
    loader.close()
    assert got == ref
    assert workers == {kw.get("num_workers", 0)}
    assert "num_workers" not in loader.tuned_kwargs
    said = [r.getMessage() for e, r in decisions() if e == "iterable"]
    assert len(said) == 1 and "IterableDataset" in said[0], said


def test_an_iterable_datasets_kept_workers_are_never_replaced(decisions):
    """num_workers and persistent_workers=True given: the workers are the user's to keep,
    and with them the dataset as it was when they started (torch's: a set_epoch does not
    reach them). A pool for another prefetch_factor would start new workers at an epoch
    boundary, and what an epoch yields would depend on whether the tuner switched there."""
    def run(cls):
        ds = EpochStream(120, 0.002)
        loader = cls(ds, batch_size=4, num_workers=2, persistent_workers=True)
        epochs = []
        for e in range(3):
            ds.set_epoch(e)
            epochs.append(_batches(loader))
        return epochs, loader

    ref, _ = run(TorchLoader)
    got, loader = run(autotune.DataLoader)
    loader.close()
    assert got == ref
    said = [r.getMessage() for e, r in decisions() if e == "iterable"]
    assert len(said) == 1 and "persistent_workers=True" in said[0], said


@pytest.mark.parametrize("leave_at", [None, 14])
def test_an_iterable_trial_an_epoch_is_too_short_to_measure_goes_back(decisions, leave_at):
    """240 samples, batches of 16, 2 workers: 16 batches an epoch. A trial of prefetch 4
    starts new workers at an epoch boundary, up to whose first 8 batches are not counted,
    and a window needs 16: it ran for good, while tuned_kwargs named prefetch 2 (a user's
    walk in a container, on WebDataset shards). It goes back after one such epoch, said;
    also where the loop leaves every epoch after 14 batches."""
    loader = autotune.DataLoader(Stream(240, 0.002), batch_size=16, num_workers=2)
    runs = []
    for _ in range(4):
        seen = []
        for k, b in enumerate(loader):
            seen += [int(v) for v in b[:, 0]]
            if k + 1 == leave_at:
                break
        assert leave_at or sorted(seen) == list(range(240))
        runs.append(loader._epoch.epoch_cfg.prefetch_factor)
    loader.close()
    said = [r.getMessage() for e, r in decisions() if e == "unmeasured"]
    tried = [r.autotune["config"] for e, r in decisions() if e == "try"]
    # A trial always begins: with no step the wait share is ~1 however busy the machine,
    # and the first epoch's 16 batches less its queue close a window (checked under three
    # CPU hogs on 2 cores).
    assert tried, [r.getMessage() for _, r in decisions()]
    assert 4 in runs, runs   # the trial ran an epoch
    assert len(said) == 1 and "too short to measure" in said[0], said
    assert runs[-1] == loader.tuned_kwargs["prefetch_factor"] == 2, (runs, said)


def test_an_iterable_dataset_warns_of_worker_settings_without_workers():
    with pytest.warns(UserWarning, match="num_workers"):
        loader = autotune.DataLoader(Unsplit(16), batch_size=8, prefetch_factor=4)
    assert _batches(loader) == [list(range(8)), list(range(8, 16))]
    loader.close()


# ---- 2. a dataset that works only inside workers (worker_init_fn)

@pytest.mark.parametrize("kw", [{}, {"memory_budget": 1}, {"shuffle": True}])
def test_a_dataset_set_up_by_worker_init_fn_never_runs_here(kw):
    """The first batch is not made in this process, and no budget takes the loader down to
    num_workers=0, where worker_init_fn never runs."""
    def gen():
        return torch.Generator().manual_seed(3) if kw.get("shuffle") else None

    ref = _batches(TorchLoader(WorkerOnly(64), batch_size=8, worker_init_fn=open_handle,
                               num_workers=2, generator=gen(), shuffle=kw.get("shuffle")))
    loader = autotune.DataLoader(WorkerOnly(64), batch_size=8, worker_init_fn=open_handle,
                                 generator=gen(), **kw)
    got, workers = [], set()
    for b in loader:
        got.append(b.flatten().tolist())
        workers.add(loader.num_workers)
    loader.close()
    assert got == ref
    assert 0 not in workers


def test_a_fallback_keeps_a_worker_when_worker_init_fn_is_given():
    """Down to one worker first; then, with no num_workers given, this process, as torch's
    default would run it (a 64 MiB /dev/shm that no worker's batches fit must not end the
    run); with num_workers given, nothing less."""
    loader = autotune.DataLoader(WorkerOnly(64), batch_size=8, worker_init_fn=open_handle)
    killed = PoolFailure("killed", "worker killed: pid 1 by SIGKILL")
    to = fallback(loader, Config(2, 2, True, False), killed)
    assert to is not None and to.num_workers >= 1
    last = fallback(loader, Config(1, 1, True, False), killed)
    assert last is not None and last.num_workers == 0
    loader.close()
    given = autotune.DataLoader(WorkerOnly(64), batch_size=8, worker_init_fn=open_handle,
                                num_workers=1)
    assert fallback(given, Config(1, 1, True, False), killed) is None
    given.close()
    loader.close()


# ---- 3. timeout= applies to pools with workers only

@pytest.mark.parametrize("make", [lambda: Slow(64, 0), lambda: Stream(64, 0)])
def test_timeout_does_not_reach_a_pool_without_workers(make):
    loader = autotune.DataLoader(make(), batch_size=8, timeout=5)
    got = [_batches(loader) for _ in range(2)]
    loader.close()
    assert got == [_batches(TorchLoader(make(), batch_size=8))] * 2


# ---- 4. a second iterator inside a live epoch

def test_a_second_iterator_leaves_the_live_epoch_alone():
    """`peek = next(iter(dl))` inside the loop: the live epoch goes on to its end, and the
    peek, the epoch and the next epoch are those of torch's loader (same generator draws)."""
    def run(cls, **kw):
        loader = cls(Slow(200, 0), batch_size=4, shuffle=True,
                     generator=torch.Generator().manual_seed(7), **kw)
        if cls is autotune.DataLoader:
            loader._force_config(2, 2)
        epochs, peeks = [], []
        for _ in range(2):
            epoch = []
            for i, b in enumerate(loader):
                epoch.append(b.flatten().tolist())
                if i == 10:
                    peeks.append(next(iter(loader)).flatten().tolist())
            epochs.append(epoch)
        if cls is autotune.DataLoader:
            loader.close()
        return epochs, peeks

    ref = run(TorchLoader)
    got = run(autotune.DataLoader, _controller=False)
    assert len(got[0][0]) == 50
    assert got == ref


def test_an_epoch_left_early_still_gives_way_to_the_next():
    loader = autotune.DataLoader(Slow(80, 0), batch_size=4, _controller=False)
    loader._force_config(2, 2)
    for i, _ in enumerate(loader):
        if i == 3:
            break
    got = _batches(loader)
    assert got == _batches(TorchLoader(Slow(80, 0), batch_size=4))
    assert loader.num_workers == 2  # the tuned pool serves it, not a plain loader
    loader.close()


def test_a_peek_inside_an_iterable_datasets_epoch_is_served():
    """An IterableDataset's reference loader has a batch_sampler too: the second iterator
    must not hand it to torch (which refuses one for an IterableDataset)."""
    loader = autotune.DataLoader(Stream(40, 0), batch_size=4, _controller=False)
    epoch, peek = [], None
    for i, b in enumerate(loader):
        epoch.append(b.flatten().tolist())
        if i == 2:
            peek = next(iter(loader)).flatten().tolist()
    loader.close()
    assert peek == [0, 1, 2, 3]
    assert epoch == _batches(TorchLoader(Stream(40, 0), batch_size=4))


def test_next_epochs_taken_with_next_and_a_rebound_iterator_are_tuned_epochs(caplog):
    """`it = iter(loader)` then len(loader) next(it) calls, each epoch: the old iterator
    never saw StopIteration and is still held while iter() runs, but it is gone by the
    first next(): each epoch is a tuned one (the tuned pool serves it), never a plain
    second iterator beside an abandoned epoch."""
    loader = autotune.DataLoader(Slow(40, 0), batch_size=4, _controller=False)
    loader._force_config(2, 2)
    epochs = []
    with caplog.at_level("WARNING", logger="autotune.online"):
        for _ in range(3):
            it = iter(loader)
            epochs.append([next(it).flatten().tolist() for _ in range(len(loader))])
    workers = loader.num_workers
    loader.close()
    assert epochs == [_batches(TorchLoader(Slow(40, 0), batch_size=4))] * 3
    assert workers == 2
    assert not [r for r in caplog.records if "inside a live epoch" in r.getMessage()]


# ---- 5. a kept pool whose workers ended between epochs

_CTRL_C = textwrap.dedent("""
    import json, os, signal, sys, time
    import psutil
    import autotune
    from online_datasets import Slow

    dl = autotune.DataLoader(Slow(200, 0.001), batch_size=4, _controller=False)
    dl._force_config(2, 2)
    try:
        for i, b in enumerate(dl):
            if i == 30:
                os.killpg(os.getpgid(0), signal.SIGINT)  # a terminal's Ctrl-C
                time.sleep(2)
        sys.exit("not interrupted")
    except KeyboardInterrupt:
        pass
    got = sorted(x for b in dl for x in b.flatten().tolist())
    workers = dl.num_workers
    dl.close()
    left = [c.pid for c in psutil.Process().children(recursive=True)
            if c.status() != psutil.STATUS_ZOMBIE]
    print(json.dumps({"got": got, "workers": workers, "left": left}))
""")


def test_an_epoch_after_a_caught_ctrl_c_runs(tmp_path):
    env = dict(os.environ, AUTOTUNE_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([os.getcwd(), HERE, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", _CTRL_C], env=env, capture_output=True,
                         text=True, timeout=120, start_new_session=True)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["got"] == list(range(200))
    assert r["workers"] == 2
    assert r["left"] == []


# ---- a map-style dataset with set_epoch: no worker kept across epochs

@pytest.mark.parametrize("given", [{}, {"persistent_workers": True}])
def test_a_dataset_with_set_epoch_is_seen_at_its_epoch_by_every_worker(given):
    """The tuner turns persistent_workers on for speed; a kept worker holds the dataset as
    it was, and a set_epoch in the loop would not reach it. Given by the user, it is theirs."""
    ds = Epochal(32)
    dl = autotune.DataLoader(ds, batch_size=4, _controller=False, **given)
    dl._force_config(2, 2)        # workers from the first batch boundary on
    seen = []
    for e in range(3):
        ds.set_epoch(e)
        seen.append(sorted({int(b[1]) for batch in dl for b in batch}))
    persistent = dl.persistent_workers
    dl.close()
    if given:
        assert persistent is True and seen[2] != [2]   # as torch does with it: kept, stale
    else:
        assert persistent is False and seen == [[0], [1], [2]]


def test_a_dataset_the_loop_changes_between_epochs_gets_new_workers_only_then(decisions):
    """torch's default starts new workers every epoch, so `dataset.size = 160` between
    epochs reaches them; the tuner's kept workers would go on with the old size. The
    pool is kept while the dataset is unchanged, and replaced in the epoch it changed."""
    ds = Scheduled(32)
    dl = autotune.DataLoader(ds, batch_size=4, _controller=False)
    dl._force_config(2, 2)        # workers from the first batch boundary on
    seen, pids = [], []
    plan = [(0, 0), (0, 0), (1, 0), (1, 0), (1, 2)]   # (size, aug.level) of each epoch
    for size, level in plan:
        ds.size = size
        ds.aug.level = level
        seen.append(sorted({(int(b[1]), int(b[2])) for batch in dl for b in batch}))
        pids.append(tuple(sorted(dl._pools[0].pids())))
    persistent = dl.persistent_workers
    dl.close()
    assert seen == [[p] for p in plan], seen
    assert persistent is True
    # Kept across the unchanged epochs (1 and 3), new where the dataset changed (2 and 4).
    assert pids[1] == pids[0] and pids[3] == pids[2], pids
    assert len({pids[0], pids[2], pids[4]}) == 3, pids
    changed = [r.autotune["changed"] for e, r in decisions() if e == "dataset-changed"]
    assert changed == ["dataset.size", "dataset.aug.level"], changed


def test_workers_the_user_keeps_are_not_replaced_once_the_loop_changed_the_dataset(decisions):
    """num_workers and persistent_workers=True given: torch keeps the workers, and they go
    on with the dataset as it was when they started. A switch to another prefetch_factor
    starts new workers: while the dataset is unchanged that changes nothing, but after the
    loop changed it they would see the change (a KeyError where torch's have none, another
    image size): no switch then, said once."""
    force = {(0, 2): (2, 3), (1, 2): (2, 4)}

    def run(cls, **kw):
        ds = Scheduled(32)
        dl = cls(ds, batch_size=4, num_workers=2, persistent_workers=True, **kw)
        seen = []
        for e in range(3):
            ds.size = e
            epoch = []
            for i, batch in enumerate(dl):
                if cls is autotune.DataLoader and (e, i) in force:
                    dl._force_config(*force[(e, i)])
                epoch.append(batch.tolist())
            seen.append(epoch)
        return seen, dl

    ref, _ = run(TorchLoader)
    got, dl = run(autotune.DataLoader, _controller=False)
    prefetch = dl.prefetch_factor
    dl.close()
    assert got == ref
    assert prefetch == 3          # the switch before any change was made
    kept = [r.getMessage() for e, r in decisions() if e == "kept-workers"]
    assert len(kept) == 1 and "dataset.size" in kept[0], kept


def test_a_cached_start_at_no_workers_still_gives_a_worker_init_fn_its_workers():
    """The cache (keyed by the dataset, not by the loader's arguments) may hold a start
    at num_workers=0 from a run without a worker_init_fn: this loader starts in workers."""
    from autotune.cpus import usable_cores
    from autotune.online import cache

    ds = WorkerOnly(64)
    cache.store(cache.dataset_key(ds, None, 8, usable_cores()),
                {"num_workers": 0, "prefetch_factor": None})
    loader = autotune.DataLoader(ds, batch_size=8, worker_init_fn=open_handle)
    start = loader._target
    got = sorted(x for b in loader for x in b.flatten().tolist())
    loader.close()
    assert start.num_workers >= 1
    assert got == list(range(64))


def test_the_start_line_names_the_workers_given_as_given(decisions, tmp_path, monkeypatch):
    """An IterableDataset's num_workers are the user's, kept: the start line said they came
    from the rule of thumb (a user's review: "num_workers=2 (the rule of thumb ...)")."""
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    loader = autotune.DataLoader(Stream(40, 0), batch_size=4, num_workers=2)
    [start] = [r.getMessage() for e, r in decisions() if e == "start"]
    assert "num_workers=2" in start and "num_workers as given" in start, start
    assert "rule of thumb" not in start, start
    loader.close()
