"""DDP: the ranks decide together, at step numbers fixed in advance, over a gloo group.

When torch.distributed is initialised, each rank's loader creates one gloo group at
construction (never the training's NCCL group), takes rank 0's start point, and tunes within
its share of the node (the worker bound and the memory budget divided by the local ranks).
Decisions fall on the same step on every rank: the next one is a window of the current
configuration after the last. There every rank hands in its window's figures; when a rank is
still switching or has too few batches measured, all skip; otherwise every rank's controller
gets the slowest rank's figures (the largest wait share) and the largest memory figures, so
that all take the same decision and start the same switch at the same step. Each rank's own
switch then completes on its own time: pools are local, so no rank waits for another's. The
start point each rank refits at its first batch becomes the least of the ranks' (`least`);
a rank's pool that failed is told with its fallback, which every rank takes at the step.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch

from autotune.online.decisions import decided_together, emit
from autotune.online.measure import WindowStats

TIMEOUT_S = 300
# wait_s, step_s, batches, noise, busy, per_worker, per_batch, failed, the failed
# configuration's and its fallback's num_workers and prefetch_factor (-1: none), switching
_FIELDS = 13
Failure = tuple[int, int, int, int]   # failed (workers, prefetch), fallback (workers, prefetch)


@dataclass(frozen=True)
class Shared:
    """What the ranks agreed on at one decision step."""

    slowest: WindowStats | None  # None: some rank is busy (switching, too few batches)
    per_worker: int
    per_batch: int
    failed: bool                 # some rank's new pool could not start, or its pool failed
    # The failed configuration and the fallback every rank takes, as (num_workers,
    # prefetch_factor or -1); fallback None: a new pool that could not start.
    failed_cfg: tuple[int, int] | None = None
    fallback: tuple[int, int] | None = None
    switching: bool = False      # some rank's switch is under way (its new pool not serving)


class RankSync:
    """The gloo group and the exchange at each decision step."""

    def __init__(self, group: Any, rank: int, world: int, local: int) -> None:
        self.group, self.rank, self.world, self.local = group, rank, world, local

    @classmethod
    def create(cls) -> RankSync | None:
        """A RankSync when torch.distributed is initialised, else None."""
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            return None
        # Every rank constructs its loader in order. A rank that stops stepping (uneven
        # epochs, an early exit) must not hang the others for gloo's default 30 minutes.
        group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "0")) or _guess_local(dist, group)
        decided_together()
        return cls(group, dist.get_rank(), dist.get_world_size(), local)

    def any(self, flag: bool) -> bool:
        """Whether `flag` is true on some rank (a collective: every rank calls it at the
        same step)."""
        t = torch.tensor([float(flag)], dtype=torch.float64)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=self.group)
        return bool(t.item() > 0)

    def least(self, cfg: Any, ctl: Any) -> Any:
        """The fewest workers and batches ahead of every rank's `cfg` (a collective: every
        rank calls it at the same step), adopted by the controller `ctl`: a start point
        each rank fitted to its own figures (its memory, its batch) is one all can hold,
        and the ranks' decision steps, which follow the agreed configuration, stay alike."""
        t = torch.tensor([float(cfg.num_workers), float(cfg.prefetch_factor or 0)],
                         dtype=torch.float64)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN, group=self.group)
        w, pf = int(t[0].item()), int(t[1].item())
        if (w, pf) == (cfg.num_workers, cfg.prefetch_factor or 0):
            return cfg
        out = ctl.make(w, pf or None)
        ctl.adopt(out)
        ctl.cut = True
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's object on every rank."""
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def exchange(self, stats: WindowStats | None, busy: bool, per_worker: int,
                 per_batch: int, failed: Failure | None, switching: bool = False) -> Shared:
        """Every rank's figures in, the agreed ones out (a collective: every rank calls it at
        the same step). `failed`: this rank's failed configuration and the fallback it took
        (fallback -1, -1: a new pool that could not start); of several ranks', the one that
        fell back furthest."""
        s = stats or WindowStats(0, 0.0, 0.0, 0.0)
        mine = torch.tensor([s.wait_s, s.step_s, s.batches, s.noise, float(busy or stats is None),
                             per_worker, per_batch, float(failed is not None),
                             *(failed or (-1, -1, -1, -1)), float(switching)],
                            dtype=torch.float64)
        rows = [torch.empty(_FIELDS, dtype=torch.float64) for _ in range(self.world)]
        torch.distributed.all_gather(rows, mine, group=self.group)
        table = torch.stack(rows)
        per_worker_all, per_batch_all = int(table[:, 5].max()), int(table[:, 6].max())
        failed_any = bool(table[:, 7].max() > 0)
        if failed_any:
            # Every rank the same row: a fallback before a start failure (fallback -1), the
            # fewest workers fallen back to, then the lowest rank.
            rows = [r for r in table.tolist() if r[7] > 0]
            f = min(rows, key=lambda r: (r[10] < 0, r[10], r[11]))
            return Shared(None, per_worker_all, per_batch_all, True, (int(f[8]), int(f[9])),
                          (int(f[10]), int(f[11])) if f[10] >= 0 else None,
                          bool(table[:, 12].max() > 0))
        if table[:, 4].max() > 0:
            return Shared(None, per_worker_all, per_batch_all, failed_any)
        wall = table[:, 0] + table[:, 1]
        share = torch.where(wall > 0, table[:, 0] / wall, torch.zeros_like(wall))
        r = table[int(torch.argmax(share))]
        slowest = WindowStats(int(r[2]), float(r[0]), float(r[1]), float(r[3]))
        return Shared(slowest, per_worker_all, per_batch_all, failed_any)


