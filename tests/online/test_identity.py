"""The index sequence and the RNG states after each epoch equal a plain torch DataLoader's,
over 3 epochs with forced pool switches (real worker processes)."""

from __future__ import annotations

import os
import time

import psutil
import pytest
import torch
from torch.utils.data import DataLoader as TorchLoader, DistributedSampler

import autotune
from online_datasets import EveryThird, Forever, Pairs, Slow, Stream

# (epoch, batch) -> configuration forced at that batch boundary.
FORCE = {(0, 2): (0,), (0, 20): (1, 3), (1, 3): (2, 2), (1, 22): (0,),
         (2, 2): (1, 2), (2, 20): (2, 4)}


def _flat(batch):
    return batch.flatten().tolist() if torch.is_tensor(batch) else [int(batch)]


def _epochs(loader, gen, epochs=3, force=None):
    seqs, states = [], []
    for e in range(epochs):
        seq = []
        for i, b in enumerate(loader):
            if force and (e, i) in force:
                loader._force_config(*force[(e, i)])
            seq.append(_flat(b))
        seqs.append(seq)
        states.append((torch.get_rng_state(), None if gen is None else gen.get_state()))
    return seqs, states


def _both(make_args, epochs=3, force=FORCE, seed=11):
    """Run the plain DataLoader and ours from the same seeds; return both runs."""
    out = []
    for cls in (TorchLoader, autotune.DataLoader):
        torch.manual_seed(seed)
        args, kw, gen = make_args()
        if cls is autotune.DataLoader:
            kw = dict(kw, _controller=False)
        loader = cls(*args, **kw)
        out.append(_epochs(loader, gen, epochs, force if cls is autotune.DataLoader else None))
        if cls is autotune.DataLoader:
            loader.close()
    return out


def _same(plain, ours):
    (ps, pst), (os_, ost) = plain, ours
    assert os_ == ps
    for (pr, pg), (orr, og) in zip(pst, ost):
        assert torch.equal(pr, orr), "torch's global RNG differs after an epoch"
        if pg is not None:
            assert torch.equal(pg, og), "the generator's state differs after an epoch"


def _switches(decisions):
    return [r for e, r in decisions() if e == "switched"]


def test_shuffle_with_generator(decisions):
    def make():
        g = torch.Generator()
        g.manual_seed(5)
        return (Slow(160, 0.002),), dict(batch_size=4, shuffle=True, generator=g), g
    plain, ours = _both(make)
    _same(plain, ours)
    assert len(_switches(decisions)) >= 4
    flat = [i for b in ours[0][1] for i in b]
    assert sorted(flat) == list(range(160))  # no sample lost or repeated in a switched epoch


def test_shuffle_on_global_rng_and_drop_last(decisions):
    def make():
        return (Slow(158, 0.002),), dict(batch_size=4, shuffle=True, drop_last=True), None
    plain, ours = _both(make)
    _same(plain, ours)
    assert len(_switches(decisions)) >= 4


def test_custom_sampler_drawing_lazily(decisions):
    def make():
        return (Slow(240, 0.002),), dict(batch_size=2, sampler=EveryThird(240)), None
    plain, ours = _both(make)
    _same(plain, ours)
    assert len(_switches(decisions)) >= 4


def test_batch_sampler(decisions):
    def make():
        g = torch.Generator()
        g.manual_seed(9)
        return (Slow(100, 0.004),), dict(batch_sampler=Pairs(100, g), generator=g), g
    plain, ours = _both(make)
    _same(plain, ours)
    assert len(_switches(decisions)) >= 4


def test_no_auto_collation():
    def make():
        g = torch.Generator()
        g.manual_seed(3)
        return (Slow(60, 0.002),), dict(batch_size=None, shuffle=True, generator=g), g
    plain, ours = _both(make, force={(0, 5): (1, 2), (1, 4): (0,), (2, 3): (2, 2)})
    _same(plain, ours)


def test_user_persistent_workers_draw_one_seed(decisions):
    """With the user's num_workers=2, persistent_workers=True torch draws the base seed in
    the first epoch only; the prefetch_factor switches must not change that."""
    def make():
        g = torch.Generator()
        g.manual_seed(4)
        return (Slow(80, 0.002),), dict(batch_size=4, shuffle=True, generator=g,
                                        num_workers=2, persistent_workers=True), g
    plain, ours = _both(make, force={(0, 3): (2, 3), (1, 3): (2, 2), (2, 3): (2, 4)})
    _same(plain, ours)
    assert len(_switches(decisions)) >= 2


