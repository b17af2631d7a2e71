"""Two gloo ranks: the same decisions at the same steps on both, each rank's index batches
those of a plain DataLoader with its DistributedSampler."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import time

import pytest

from online_datasets import Slow

DECISIONS = ("try", "keep", "reject", "settle", "retune", "bound", "failed")


def _rank(rank: int, world: int, rdv: str, out: str) -> None:
    import torch.distributed as dist
    from torch.utils.data import DataLoader as TorchLoader, DistributedSampler

    import autotune
    os.environ.update(LOCAL_WORLD_SIZE=str(world), WORLD_SIZE=str(world), RANK=str(rank),
                      LOCAL_RANK=str(rank))  # as torchrun sets them
    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=world)
    ds = Slow(160, 0.003)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=1)
    loader = autotune.DataLoader(ds, batch_size=4, sampler=sampler, key="ddp-test")
    events, levels = [], set()

    class Decisions(logging.Handler):
        def emit(self, record):
            e = getattr(record, "autotune_event", None)
            if e in DECISIONS:
                events.append([e, loader._steps, record.autotune.get("config")])
                levels.add(record.levelname)
    log = logging.getLogger("autotune.online")
    log.addHandler(Decisions())
    log.setLevel(logging.DEBUG)  # the second rank's: said once a node, at INFO by the first
    seqs = []
    for epoch in range(4):
        sampler.set_epoch(epoch)
        for b in loader:
            time.sleep(0.004 if rank == 0 else 0.001)  # rank 1 waits longer: the slowest
            seqs.append(b.flatten().tolist())
    loader.close()
    plain_sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=1)
    plain = TorchLoader(ds, batch_size=4, sampler=plain_sampler)
    ref = []
    for epoch in range(4):
        plain_sampler.set_epoch(epoch)
        ref += [b.flatten().tolist() for b in plain]
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"events": events, "levels": sorted(levels), "same_batches": seqs == ref,
                   "bound": loader._ctl.bound}, f)
    dist.destroy_process_group()


def _two_ranks(target, tmp_path, seconds: float, hung_says: str) -> None:
    """`target(rank, 2, rendezvous, tmp_path)` in two forked ranks; both end well within
    `seconds` (a rank still running is killed and said hung)."""
    ctx = multiprocessing.get_context("fork")
    rdv = str(tmp_path / "rendezvous")
    procs = [ctx.Process(target=target, args=(r, 2, rdv, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + seconds
    for p in procs:
        p.join(max(1.0, deadline - time.monotonic()))
    hung = [p for p in procs if p.is_alive()]
    for p in hung:
        p.kill()
    assert not hung, hung_says
    assert [p.exitcode for p in procs] == [0, 0]


@pytest.mark.slow
def test_two_gloo_ranks_decide_alike_at_the_same_steps(tmp_path):
    _two_ranks(_rank, tmp_path, 240, "a rank hung: the decision steps disagreed")
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["same_batches"] and r1["same_batches"]
    assert r0["events"] == r1["events"]
    # Decided together, said once a node: torchrun's LOCAL_RANK 1 says them at DEBUG.
    assert (r0["levels"], r1["levels"]) == (["INFO"], ["DEBUG"]), (r0["levels"], r1["levels"])
    assert any(e[0] == "try" for e in r0["events"])  # a decision was taken, together
    assert r0["bound"] == r1["bound"] == max(1, _cores() // 2)  # each rank's share


def _cores() -> int:
    from autotune.cpus import usable_cores
    return usable_cores()




def _whole(rank: int, world: int, rdv: str, out: str) -> None:
    import torch.distributed as dist
    from torch.utils.data import DistributedSampler

    import autotune
    os.environ.update(LOCAL_WORLD_SIZE=str(world), WORLD_SIZE=str(world), RANK=str(rank),
                      LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=world)
    said = []

    class Said(logging.Handler):
        def emit(self, record):
            if getattr(record, "autotune_event", None) == "whole-dataset":
                said.append([name, record.levelname, record.getMessage()])
    log = logging.getLogger("autotune.online")
    log.addHandler(Said())
    log.setLevel(logging.DEBUG)
    ds = Slow(40, 0.0)
    for name, kw in (("shuffle", dict(shuffle=True)), ("in order", dict(shuffle=False)),
                     ("sampler", dict(sampler=DistributedSampler(ds)))):
        autotune.DataLoader(ds, batch_size=4, _controller=False, **kw).close()
    with open(os.path.join(out, f"whole{rank}.json"), "w") as f:
        json.dump(said, f)
    dist.destroy_process_group()


def test_shuffle_with_no_sampler_under_ddp_says_each_rank_trains_on_everything(tmp_path):
    """torch's DataLoader says nothing when each rank reads the whole dataset (shuffle=True
    and no DistributedSampler: Lightning adds its sampler only to torch's own loaders)."""
    ctx = multiprocessing.get_context("fork")
    rdv = str(tmp_path / "rendezvous")
    procs = [ctx.Process(target=_whole, args=(r, 2, rdv, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    r0, r1 = (json.loads((tmp_path / f"whole{r}.json").read_text()) for r in range(2))
    assert [(n, level) for n, level, _ in r0] == [("shuffle", "WARNING")], r0
    assert [(n, level) for n, level, _ in r1] == [("shuffle", "DEBUG")], r1   # once a node
    msg = r0[0][2]
    assert "each of the 2 ranks trains on the whole dataset (40 samples)" in msg, msg
    assert "unless each rank's dataset is its own share" in msg, msg
    assert "sampler=DistributedSampler(dataset)" in msg and "set_epoch" in msg, msg


class _LazyOnRank1:
    """Rank 1's samples hold a generator (no worker can send them); rank 0's do not."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        import torch

        x = torch.full((2,), i)
        return (x, (k for k in range(2))) if self.rank == 1 else (x, None)


def _rank_unsendable(rank: int, world: int, rdv: str, out: str) -> None:
    import torch.distributed as dist

    import autotune
    os.environ.update(LOCAL_WORLD_SIZE=str(world), WORLD_SIZE=str(world), RANK=str(rank),
                      LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=world)
    loader = autotune.DataLoader(_LazyOnRank1(rank), batch_size=4, collate_fn=list,
                                 key="ddp-unsendable")
    seen = [sorted(int(s[0][0]) for b in loader for s in b) for _ in range(3)]
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"whole": all(s == list(range(64)) for s in seen),
                   "workers": loader.num_workers}, f)
    loader.close()
    dist.destroy_process_group()


@pytest.mark.slow
def test_a_rank_whose_batch_no_worker_can_send_stops_every_ranks_tuning(tmp_path):
    """Rank 1's first batch cannot be pickled: it loads in its own process. Rank 0's can:
    had it gone on tuning, the ranks' exchanges would fall on other steps and one would
    wait for the other (5 minutes, gloo's timeout here), or rank 0 alone would start
    workers. Both stop at num_workers=0, together."""
    _two_ranks(_rank_unsendable, tmp_path, 120, "a rank hung")
    for r in range(2):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert got == {"whole": True, "workers": 0}, (r, got)


def _rank_short(rank: int, world: int, rdv: str, out: str) -> None:
    import torch.distributed as dist
    from torch.utils.data import DistributedSampler

    import autotune
    os.environ.update(LOCAL_WORLD_SIZE=str(world), WORLD_SIZE=str(world), RANK=str(rank),
                      LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=world)
    ds = Slow(48, 0.001)
    loader = autotune.DataLoader(ds, batch_size=4, key="ddp-short",
                                 sampler=DistributedSampler(ds, world, rank, shuffle=False))
    n = sum(1 for _ in loader)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"batches": n, "summary": loader.summary}, f)
    loader.close()
    dist.destroy_process_group()


def test_a_ddp_epoch_shorter_than_a_window_names_the_window_not_a_placeholder(tmp_path):
    """A user's walk (torchrun, 2 ranks, 7 batches an epoch) read "fewer than one window
    (1000000000)": under DDP the meter closes no window of its own (the ranks decide at
    agreed steps), and its placeholder size was printed."""
    _two_ranks(_rank_short, tmp_path, 120, "a rank hung")
    for r in range(2):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert got["batches"] == 6, got
        assert "fewer than one window (" in got["summary"], got
        assert "1000000000" not in got["summary"], got


def _rank_worker_killed(rank: int, world: int, rdv: str, out: str) -> None:
    import signal

    import torch.distributed as dist
    from torch.utils.data import DistributedSampler

    import autotune
    os.environ.update(LOCAL_WORLD_SIZE=str(world), WORLD_SIZE=str(world), RANK=str(rank),
                      LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=world)
    ds = Slow(400, 0.003)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=1)
    loader = autotune.DataLoader(ds, batch_size=4, sampler=sampler, key="ddp-killed")
    seen, killed = [], None
    for epoch in range(3):
        sampler.set_epoch(epoch)
        got = []
        for i, b in enumerate(loader):
            time.sleep(0.002)
            got += b.flatten().tolist()
            pids = loader._pools[-1].pids()
            if rank == 0 and killed is None and epoch == 0 and i >= 20 and pids:
                killed = pids[0]
                os.kill(killed, signal.SIGKILL)      # as the OOM killer would
        seen.append(sorted(got) == sorted(sampler_indices(sampler)))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"whole": seen, "killed": killed,
                   "failed": sorted(c.short() for c in loader._ctl.failed_configs),
                   "agreed": loader._sw.agreed.short(), "next": loader._sw.next_decision,
                   "steps": loader._steps}, f)
    loader.close()
    dist.destroy_process_group()


def sampler_indices(sampler) -> list[int]:
    return [i for i in sampler]


def test_a_worker_killed_on_one_rank_moves_every_rank_to_the_same_fallback(tmp_path):
    """A review: the rank whose worker the OOM killer took fell back at once and set its
    agreed configuration to the fallback; at the next decision step it marked that
    fallback failed while the others marked the configuration that did fail, and their
    decision steps, which follow the agreed configuration, could fall apart. Now every
    rank falls back alike at that step, from the same figures."""
    _two_ranks(_rank_worker_killed, tmp_path, 180, "a rank hung")
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["killed"] is not None, r0
    assert r0["whole"] == r1["whole"] == [True, True, True], (r0, r1)
    assert r0["failed"] == r1["failed"] and r0["failed"], (r0, r1)
    assert (r0["agreed"], r0["next"], r0["steps"]) == (r1["agreed"], r1["next"], r1["steps"])


def _rank_least(rank: int, world: int, rdv: str, out: str) -> None:
    import torch.distributed as dist

    from autotune.online.config import Config
    from autotune.online.controller import Controller, MemoryFigures
    from autotune.online.ddp import RankSync
    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=world)
    sync = RankSync(dist.new_group(backend="gloo"), rank, world, world)
    ctl = Controller(fixed={}, cuda=False, budget=10**12, bound=4,
                     memory=lambda: MemoryFigures(1, 0, True))
    mine = Config(2, 1, True, False) if rank == 0 else Config(1, 4, True, False)
    got = sync.least(mine, ctl)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"got": got.short(), "current": ctl._current.short(), "cut": ctl.cut}, f)
    dist.destroy_process_group()


def test_each_ranks_refitted_start_point_becomes_the_least_of_them(tmp_path):
    """A review: rank 0's start point is broadcast, but each rank refits it to its own
    figures at the first batch (its memory, its batch): one could cut to fewer workers
    than another, and the decision steps, which follow the agreed configuration, differ."""
    _two_ranks(_rank_least, tmp_path, 60, "a rank hung")
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["got"] == r1["got"] == "num_workers=1, prefetch_factor=1", (r0, r1)
    assert r0["current"] == r1["current"] == r0["got"] and r0["cut"] and r1["cut"]


def _rank_held(rank: int, world: int, rdv: str, out: str) -> None:
    """Rank 1's switch to each trial is held not ready for 60 steps; MODE "kill": rank 0's
    serving pool at prefetch 4 loses a worker meanwhile; MODE "activate": rank 0's hand-over
    to the trial fails (/dev/shm's error). A barrier each step, as DDP's all-reduce."""
    import signal

    import torch.distributed as dist
    from torch.utils.data import DistributedSampler

    import autotune
    import autotune.online.controller as controller
    from autotune.online import ddp
    from autotune.online import pool as poolmod
    ddp.TIMEOUT_S = 20
    controller._worker_bound = lambda: 4
    mode = os.environ["HELD_MODE"]
    os.environ.update(LOCAL_WORLD_SIZE=str(world), WORLD_SIZE=str(world), RANK=str(rank),
                      LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=world)
    ds = Slow(2400, 0.002)
    loader = autotune.DataLoader(ds, batch_size=4, key=f"held-{mode}",
                                 sampler=DistributedSampler(ds, world, rank, shuffle=False))
    ready, opened, held = poolmod.Pool.ready, poolmod.Pool.open, {}

    def held_ready(self):
        sw = loader._sw
        if rank == 1 and sw.current is not None and sw.current.reason == "controller" \
                and self is sw.pending:
            until = held.setdefault(id(self), loader._steps + 60)
            if loader._steps < until:
                return False
        return ready(self)

    def failing_open(self, stream, start=0):
        sw = loader._sw
        if mode == "activate" and rank == 0 and stream is not None and sw.current is not None \
                and sw.current.reason == "controller" and self is sw.pending:
            raise RuntimeError("unable to write to file </torch_1_2_3>: No space left on device")
        return opened(self, stream, start)
    poolmod.Pool.ready, poolmod.Pool.open = held_ready, failing_open
    decisions, killed = [], None
    decide = loader._sw.decide_together

    def counted():
        decisions.append(loader._steps)
        return decide()
    loader._sw.decide_together = counted
    for _ in range(2):
        for _ in loader:
            time.sleep(0.003)
            if mode == "kill" and rank == 0 and killed is None and \
                    loader._running.prefetch_factor == 4 and loader._sw.current is None:
                if pids := loader._pools[-1].pids():
                    killed = pids[0]
                    os.kill(killed, signal.SIGKILL)
            dist.barrier()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"decisions": decisions, "sync": loader._sync is not None,
                   "failed": sorted(c.short() for c in loader._ctl.failed_configs),
                   "agreed": loader._sw.agreed.short()}, f)
    loader.close()
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["kill", "activate"])
def test_a_failure_while_another_rank_switches_keeps_the_ranks_together(tmp_path, monkeypatch,
                                                                       mode):
    """A review, with repros: a failure agreed while another rank's switch was still coming
    up left that rank to finish its switch into the failed configuration, and a failure
    at a new pool's hand-over was never told to the other ranks; either way the decision
    steps split and each rank waited in gloo for its timeout."""
    monkeypatch.setenv("HELD_MODE", mode)
    _two_ranks(_rank_held, tmp_path, 240, "a rank hung")
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["sync"] and r1["sync"], (r0, r1)            # never out of step
    assert r0["decisions"] == r1["decisions"], (r0["decisions"], r1["decisions"])
    assert r0["failed"] == r1["failed"] and r0["failed"], (r0, r1)
    assert r0["agreed"] == r1["agreed"], (r0, r1)
