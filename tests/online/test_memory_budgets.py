"""autotune.DataLoader's budgets (issue 30 review): the environment read once per loader, a
missing /dev/shm refusing every worker, an IterableDataset's share of the node under DDP,
and the same live-batch arithmetic and memory.oom.group divisor as search's gate.

Real loaders and workers; the environment is the real reading with one figure replaced
(a missing /dev/shm read for real from a path that does not exist, fixed sizes where the
shared machine's free memory would move between two loaders)."""

from __future__ import annotations

import dataclasses

import pytest

import autotune
import autotune.environment as environment
from autotune import shmfit
from autotune.online import memory
from online_datasets import Slow, Stream

MiB, GiB = 2**20, 2**30


def _recorded(**shm):
    """The real environment, with a fixed host memory and no cgroup limit (so two loaders
    see the same figures on a busy machine) and, if given, a replaced /dev/shm."""
    real = environment.read_environment()
    env = dataclasses.replace(real, host_available_bytes=8 * GiB,
                              memory=dataclasses.replace(real.memory, limit_bytes=None,
                                                         oom_group=False))
    if shm:
        env = dataclasses.replace(env, shm=environment.ShmSpace(**shm))
    return env


def test_the_environment_is_read_once_per_loader(monkeypatch):
    env = _recorded()
    calls = []

    def counted(*a, **k):
        calls.append(a)
        return env

    def no_second_read(*a, **k):
        raise AssertionError("the cgroup read again: the loader's reading has it")

    monkeypatch.setattr(environment, "read_environment", counted)
    monkeypatch.setattr(environment, "read_memory_limit", no_second_read)
    default = autotune.DataLoader(Slow(40, 0), batch_size=4)
    assert len(calls) == 1
    given = autotune.DataLoader(Slow(40, 0), batch_size=4, memory_budget=2**30)
    assert len(calls) == 2
    assert default._env is env and default._ctl.budget == 8 * GiB // 2
    for ld in (default, given):
        ld.close()


def test_a_missing_dev_shm_keeps_every_batch_in_the_process(monkeypatch):
    """No /dev/shm at all: the budget is 0, not unknown, and the loader never starts a
    worker (a worker could not hand a batch over); every sample still comes once."""
    env = _recorded()
    missing = dataclasses.replace(env, shm=environment.read_shm("/nonexistent-shmfix-dev-shm"))
    assert missing.shm_budget() == 0
    monkeypatch.setattr(environment, "read_environment", lambda *a, **k: missing)
    loader = autotune.DataLoader(Slow(400, 0.001), batch_size=4)
    assert loader._ctl.shm == 0
    seen, workers = [], set()
    for _ in range(2):
        for b in loader:
            seen.extend(b.flatten().tolist())
            workers.add(loader.num_workers)
    loader.close()
    assert sorted(seen) == sorted(list(range(400)) * 2)
    assert workers == {0}