def test_infinite_sampler_first_batches():
    n = 60
    out = []
    for cls in (TorchLoader, autotune.DataLoader):
        kw = {"_controller": False} if cls is autotune.DataLoader else {}
        loader = cls(Slow(n, 0.002), batch_size=3, sampler=Forever(n, 1), **kw)
        it, seq = iter(loader), []
        for i in range(45):
            if cls is autotune.DataLoader and i in (3, 20, 30):
                loader._force_config(*{3: (0,), 20: (1, 2), 30: (2, 2)}[i])
            seq.append(_flat(next(it)))
        out.append(seq)
        if cls is autotune.DataLoader:
            loader.close()
    assert out[0] == out[1]
    with pytest.raises(TypeError):
        len(autotune.DataLoader(Slow(n), sampler=Forever(n, 1), _controller=False))


def test_distributed_sampler_set_epoch():
    ds = Slow(40, 0.001)
    runs = []
    for cls in (TorchLoader, autotune.DataLoader):
        kw = {"_controller": False} if cls is autotune.DataLoader else {}
        sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=3)
        loader = cls(ds, batch_size=4, sampler=sampler, **kw)
        assert len(loader) == 5
        seqs = []
        for epoch in range(3):
            loader.sampler.set_epoch(epoch)
            seqs.append([_flat(b) for b in loader])
        runs.append(seqs)
        if cls is autotune.DataLoader:
            loader.close()
    assert runs[0] == runs[1]
    assert runs[1][0] != runs[1][1]  # set_epoch reached the sampler


def test_iterable_dataset_switches_at_epoch_boundaries(decisions):
    """Its num_workers is the user's (the worker count decides what it yields); what is
    tuned (the prefetch) changes only between epochs, and the batches stay torch's."""
    ref = [_flat(b) for b in TorchLoader(Stream(60, 0.001), batch_size=4, num_workers=2)]
    loader = autotune.DataLoader(Stream(60, 0.001), batch_size=4, num_workers=2,
                                 _controller=False)
    seen = []
    for epoch in range(3):
        prefetch = set()
        batches = []
        for i, b in enumerate(loader):
            if i == 2:
                loader._force_config(*[(2, 4), (2, 8), (2, 2)][epoch])
            prefetch.add(loader.prefetch_factor)
            batches.append(_flat(b))
        assert len(prefetch) == 1, "an IterableDataset must not switch inside an epoch"
        assert batches == ref
        seen.append(prefetch.pop())
    loader.close()
    assert seen == [2, 4, 8]
    # Each switch is logged when it takes effect, at the epoch boundary, not only decided.
    sw = [r for e, r in decisions() if e == "switched"]
    assert [r.autotune["config"]["prefetch_factor"] for r in sw] == [4, 8], \
        [r.getMessage() for r in sw]
    assert all("at the epoch boundary" in r.getMessage() for r in sw)


def _alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_old_workers_gone_after_switch(decisions):
    loader = autotune.DataLoader(Slow(200, 0.002), batch_size=4, _controller=False)
    loader._force_config(2, 2)
    it = iter(loader)
    next(it)
    old = loader._pools[-1].pids()
    assert len(old) == 2 and all(_alive(p) for p in old)
    loader._force_config(1, 2)
    while len(_switches(decisions)) < 1 or loader._pools[0].config.num_workers != 1:
        next(it)
    children = {c.pid for c in psutil.Process(os.getpid()).children(recursive=True)}
    assert not any(_alive(p) for p in old)
    assert not children & set(old)
    assert loader.retired and all(r == [] for r in loader.retired)
    loader.close()


@pytest.mark.slow
# forkserver passes through the same keyword as spawn; it stays in CI through
# test_spawned_workers_start_off_the_training_thread (marked extended here: 17 s).
@pytest.mark.parametrize("method", ["spawn", pytest.param("forkserver",
                                                         marks=pytest.mark.extended)])
def test_multiprocessing_context_honoured(method):
    # torch takes a multiprocessing_context only with workers: the user gives both here;
    # the forced switches change the pool all the same.
    def make():
        g = torch.Generator()
        g.manual_seed(2)
        return (Slow(48, 0.01),), dict(batch_size=4, shuffle=True, generator=g, num_workers=1,
                                       multiprocessing_context=method), g
    plain, ours = _both(make, epochs=2, force={(0, 1): (2, 2), (1, 1): (1, 3)})
    _same(plain, ours)
    loader = autotune.DataLoader(Slow(48, 0.01), batch_size=4, multiprocessing_context=method,
                                 _controller=False)
    loader._force_config(1, 2)
    for _ in range(2):  # the new pool may come up only by the next epoch: spawn is slow
        for _ in loader:
            ctx = loader._pools[-1].loader.multiprocessing_context
    assert loader.num_workers == 1 and ctx.get_start_method() == method
    loader.close()