def say_whole_dataset(ref: Any, shuffle: bool | None) -> None:
    """Say it (event `whole-dataset`, at WARNING) when whole_dataset_per_rank has a word."""
    if whole := whole_dataset_per_rank(ref, shuffle):
        emit("whole-dataset", whole, warn=True)


def whole_dataset_per_rank(ref: Any, shuffle: bool | None) -> str | None:
    """What to say when a map-style loader under torch.distributed was given `shuffle=True`
    (torch's RandomSampler, no sampler of the user's): every rank then trains on the whole
    dataset, each in an order of its own, which torch's DataLoader never says. None
    otherwise (one rank; a sampler given, a RandomSampler of the user's included;
    shuffle=False: a validation loader often reads all of it on purpose)."""
    dist = torch.distributed
    if shuffle is not True or not (dist.is_available() and dist.is_initialized()) or \
            dist.get_world_size() < 2:
        return None
    try:
        n = f" ({len(ref.dataset):,} samples)"
    except TypeError:
        n = ""
    return (f"shuffle=True with no sampler under torch.distributed: unless each rank's "
            f"dataset is its own share, each of the {dist.get_world_size()} ranks trains on "
            f"the whole dataset{n} every epoch, in an order of its own. Pass "
            "sampler=DistributedSampler(dataset) instead, and call its set_epoch(epoch) "
            "before each epoch (Lightning adds one only to torch's own DataLoader)")


def nccl_in_use() -> bool:
    """Whether this job's ranks may talk through NCCL (its /dev/shm segments then share the
    node's): the initialised process group's backend names it ("nccl", "cpu:gloo,cuda:nccl"),
    else, before one exists, whether a GPU is there for it."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return "ccl" in str(dist.get_backend()).lower()   # nccl, or RCCL under that name
    return torch.cuda.is_available()


def local_world_size() -> int:
    """The ranks on this node when there is no RankSync (an IterableDataset under DDP has
    none): LOCAL_WORLD_SIZE as torchrun sets it, as autotune.search.study.procs_per_node
    reads it, else 1. Without it every rank would budget the whole node's /dev/shm and
    memory."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def _guess_local(dist: Any, group: Any) -> int:
    # Without LOCAL_WORLD_SIZE (torchrun sets it): the ranks on this host, by hostname.
    import socket
    names: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(names, socket.gethostname(), group=group)
    return max(1, names.count(socket.gethostname()))