def test_an_iterable_dataset_under_ddp_takes_its_ranks_share(monkeypatch):
    """No rank sync for an IterableDataset: the share of the node comes from
    LOCAL_WORLD_SIZE, for /dev/shm (after NCCL's segments where NCCL may run) and the default
    memory budget."""
    env = _recorded(path="/dev/shm", fstype="tmpfs", total_bytes=GiB, free_bytes=GiB)
    monkeypatch.setattr(environment, "read_environment", lambda *a, **k: env)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    alone = autotune.DataLoader(Stream(20, 0), batch_size=4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setattr("autotune.online.ddp.nccl_in_use", lambda: False)   # gloo's ranks
    rank = autotune.DataLoader(Stream(20, 0), batch_size=4)
    monkeypatch.setattr("autotune.online.ddp.nccl_in_use", lambda: True)
    nccl = autotune.DataLoader(Stream(20, 0), batch_size=4)
    assert alone._ctl.shm == GiB
    assert rank._ctl.shm == GiB // 4
    assert nccl._ctl.shm == (GiB - 4 * shmfit.NCCL_SHM_PER_RANK) // 4
    assert rank._ctl.budget == alone._ctl.budget // 4 == 8 * GiB // 2 // 4
    for ld in (alone, rank, nccl):
        ld.close()


def test_oom_group_divides_in_one_place(monkeypatch, decisions):
    """memory.oom.group=1: shmfit's budget (what search's gate uses too) is halved, and the
    loader takes it from there, not halving it a second time."""
    env = _recorded(path="/dev/shm", fstype="tmpfs", total_bytes=GiB, free_bytes=GiB)
    grouped = dataclasses.replace(env, memory=dataclasses.replace(env.memory, oom_group=True))
    assert shmfit.shm_budget(grouped).budget_bytes == GiB // 2
    assert shmfit.shm_budget(grouped).oom_group
    monkeypatch.setattr(environment, "read_environment", lambda *a, **k: grouped)
    loader = autotune.DataLoader(Slow(40, 0), batch_size=4)
    assert loader._ctl.shm == shmfit.shm_budget(grouped).budget_bytes == GiB // 2
    assert loader._ctl.budget == 8 * GiB // 2 // 2
    assert [e for e, _ in decisions()].count("oom-group") == 1
    loader.close()


def test_footprint_counts_live_batches_as_shmfit_does():
    b = 10 * MiB
    assert memory.footprint(2, 2, 100, b) == 200 + shmfit.needed_bytes(2, 2, b)
    assert memory.footprint(2, 2, 100, b) > 200 + 2 * 2 * b   # the +1 batch and the margin
    assert memory.footprint(0, None, 100, b) == 0
    # One way to measure a batch: shmfit's, the one search and bench use.
    assert not hasattr(memory, "batch_bytes")


@pytest.mark.parametrize("ranks", [1, 3])
def test_default_budget_is_this_ranks_share(ranks):
    env = _recorded()
    assert memory.default_budget(env, ranks) == 8 * GiB // 2 // ranks


def test_a_switch_refused_for_dev_shm_gives_the_figure_that_is_over():
    """A 4-rank review read "would hold 13 MiB ... over its budget of 16 MiB": the sum
    with the current pool's batches, alive beside it during the switch, was over; say it."""
    from autotune.online.config import Config
    from autotune.online.limits import MemoryFigures, over_budget
    from autotune.shmfit import needed_bytes

    MiB = 2**20
    cur, cand = Config(1, 2, True, False), Config(1, 4, True, False)
    batch = 3 * MiB // 2
    why = over_budget(cand, cur, MemoryFigures(100 * MiB, batch, True), 2**40, 16 * MiB)
    both = needed_bytes(1, 4, batch) + needed_bytes(1, 2, batch)
    assert both > 16 * MiB > needed_bytes(1, 4, batch)
    assert f"{both / MiB:,.0f} MiB with the current pool's beside it" in why, why
    assert why.endswith("over its budget of 16 MiB"), why


def test_a_loader_that_needs_a_worker_is_fitted_to_one_batch_ahead():
    """persistent_workers=True needs a worker: where no more than one worker one batch
    ahead fits /dev/shm, the fit goes there (before: it stopped at one worker, two batches
    ahead, over the budget, and the pool met ENOSPC)."""
    from autotune.online.controller import Controller
    from autotune.online.limits import MemoryFigures, fit
    from autotune.shmfit import needed_bytes

    batch = 9 * MiB
    ctl = Controller(fixed={"persistent_workers": True}, cuda=False, budget=8 * GiB,
                     memory=lambda: MemoryFigures(100 * MiB, batch, True))
    ctl.shm = needed_bytes(1, 1, batch)
    assert needed_bytes(1, 2, batch) > ctl.shm
    got = fit(ctl, ctl.make(2, 2))
    assert (got.num_workers, got.prefetch_factor) == (1, 1)
    ctl.shm = 0                       # nothing fits: the worker it needs stays
    assert fit(ctl, ctl.make(2, 2)).num_workers == 1


def _room_beside_a_live_loader(ddp: bool, rdv: str, out) -> None:
    import torch.distributed as dist

    from autotune.online.budget import shm_held_by_others
    if ddp:
        dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=0, world_size=1)
    train = autotune.DataLoader(Slow(80, 0), batch_size=4, _controller=False)
    val = autotune.DataLoader(Slow(80, 0), batch_size=4)     # made with it, as scripts do
    train._force_config(2, 2)
    it = iter(train)
    for _ in range(6):            # the training epoch is live, its workers' batches queued
        next(it)
    out.put((shm_held_by_others(val), val._ctl.beside()))
    del it
    for ld in (train, val):
        ld.close()
    if ddp:
        dist.destroy_process_group()


@pytest.mark.parametrize("ddp", [False, True])
def test_another_loaders_batches_are_out_of_the_room_but_under_ddp(ddp, tmp_path):
    """A validation loader's /dev/shm room leaves out what the training loader came to
    hold since it was made; under torch.distributed it does not, for every rank must
    decide from the same figures and this one is each process's own."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")   # a process group of its own
    q = ctx.Queue()
    p = ctx.Process(target=_room_beside_a_live_loader, args=(ddp, str(tmp_path / "rdv"), q))
    p.start()
    held, beside = q.get(timeout=120)
    p.join(timeout=60)
    assert p.exitcode == 0
    assert held > 0
    assert beside == (0 if ddp else held)


def test_a_training_process_larger_than_the_budget_still_gets_a_measured_worker(monkeypatch,
                                                                                 decisions):
    """A user's walk: under a 3 GiB limit with two ranks each rank's budget (~470 MiB) was
    under the estimate of one worker (the training process's PSS, 720 MiB with torch
    2.14.1), so every epoch ran without a worker, though a forked worker held 17-20 MiB
    of its own. Here the training process holds 300 MiB of its own and the budget is 150
    MiB: one worker, one batch ahead, is started and measured by what it holds itself
    (its USS, not its share of the parent's pages), as the OOM killer's first choice."""
    from autotune.online import controller

    monkeypatch.setattr(controller, "_worker_bound", lambda: 2)
    held = bytearray(300 * MiB)
    held[::4096] = b"x" * len(held[::4096])   # touched: the training process's own pages
    loader = autotune.DataLoader(Slow(240, 0.002), batch_size=4, key="measure-one",
                                 memory_budget=150 * MiB)
    workers, adj = set(), set()
    for _ in range(2):
        for _ in loader:
            workers.add(loader.num_workers)
            for p in loader._pools[-1].pids():
                with open(f"/proc/{p}/oom_score_adj") as f:
                    adj.add(int(f.read()))
    mem = loader._memory()
    loader.close()
    assert max(workers) >= 1, (workers, [r.getMessage() for _, r in decisions()])
    assert mem.measured and mem.per_worker < 100 * MiB, mem   # not the parent's 300 MiB
    assert adj == {1000}, adj
    start = [r.getMessage() for e, r in decisions() if e == "start"][0]
    assert "start at num_workers=1, prefetch_factor=1" in start, start
    del held