def test_epoch_left_early_then_full_epochs():
    """A loop that breaks out and starts again: torch starts a new iterator (a new base seed,
    the sampler from its start); so does this one, switches included."""
    runs = []
    for cls in (TorchLoader, autotune.DataLoader):
        torch.manual_seed(8)
        g = torch.Generator()
        g.manual_seed(6)
        kw = {"_controller": False} if cls is autotune.DataLoader else {}
        loader = cls(Slow(80, 0.002), batch_size=4, shuffle=True, generator=g, **kw)
        seqs = []
        for i, b in enumerate(loader):
            seqs.append(_flat(b))
            if i == 1 and cls is autotune.DataLoader:
                loader._force_config(1, 2)
            if i == 6:
                break
        for _ in range(2):
            seqs.append([_flat(b) for b in loader])
        runs.append((seqs, torch.get_rng_state(), g.get_state()))
        if cls is autotune.DataLoader:
            loader.close()
    assert runs[0][0] == runs[1][0]
    assert torch.equal(runs[0][1], runs[1][1]) and torch.equal(runs[0][2], runs[1][2])


def test_user_non_persistent_workers_are_fresh_each_epoch():
    loader = autotune.DataLoader(Slow(40, 0.001), batch_size=4, persistent_workers=False,
                                 _controller=False)
    loader._force_config(2, 2)
    pids = []
    for _ in range(3):
        epoch_pids = set()
        for _ in loader:
            epoch_pids |= set(loader._pools[-1].pids())
        pids.append(epoch_pids)
    loader.close()
    assert pids[1] and pids[2] and not pids[1] & pids[2]
    assert not any(_alive(p) for s in pids for p in s)


class _Broken(Slow):
    def __getitem__(self, i):
        if i == 13:
            raise KeyError(f"item {i} is broken")
        return super().__getitem__(i)


def test_a_dataset_error_reaches_the_loop_as_with_torch():
    for w in (0, 2):
        loader = autotune.DataLoader(_Broken(40, 0.0), batch_size=4, _controller=False)
        loader._force_config(w, 2)
        with pytest.raises(KeyError, match="item 13 is broken"):
            for _ in loader:
                pass
        loader.close()


@pytest.mark.parametrize("given", [{}, {"num_workers": 2}])
@pytest.mark.parametrize("how", ["next", "break"])
def test_an_epoch_never_asked_past_its_last_batch_draws_what_torch_draws(how, given):
    """len(loader) next() calls, or a break at the last batch: the loop never asks past the
    epoch's end, so torch's loader without workers (the reference when num_workers is
    tuned) never draws the sampler's end, where RandomSampler draws one more randperm from
    the generator. The workers' prefetch must not draw it either: the generator's state,
    and with it every later epoch, would depend on the pool the tuner chose. With
    num_workers given, torch's own prefetch draws it: so does the loader's."""
    def run(cls, **kw):
        gen = torch.Generator().manual_seed(5)
        loader = cls(Slow(40, 0.0), batch_size=4, shuffle=True, generator=gen, **given, **kw)
        if cls is autotune.DataLoader and not given:
            loader._force_config(2, 2)
        epochs = []
        for _ in range(3):
            if how == "next":
                it = iter(loader)
                epochs.append([_flat(next(it)) for _ in range(len(loader))])
                del it
            else:
                epoch = []
                for i, b in enumerate(loader):
                    epoch.append(_flat(b))
                    if i == len(loader) - 1:
                        break
                epochs.append(epoch)
        if cls is autotune.DataLoader:
            loader.close()
        return epochs, gen.get_state()

    ref, ref_state = run(TorchLoader)
    got, got_state = run(autotune.DataLoader, _controller=False)
    assert got == ref
    assert torch.equal(got_state, ref_state), "the generator's state differs after an epoch"


class _Longer(torch.utils.data.Sampler):
    """Says 8 and yields 12: torch's loader yields all 12."""

    def __len__(self):
        return 8

    def __iter__(self):
        return iter(range(12))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sampler_longer_than_its_len_is_served_to_its_end(workers):
    loader = autotune.DataLoader(Slow(40, 0.0), batch_size=None, sampler=_Longer(),
                                 _controller=False)
    loader._force_config(workers, 2)
    got = [[_flat(b) for b in loader] for _ in range(2)]
    loader.close()
    ref = [_flat(b) for b in TorchLoader(Slow(40, 0.0), batch_size=None, sampler=_Longer())]
    assert got == [ref, ref] and len(ref) == 12


class _BrokenOnce(Slow):
    """Item 13 raises in the first epoch only (the loop catches it and goes on)."""

    broken = True

    def __getitem__(self, i):
        if i == 13 and self.broken:
            raise KeyError(f"item {i} is broken")
        return super().__getitem__(i)


@pytest.mark.parametrize("workers", [0, 2])
def test_the_epoch_after_a_caught_dataset_error_is_a_tuned_one(workers, caplog):
    """The user's exception leaves the epoch through the loader's frames; its traceback (a
    reference cycle, freed only by the garbage collector) must not keep the dead epoch
    "live": the next `for` is the next tuned epoch, not a plain second iterator beside it."""
    def run(cls, **kw):
        ds = _BrokenOnce(40, 0.0)
        loader = cls(ds, batch_size=4, **kw)
        if cls is autotune.DataLoader:
            loader._force_config(workers, 2)
        epochs = []
        for _ in range(3):
            epoch = []
            try:
                for b in loader:
                    epoch.append(b.flatten().tolist())
            except KeyError:
                epoch.append("KeyError")
            ds.broken = False
            epochs.append(epoch)
        return epochs, loader

    import gc
    gc.disable()  # the collector must not happen to free the cycle first
    try:
        with caplog.at_level("WARNING", logger="autotune.online"):
            got, loader = run(autotune.DataLoader, _controller=False)
            served = loader.num_workers
            loader.close()
    finally:
        gc.enable()
    ref, _ = run(TorchLoader)
    assert got == ref
    assert served == workers
    assert not [r for r in caplog.records if "inside a live epoch" in r.getMessage()]


def test_a_dropped_loader_stops_its_workers():
    loader = autotune.DataLoader(Slow(200, 0.002), batch_size=4, _controller=False)
    loader._force_config(2, 2)
    it = iter(loader)
    next(it)
    loader._force_config(1, 2)   # a new pool coming up as well
    next(it)
    pids = [p for pool in loader._pools + [loader._pending] if pool for p in pool.pids()]
    assert pids and all(_alive(p) for p in pids)
    del loader, it
    for _ in range(50):
        if not any(_alive(p) for p in pids):
            break
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def _slow_init(worker_id):
    time.sleep(1.0)


def test_old_pool_serves_while_the_new_one_comes_up(decisions):
    """Workers that take a second to start: the loop keeps getting the old pool's batches
    meanwhile (no stall), and none is lost or repeated."""
    loader = autotune.DataLoader(Slow(800, 0.004), batch_size=4, worker_init_fn=_slow_init,
                                 _controller=False)
    for epoch in range(2):  # a loaded machine may finish the first epoch before the switch
        seen = []
        for i, b in enumerate(loader):
            if i == 2 and epoch == 0:
                loader._force_config(1, 2)
            seen += _flat(b)
        assert sorted(seen) == list(range(800))
    loader.close()
    sw = _switches(decisions)
    assert len(sw) == 1 and sw[0].autotune["overlap_batches"] >= 3
    assert sw[0].autotune["startup_s"] >= 1.0  # it waited for worker_init_fn to finish



@pytest.mark.parametrize("ctx, off_thread", [("forkserver", True), ("fork", False)])
def test_spawned_workers_start_off_the_training_thread(ctx, off_thread):
    """Each spawn or forkserver Process.start waits for the new interpreter (about a second
    a worker: the training loop stalled for 2.5 s at a 1 -> 3 switch); those start on a
    thread of their own while the old pool serves. Forked ones start in the caller."""
    import threading

    import online_datasets as od

    del od.STARTED_FROM[:]
    context = od.RecordingForkServer() if ctx == "forkserver" else od.RecordingFork()
    # An epoch the old pool cannot finish before the new one is up, however slow the
    # machine (a CI run on a busy one ended 2,000 items before 3 forkserver workers started);
    # the test reads only a few batches past the switch.
    loader = autotune.DataLoader(Slow(200_000, 0.002), batch_size=4, num_workers=1,
                                 multiprocessing_context=context, _controller=False)
    it = iter(loader)
    next(it)
    first = list(od.STARTED_FROM)
    loader._force_config(3, 2)
    while loader._pools[-1].config.num_workers != 3 or loader._switch is not None:
        next(it)
    later = od.STARTED_FROM[len(first):]
    main = threading.main_thread().name
    assert first == [main]  # the first pool starts in the caller, as torch's does
    assert len(later) == 3
    assert all((name != main) == off_thread for name in later), later
    for _ in range(20):  # the epoch goes on on the new pool
        next(it)
    loader.close()
