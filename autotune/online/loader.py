"""`autotune.DataLoader`: torch's DataLoader, tuned while the user's own loop trains.

The epoch's index batches come from the user's sampler or batch_sampler (or the sampler
torch builds from shuffle and generator), drawn lazily from one `IndexStream`; each inner
torch DataLoader (a `Pool`) takes a lease of it. A switch starts the new pool idle while
the old one serves, and once every new worker is up it closes the old lease at a batch
boundary and hands the rest of the epoch to the new pool, so no index batch is lost,
repeated or reordered. Timing is two clock reads per next(); decisions are taken there,
once per window, never in a thread.

The first epoch's first batch is made in this process before any worker starts: its bytes
fit the start point to /dev/shm (autotune.shmfit). A pool that fails for a reason of
autotune's (autotune.online.failure) is replaced at once by one that needs less; the index
batches it had taken but not delivered go back to the stream, so the epoch goes on with
nothing lost or repeated (an IterableDataset loses the rest of that epoch instead).
"""

from __future__ import annotations

import logging
import os
import time
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import IterableDataset

from autotune.errors import UsageError
from autotune.online import cache, ddp, failure, why
from autotune.online.config import TUNED, Config
from autotune.cpus import usable_cores
from autotune.online.controller import Controller, MemoryFigures, emit
from autotune.online.measure import Meter, WindowStats, window_batches
from autotune.online.memory import default_budget, over_limit, own_pss, pss_bytes
from autotune.online.pool import Pool
from autotune.online.stream import IndexStream
from autotune.shmfit import measure_batch

log = logging.getLogger("autotune.online")

_UNSET: Any = object()
READY_TIMEOUT_S = 120.0  # a pool whose workers are not up by then is given up


@dataclass
class _Switch:
    pool: Pool
    old: Config
    reason: str
    decided_at: float
    main_s: float = 0.0     # seconds spent in this process starting, opening, retiring
    wait_s: float = 0.0     # wait inside next() from the decision to the new pool's first batch
    wall_s: float = 0.0
    batches: int = 0


@dataclass(frozen=True)
class _Seen:
    config: Config
    stats: WindowStats


def _read_environment() -> tuple[Any, str | None]:
    """autotune.environment's reading, or None and why it failed (a budget unknown is not
    checked, and the loader says so: it must not end the user's run)."""
    from autotune.environment import read_environment

    try:
        return read_environment(), None
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"


class DataLoader:
    """A drop-in torch.utils.data.DataLoader that tunes the settings the user did not give.

    num_workers, prefetch_factor, persistent_workers (and pin_memory where CUDA is present)
    are tuned inside the training loop unless given; every other argument means what it
    means to torch. For a map-style dataset the sequence of index batches and the state of
    `generator` (or of torch's global RNG) after each epoch equal those of a plain
    torch DataLoader with the same arguments and seed, across switches: one base seed is
    drawn per epoch iterator, as torch draws it, and the inner loaders' worker seeds come
    from a generator of their own seeded with it (per worker, through `worker_init_fn`,
    but not the very seeds torch would give). A dataset that draws from torch's global RNG
    in `__getitem__` draws in the workers instead of this process once workers are used,
    as with any change of num_workers.

    An IterableDataset switches only at epoch boundaries, and no identity with torch is
    promised for it. One live iterator at a time: `iter()` ends the previous epoch.

    Under torch.distributed (map-style datasets) the ranks decide together, from the
    slowest rank's figures, at the same steps (see autotune.online.ddp): every rank must
    step its loader the same number of times, as DistributedSampler's padding makes them.

    A pool that fails for a reason of autotune's (/dev/shm refused, a worker killed by
    SIGKILL, SIGBUS or SIGTERM) does not end the loop: the epoch carries on at a
    configuration that needs less (see docs/library/dataloader.md); the user's own
    exceptions raise as torch's would.

    Extra keywords: `key` names the dataset in the settings cache
    (~/.cache/autotune/online.json); `memory_budget` (bytes; default half of what the
    job's cgroup has left under its memory limit, else half the host's available memory;
    one above the cgroup's limit is warned about) bounds the workers' PSS plus the batches
    in flight.
    """

    def __init__(self, dataset: Any, batch_size: int | None = 1, shuffle: bool | None = None,
                 sampler: Any = None, batch_sampler: Any = None, num_workers: int = _UNSET,
                 collate_fn: Callable | None = None, pin_memory: bool = _UNSET,
                 drop_last: bool = False, timeout: float = 0,
                 worker_init_fn: Callable[[int], None] | None = None,
                 multiprocessing_context: Any = None, generator: torch.Generator | None = None,
                 *, prefetch_factor: int | None = _UNSET, persistent_workers: bool = _UNSET,
                 pin_memory_device: str = "", in_order: bool = True, key: str | None = None,
                 memory_budget: int | None = None, _controller: Any = None) -> None:
        given = dict(num_workers=num_workers, prefetch_factor=prefetch_factor,
                     persistent_workers=persistent_workers, pin_memory=pin_memory)
        self._fixed = {k: v for k, v in given.items() if v is not _UNSET and v is not None}
        self._ref = _reference(dataset, self._fixed, dict(
            batch_size=batch_size, shuffle=shuffle, sampler=sampler, batch_sampler=batch_sampler,
            collate_fn=collate_fn, drop_last=drop_last, timeout=timeout,
            worker_init_fn=worker_init_fn, multiprocessing_context=multiprocessing_context,
            generator=generator, pin_memory_device=pin_memory_device, in_order=in_order))
        if memory_budget is not None and memory_budget <= 0:
            raise UsageError(f"memory_budget must be a positive number of bytes, but got "
                             f"{memory_budget}.")
        # What the job's container allows, read once for this loader: every budget below.
        self._env, self._env_error = _read_environment()
        if memory_budget is not None and (over := over_limit(memory_budget, self._env)):
            warnings.warn(over, stacklevel=2)
        self.dataset = dataset
        self._stage_clock = why.attach_stage_clock(dataset) if _controller is not False else None
        self.batch_size, self.drop_last = self._ref.batch_size, self._ref.drop_last
        self.sampler, self.batch_sampler = self._ref.sampler, self._ref.batch_sampler
        self.generator, self.collate_fn = generator, collate_fn
        self.timeout, self.worker_init_fn = timeout, worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self._iterable = isinstance(dataset, IterableDataset)
        self._auto = self.batch_sampler is not None
        self._index_sampler = self.batch_sampler if self._auto else self.sampler
        # torch draws no base seed for the later epochs of a persistent pool.
        self._ref_persistent = bool(self._fixed.get("num_workers")
                                    and self._fixed.get("persistent_workers"))
        self._common: dict[str, Any] = dict(collate_fn=collate_fn, timeout=timeout,
                                            pin_memory_device=pin_memory_device,
                                            in_order=in_order)
        if self._iterable:
            self._common.update(batch_size=self.batch_size, drop_last=self.drop_last)
        self._cuda = torch.cuda.is_available()
        self._tuning = _controller is not False
        me = weakref.ref(self)  # no cycle: a dropped loader stops its workers at once, as torch's
        # Under torch.distributed (map-style): the gloo group and this rank's share of the
        # node; without one (an IterableDataset) the share still comes from LOCAL_WORLD_SIZE.
        sync = ddp.RankSync.create() if self._tuning and not self._iterable else None
        self._local = sync.local if sync is not None else ddp.local_world_size()
        self._ctl = _controller if _controller not in (None, False) else Controller(
            fixed=self._fixed, cuda=self._cuda,
            budget=memory_budget or default_budget(self._env, self._local),
            memory=lambda: me()._memory(), cache_key=cache.dataset_key(
                dataset, key, self.batch_size, usable_cores()))
        self._init_state()
        self._sync = self._join_ranks(sync)
        if self._tuning and isinstance(self._ctl, Controller):
            self._fit_environment()
        if self._sync is None and isinstance(self._ctl, Controller):
            self._ctl.sample_bound = True  # ranks would have to agree on a raised bound
        self._target: Config = self._ctl.start()
        if self._sync is not None:
            self._target = self._sync.broadcast(self._target)
            self._ctl.adopt(self._target)
        self._agreed = self._target
        self._next_decision = window_batches(self._target.num_workers,
                                             self._target.prefetch_factor)
        self._meter = Meter(self._window(self._target), early=self._sync is None,
                            group=self._target.num_workers)

    def _join_ranks(self, sync: ddp.RankSync | None) -> ddp.RankSync | None:
        """Under torch.distributed: this rank's share of the node's workers (the memory
        budget's share is in default_budget already)."""
        if sync is not None and isinstance(self._ctl, Controller):
            self._ctl.bound = max(1, self._ctl.bound // sync.local)
            if sync.rank != 0:
                self._ctl.cache_key_store = False
        return sync

    def _fit_environment(self) -> None:
        """The /dev/shm budget (autotune.shmfit: free /dev/shm and the cgroup's remaining
        memory, this rank's share of the node); under cgroup v2 memory.oom.group=1 it and
        the default memory budget are halved (shmfit.oom_group_divisor, as search does),
        for there a worker killed takes the whole job with it."""
        from autotune.shmfit import shm_budget

        ctl, env = self._ctl, self._env
        if env is None:
            e = self._env_error
            log.warning("the environment could not be read (%s): /dev/shm is not budgeted", e,
                        extra={"autotune_event": "environment", "autotune": {"why": str(e)}})
            return
        sb = shm_budget(env, self._local)
        ctl.shm = sb.budget_bytes
        self._shm_source = sb.source
        if sb.oom_group:
            self._oom_group = True
            emit("oom-group", f"{env.memory.source}: memory.oom.group is 1, so a worker the "
                 "OOM killer ends takes the whole job with it and no fallback is possible: "
                 f"budgets halved (/dev/shm {(ctl.shm or 0) / 2**20:,.0f} MiB, memory "
                 f"{ctl.budget / 2**20:,.0f} MiB)", shm_budget=ctl.shm, budget=ctl.budget)

    def _window(self, cfg: Config) -> int:
        # Under DDP the window closes at the agreed decision steps, not when full.
        return 10**9 if self._sync is not None else window_batches(cfg.num_workers,
                                                                   cfg.prefetch_factor)

    def _init_state(self) -> None:
        self._pools: list[Pool] = []
        self._batch_bytes: int | None = None
        self._probing: Config | None = None   # the start point, while the first batch is made
        self._pos = 0                         # batches of this epoch delivered to the loop
        self._oom_group = False
        self._shm_source = ""
        self._pending: Pool | None = None
        self._switch: _Switch | None = None
        self._stream: IndexStream | None = None
        self._inner_gen = torch.Generator()
        self._epochs = 0
        self._live: object | None = None
        self._served = 0
        self._last_return: float | None = None
        self._steps = 0                       # batches served since construction
        # Seconds spent in this loader's own work after each fetch (the meter, decisions,
        # starting and stopping pools): what tuning costs the training process.
        self.overhead_s = 0.0
        self._carry = 0.0                     # bookkeeping seconds not yet counted as wait
        self._said_why = False
        self._budget_deferred: WindowStats | None = None  # a budget wanted during a switch
        self._burst: why.Burst | None = None      # the time budget being sampled, apart
        self._burst_windows: list[WindowStats] = []
        self._burst_cfg: Config | None = None
        self._burst_for = "verdict"                # or "bound": the workers' blocked share
        self._stages0: dict[str, float] | None = None
        # The budget sampled at the worker bound: (its configuration, budget, seconds,
        # stages), the verdict's own when tuning settles there blocked on storage.
        self._bound_seen: tuple[Config, dict[str, Any], float, Any] | None = None
        self._failed: Config | None = None    # DDP: this rank's new pool could not start
        self._shared_mem: MemoryFigures | None = None
        self._forced: list[Config] = []
        self._epoch_cfg: Config | None = None   # the configuration the last epoch began with
        self._first: _Seen | None = None
        self._latest: _Seen | None = None
        self.summary: str | None = None
        self.verdict: Any = None             # autotune.verdict.Verdict, when one was said
        self.retired: list[list[int]] = []  # per retired pool: worker pids still alive after it

    # ---- what torch's DataLoader offers

    def __len__(self) -> int:
        return len(self._ref)

    @property
    def memory_budget(self) -> int:
        """Bytes the workers' PSS and the batches in flight may take (both pools during a
        switch); settable while training."""
        return int(self._ctl.budget)

    @memory_budget.setter
    def memory_budget(self, value: int) -> None:
        if value <= 0:
            raise UsageError(f"memory_budget must be a positive number of bytes, but got {value}.")
        if over := over_limit(value):
            warnings.warn(over, stacklevel=2)
        self._ctl.budget = int(value)

    @property
    def num_workers(self) -> int:
        return self._running.num_workers

    @property
    def prefetch_factor(self) -> int | None:
        return self._running.prefetch_factor

    @property
    def persistent_workers(self) -> bool:
        return self._running.persistent_workers

    @property
    def pin_memory(self) -> bool:
        return self._running.pin_memory

    @property
    def tuned_kwargs(self) -> dict[str, Any]:
        """The tuned settings so far, as DataLoader keywords to freeze for the next run (the
        ones the user gave are left out: they are the user's)."""
        kw = self._ctl.tuned.kwargs() if self._tuning else self._running.kwargs()
        if not self._cuda:
            kw.pop("pin_memory", None)
        return {k: v for k, v in kw.items() if k not in self._fixed}

    @property
    def _running(self) -> Config:
        if self._pools:
            return self._pools[-1].config
        return self._target

    def __iter__(self) -> Iterator[Any]:
        if self._live is not None:
            self._end_epoch(completed=False)
        sampler_iter = None if self._iterable else iter(self._index_sampler)
        # After iter(sampler), as torch's iterator does; one draw per epoch iterator.
        if not (self._ref_persistent and self._epochs > 0):
            seed = int(torch.empty((), dtype=torch.int64).random_(generator=self.generator).item())
            self._inner_gen = torch.Generator()
            self._inner_gen.manual_seed(seed)
        self._epochs += 1
        self._stream = None if sampler_iter is None else IndexStream(sampler_iter)
        self._begin_epoch()
        token = self._live = object()
        return _EpochIter(self, token)

    def close(self) -> None:
        """Stop every worker now (they also stop when the loader is collected)."""
        if self._burst is not None:
            self._burst.cancel()
            self._burst = None
        why.detach_stage_clock(self.dataset, self._stage_clock)
        self._stage_clock = None
        for p in self._pools + ([self._pending] if self._pending else []):
            self._retire(p)
        self._pools, self._pending, self._switch, self._live = [], None, None, None

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _force_config(self, num_workers: int, prefetch_factor: int | None = 2) -> None:
        """Tests: switch to this configuration at the next batch boundary (at the next epoch
        for an IterableDataset). Build the loader with `_controller=False` so that the
        controller does not switch as well."""
        self._forced.append(Config(num_workers, prefetch_factor if num_workers else None,
                                   bool(self._fixed.get("persistent_workers", True)),
                                   bool(self._fixed.get("pin_memory", self._cuda))))

    # ---- epochs

    def _new_pool(self, cfg: Config) -> Pool:
        return Pool(self.dataset, cfg, self._common, auto_collation=self._auto,
                    iterable=self._iterable, generator=self._inner_gen,
                    mp_context=self.multiprocessing_context, worker_init_fn=self.worker_init_fn,
                    recoverable=self._recoverable(cfg))

    def _recoverable(self, cfg: Config) -> bool:
        """Whether a failure of this configuration's pool is autotune's to recover: it has
        workers and autotune chose their number or their queue."""
        return bool(cfg.num_workers) and not (
            "num_workers" in self._fixed and "prefetch_factor" in self._fixed)

    def _measure_first(self, cfg: Config) -> bool:
        """Whether the epoch's first batch is made in this process, before any worker starts
        (the batch's bytes decide what fits in /dev/shm)."""
        return (self._tuning and self._batch_bytes is None and cfg.num_workers > 0
                and "num_workers" not in self._fixed and isinstance(self._ctl, Controller))

    def _begin_epoch(self) -> None:
        if self._iterable and self._forced:
            self._target = self._forced.pop(0)
        cfg = self._target
        last = self._epoch_cfg
        self._epoch_cfg = cfg
        if self._iterable and last is not None and last != cfg:
            # Decided during the last epoch ("from the next epoch on"); it takes effect now.
            emit("switched", f"switched {last.short()} -> {cfg.short()} at the epoch boundary "
                 "(an IterableDataset switches between epochs)", config=cfg.kwargs(),
                 old=last.kwargs(), reason="epoch")
        self._pos = 0
        if self._iterable and self._measure_first(cfg):
            cfg = self._target = self._epoch_cfg = self._measure_iterable(cfg)
        reused = False
        if self._pending is not None:
            pool, self._pending = self._pending, None
        elif self._pools and self._pools[-1].config == cfg:
            pool, reused = self._pools.pop(), True
        elif self._measure_first(cfg):
            # The first batch is made here; the start point is fitted to it and its workers
            # start while this process makes the next batches (a switch, see _after_batch).
            self._probing = cfg
            cfg = Config(0, None, False, cfg.pin_memory)
            pool = self._new_pool(cfg)
        else:
            pool = self._new_pool(cfg)
        for p in self._pools:
            self._retire(p)
        self._pools = [pool]
        self._served = 0
        self._last_return = None
        self._carry = 0.0
        if not reused:
            self._meter.reset(self._window(cfg), skip=cfg.queue, group=cfg.num_workers)
        dead = failure.dead_workers(pool.procs()) if reused else []
        try:
            if dead:
                raise failure.killed_error(dead)  # a worker of the kept pool ended meanwhile
            pool.open(self._stream, 0)
        except Exception as e:  # noqa: BLE001 (ours recovered, the user's raised)
            self._recover_or_raise(e)

    def _measure_iterable(self, cfg: Config) -> Config:
        """IterableDataset: one batch made here by an iterator of its own before the first
        pool starts, to fit the start point; that batch is not delivered (the epoch's own
        iterator starts the dataset again)."""
        probe = TorchLoader(self.dataset, num_workers=0, **self._common)
        batch = next(iter(probe), None)
        if batch is None:
            return cfg
        self._batch_bytes = measure_batch(batch).total
        return self._ctl.refit(cfg)

    def _end_epoch(self, completed: bool) -> None:
        """Keep the pool the next epoch starts with (a persistent one, or a switch's new
        pool still coming up); stop the others."""
        self._live = None
        keep: Pool | None = None
        if self._pending is not None:
            keep = self._pending
        elif self._pools and self._pools[-1].config == self._target:
            keep = self._pools[-1]
        for p in self._pools + ([self._pending] if self._pending else []):
            if p is not keep:
                self._retire(p)
        if keep is not None and not keep.config.persistent_workers:
            self._retire(keep)
            keep = None
        if self._switch is not None and self._switch.pool is not keep:
            self._switch = None
        self._pools = [keep] if keep is not None and keep is not self._pending else []
        if keep is None:
            self._pending = None
        if completed and self._epochs == 1 and self.summary is None:
            self._summarize()

    def _retire(self, pool: Pool) -> None:
        t = time.perf_counter()
        alive = pool.shutdown()
        self.retired.append(alive)
        if self._switch is not None:
            self._switch.main_s += time.perf_counter() - t
        if alive:
            log.warning("workers %s of %s still running after shutdown", alive,
                        pool.config.short(), extra={"autotune_event": "not-gone",
                                                    "autotune": {"pids": alive}})

    # ---- one batch

    def _next(self, token: object) -> Any:
        if token is not self._live:
            raise StopIteration
        t0 = time.perf_counter()
        step = None if self._last_return is None else t0 - self._last_return
        if self._forced and not self._iterable and self._pending is None \
                and self._switch is None:
            self._begin_switch(self._forced.pop(0), "forced")
        if self._pending is not None:
            self._poll_pending()
        try:
            batch = self._take()
        except StopIteration:
            self._end_epoch(completed=True)
            raise
        self._served += 1
        t1 = time.perf_counter()
        self._after_batch(batch, step, t1 - t0 + self._carry)
        self._last_return = time.perf_counter()
        # The loop waited through the bookkeeping too (a decision, a pool started): count
        # it in the next batch's wait, not in the user's step.
        self._carry = self._last_return - t1
        self.overhead_s += self._carry
        return batch

    def _take(self) -> Any:
        while True:
            while len(self._pools) > 1 and self._pools[0].done:
                self._retire(self._pools.pop(0))
            pool = self._pools[0]
            try:
                dead = failure.dead_workers(pool.procs()) if pool.recoverable else []
                if dead:
                    raise failure.killed_error(dead)
                with failure.watching(pool.procs() if pool.recoverable else []):
                    batch = pool.next()
            except StopIteration:
                raise
            except Exception as e:  # noqa: BLE001 (ours recovered, the user's raised)
                self._recover_or_raise(e)
                continue
            self._pos += 1
            return batch

    # ---- a pool that failed for a reason of ours

    def _recover_or_raise(self, exc: Exception) -> None:
        """Carry the epoch on at a configuration that needs less when `exc` is a failure of
        a pool autotune chose (autotune.online.failure); re-raise it otherwise."""
        serving = [p for p in self._pools if p.recoverable]
        why_ = failure.classify(exc, [w for p in serving for w in p.procs()]) if serving else None
        if why_ is None:
            raise exc
        failed = self._pools[0].config if self._pools[0].recoverable else serving[0].config
        to = self._fallback(failed, why_)
        if to is None:
            raise exc
        pools = self._pools + ([self._pending] if self._pending is not None else [])
        back = 0
        for p in pools:
            back += p.lease.give_back()
        self._pending, self._switch, self._budget_deferred = None, None, None
        if self._burst is not None:
            self._burst.cancel()
            self._burst = None
        for p in pools:
            self._retire(p)
        self._pools = []
        self._target = self._agreed = to
        if isinstance(self._ctl, Controller):  # tuning or not: the failed one stays out
            self._ctl.fell_back(failed, to, why_.detail)
        if self._sync is not None:
            self._failed = failed  # the other ranks' controllers hear of it at the next step
        lose = self._iterable and self._pos > 0  # a new pool starts the dataset's iterator again
        if lose:
            lost = f"the rest of this epoch is lost ({self._pos} batches delivered"
            total = _length(self.dataset)
            lost += f" of about {total // max(1, self.batch_size or 1)})" if total else ")"
            tail = f"; {lost}, the next epoch starts at {to.short()}"
        else:
            tail = (f"; the epoch carries on at {to.short()} from batch {self._pos} "
                    f"({back} batches in flight fetched again, none lost or repeated)")
        emit("fell-back", f"{failed.short()} failed ({why_.detail}): not tried again in this "
             f"run{tail}", config=to.kwargs(), failed=failed.kwargs(), kind=why_.kind,
             why=why_.detail, refetched=back, delivered=self._pos)
        if lose:
            self._epoch_cfg = to
            raise StopIteration  # _next ends the epoch
        pool = self._new_pool(to)
        self._pools = [pool]
        self._meter.reset(self._window(to), skip=to.queue, group=to.num_workers)
        pool.open(self._stream, self._pos)

    def _fallback(self, failed: Config, why_: failure.PoolFailure) -> Config | None:
        """What the loop carries on at: the last configuration that served a full window and
        needs less than `failed`, else fewer workers and a shorter queue, down to loading in
        this process; None when the user's own settings leave nothing less."""
        ctl = self._ctl if isinstance(self._ctl, Controller) else None
        if why_.kind == "shm" and ctl is not None and self._batch_bytes:
            from autotune.shmfit import needed_bytes

            # /dev/shm held less than the budget said (another process, a smaller mount):
            # nothing needing as much is within it.
            need = needed_bytes(failed.num_workers, failed.prefetch_factor, self._batch_bytes)
            ctl.shm = min(ctl.shm if ctl.shm is not None else need, need - 1)

        def less(c: Config) -> bool:
            return (c != failed and c.num_workers <= failed.num_workers
                    and c.queue <= failed.queue
                    and (ctl is None or ctl.needs_as_much(c) is None)
                    and (ctl is None or ctl.shm_fits(c, self._batch_bytes or 0)))

        for seen in (self._latest, self._first):
            if seen is not None and less(seen.config):
                return seen.config
        w, pf = failed.num_workers, failed.prefetch_factor or 2
        make = ctl.make if ctl is not None else (
            lambda n, p: Config(n, p if n else None, failed.persistent_workers,
                                failed.pin_memory))
        while w > 0:
            nw = w if "num_workers" in self._fixed else w // 2
            npf = pf if "prefetch_factor" in self._fixed else max(1, pf // 2)
            if (nw, npf) == (w, pf):
                return None  # the user's own settings: nothing less to go to
            w, pf = nw, npf
            cand = make(w, pf)
            if less(cand):
                return cand
        return None

    def _after_batch(self, batch: Any, step: float | None, wait: float) -> None:
        if self._batch_bytes is None:
            self._batch_bytes = measure_batch(batch).total
        if self._probing is not None:
            cfg, self._probing = self._ctl.refit(self._probing), None
            self._target = self._agreed = cfg
            if cfg.num_workers:
                self._begin_switch(cfg, "start: the first batch was made in this process")
        self._steps += 1
        sw = self._switch
        if sw is not None:
            sw.wait_s += wait
            sw.wall_s += wait + (step or 0.0)
            sw.batches += 1
            if self._pools[0] is sw.pool:
                self._finish_switch(sw)
        elif step is not None:  # an epoch's first batch waits for the epoch's start
            stats = self._meter.add(step, wait)
            if stats is not None:
                self._on_window(stats)
        if self._burst is not None and self._burst_for == "bound" and self._burst.done():
            # The bound's budget needs no window of its own: act on it at once (behind a
            # slow disk the next window closes many seconds later).
            self._bound_done()
        if self._sync is not None and self._steps >= self._next_decision:
            self._decide_together()

    def _on_window(self, stats: WindowStats) -> None:
        cfg = self._running
        seen = _Seen(cfg, stats)
        self._first = self._first or seen
        self._latest = seen
        if not self._tuning or (self._iterable and self._target != cfg):
            return
        self._budget_window(stats, cfg)
        new = self._ctl.observe(stats, cfg)
        if new is not None and new != cfg:
            self._begin_switch(new, "controller")
        self._want_budget(stats)

    def _want_budget(self, stats: WindowStats) -> None:
        """Start a time-budget burst (a process of its own, a few seconds) when one is
        needed: the climb stopped at the worker bound short of AU 0.95 (are the workers
        blocked on I/O? then the bound rises), or tuning settled under AU 0.90 (the
        verdict, said once). Never under DDP for the bound: the ranks must agree on it."""
        if self._burst is not None or (self._sync is not None and self._sync.rank):
            return
        ctl = self._ctl
        if getattr(ctl, "wants_budget", False) and self._sync is None:
            purpose = "bound"
        elif not self._said_why and getattr(ctl, "phase", None) == "settled" \
                and stats.au < why.INPUT_BOUND_AU:
            purpose = "verdict"
            seen = self._bound_seen
            if getattr(ctl, "storage", False) and seen is not None and seen[0] == ctl.tuned:
                # Settled where the bound's budget was sampled, blocked on storage: that
                # budget is the verdict's; no second burst, the verdict at once.
                best = getattr(ctl, "best", None)
                self._verdict(seen[0], seen[1], seen[2], seen[3],
                              best.stats if best is not None and best.stats else stats)
                return
        else:
            return
        if self._switch is not None or self._pending is not None:
            # A switch under way (the controller settling back, say): the old pool's workers
            # still serve beside the new pool's, and the budget would count both. Sample
            # once the new pool serves alone (_finish_switch asks again).
            self._budget_deferred = stats
            return
        self._budget_deferred = None
        serving = self._pools[-1] if self._pools else None
        pids = serving.pids() if serving is not None else []
        self._burst, self._burst_cfg, self._burst_for = why.Burst(
            os.getpid(), workers=pids), self._running, purpose
        self._burst_windows = []
        clock = self._stage_clock
        self._stages0 = clock.totals() if clock is not None else None

    def _budget_window(self, stats: WindowStats, cfg: Config) -> None:
        """A window while a burst samples: its figures go with the budget; when the budget
        is in, it raises the worker bound or gives the verdict."""
        burst = self._burst
        if burst is None:
            return
        if cfg != self._burst_cfg:  # another pool now: the budget would mix two
            burst.cancel()
            self._burst = None
            return
        self._burst_windows.append(stats)
        if self._burst_for == "bound" or not burst.done():
            return  # the bound's budget is taken per batch (_bound_done)
        self._burst = None
        if getattr(self._ctl, "phase", None) == "settled":
            wall = time.perf_counter() - burst.started
            stats = why.merge(self._burst_windows) or (self._latest.stats if self._latest
                                                       else None)
            self._verdict(cfg, burst.result(), wall, self._stages(cfg, wall), stats)

    def _stages(self, cfg: Config, wall: float) -> Any:
        """The stage budget since the burst began (autotune's own ImageDataset), else None."""
        if self._stage_clock is None or self._stages0 is None:
            return None
        from autotune.data.stages import stage_budget

        return stage_budget(self._stages0, self._stage_clock.totals(),
                            workers=cfg.num_workers, wall_s=wall)

    def _bound_done(self) -> None:
        """The bound's budget is in: the worker bound from it, and the climb goes on."""
        burst, cfg = self._burst, self._burst_cfg
        assert burst is not None and cfg is not None
        self._burst = None
        budget = burst.result()
        wall = time.perf_counter() - burst.started
        self._bound_seen = (cfg, budget, wall, self._stages(cfg, wall))
        new = self._bound_from(budget)
        if new is not None and new != self._running and self._pending is None \
                and self._switch is None:
            self._begin_switch(new, "controller")

    def _bound_from(self, budget: dict[str, Any]) -> Config | None:
        """The worker bound from the workers' blocked share (bounds.worker_bound)."""
        from autotune.monitor.timebudget import TimeBudget
        from autotune.verdict.bounds import worker_bound

        ctl = self._ctl
        wc = TimeBudget.from_dict(budget).cls("workers") if budget.get("available", True) \
            else None
        if wc is None or not wc.process_seconds:
            reason = budget.get("reason") or "no worker seen"
            return ctl.workers_blocked(None, ctl.bound,
                                       f"the workers' time budget is missing: {reason}")
        # A worker asleep in a timer inside its work (time.sleep, a client's backoff)
        # needs no core while it waits, as one blocked on storage does not.
        timer = wc.timer()
        blocked = min(1.0, wc.blocked() + timer)
        also = f" and asleep in a timer inside their work {timer:.0%}" if timer >= 0.05 else ""
        return ctl.workers_blocked(
            blocked, worker_bound(usable_cores(), blocked_share=blocked),
            f"the {wc.processes} workers were blocked on storage {wc.blocked():.0%}{also} of "
            "their time (the bound is cores / (1 - blocked))")

    def _verdict(self, cfg: Config, budget: dict[str, Any], wall: float, stages: Any,
                 stats: WindowStats | None) -> None:
        """Why AU stays under 0.90 after tuning: the verdict engine, said once. A storage
        verdict ends the tuning: no setting can help (the verdict names convert/stage)."""
        if stats is None or stats.au >= why.INPUT_BOUND_AU:
            return  # it kept up over the burst: nothing to explain yet
        self._said_why = True
        bound = getattr(self._ctl, "bound", None)
        v = why.explain(why.Figures(
            stats=stats, loader=cfg.kwargs(), batch_size=self.batch_size,
            cores=usable_cores(), budget=budget, stages=stages,
            dataset=_root_path(self.dataset),
            worker_bound=bound if self._sync is not None else None))
        self.verdict = v
        if v.bottleneck == "storage" and hasattr(self._ctl, "storage_verdict"):
            self._ctl.storage_verdict()
        emit("verdict", f"AU {stats.au:.2f} after tuning (under {why.INPUT_BOUND_AU:.2f}): "
             f"{v.summary}; next: {v.next_command}", bottleneck=v.bottleneck, au=stats.au,
             verdict=v.to_dict())

    def _decide_together(self) -> None:
        """DDP: the agreed decision step (every rank is here at this same step)."""
        assert self._sync is not None
        need = window_batches(self._agreed.num_workers, self._agreed.prefetch_factor)
        self._next_decision = self._steps + need
        local = self._meter.peek() if len(self._meter.steps) >= need else None
        busy = self._switch is not None or self._pending is not None
        mem = self._memory_here()
        failed, self._failed = self._failed, None
        try:
            shared = self._sync.exchange(local, busy, mem.per_worker, mem.per_batch,
                                         failed is not None)
        except RuntimeError as e:  # a rank out of step (uneven epochs) or gone
            self._sync, self._tuning = None, False
            log.warning("ranks out of step at step %d (%s): tuning stopped at %s", self._steps,
                        e, self._running.short(), extra={"autotune_event": "ddp-stopped",
                                                         "autotune": {"step": self._steps}})
            return
        self._shared_mem = MemoryFigures(shared.per_worker, shared.per_batch, mem.measured)
        if shared.failed:
            new = self._ctl.failed(self._agreed, "a rank's new pool could not start")
            self._agreed = new or self._ctl.tuned
        elif shared.slowest is not None:
            self._meter.reset(self._window(self._running), group=self._running.num_workers)
            self._on_window(shared.slowest)
            self._agreed = self._target
        else:
            return
        if self._agreed != self._running and self._pending is None and self._switch is None:
            self._begin_switch(self._agreed, "controller")
        self._next_decision = self._steps + window_batches(self._agreed.num_workers,
                                                           self._agreed.prefetch_factor)

    # ---- switching

    def _begin_switch(self, cfg: Config, reason: str) -> None:
        if self._iterable:
            self._target = cfg
            emit("switch", f"{cfg.short()} from the next epoch on (an IterableDataset "
                 "switches at epoch boundaries)", config=cfg.kwargs())
            return
        if cfg == self._running:
            return
        t = time.perf_counter()
        pool = self._new_pool(cfg)
        if cfg.num_workers:
            pool.start_idle()  # idle: its workers come up while the old pool serves
        self._pending, self._target = pool, cfg
        self._switch = _Switch(pool, self._running, reason, t, time.perf_counter() - t)

    def _poll_pending(self) -> None:
        pool = self._pending
        assert pool is not None
        if pool.ready():
            self._activate(pool)
            return
        reason = None
        if pool.died():
            reason = "a worker exited while starting"
        elif pool.started_at is not None and \
                time.perf_counter() - pool.started_at > READY_TIMEOUT_S:
            reason = f"workers not up after {READY_TIMEOUT_S:.0f} s"
        if reason is None:
            return
        self._pending, self._switch = None, None
        self._retire(pool)
        self._target = self._running
        if self._sync is not None:
            self._failed = pool.config  # told to every rank at the next decision step
            return
        new = self._ctl.failed(pool.config, reason) if self._tuning else None
        if new is not None and new != self._running:
            self._begin_switch(new, "controller")

    def _activate(self, pool: Pool) -> None:
        """Close the last pool's lease at a batch boundary and give the new pool the rest."""
        last = self._pools[-1]
        # A pool without workers fetches in this process: let it serve one more batch while
        # the new workers fetch their first.
        boundary = last.lease.next + (0 if last.config.num_workers else 1)
        last.lease.stop = boundary
        try:
            main_s = pool.open(self._stream, boundary)
        except Exception as e:  # noqa: BLE001 (the old pool serves on)
            last.lease.stop = None
            pool.lease.give_back()
            if failure.classify(e, pool.procs()) is None:
                raise
            self._pending, self._switch = None, None
            self._retire(pool)
            self._target = self._running
            if self._tuning and isinstance(self._ctl, Controller):
                self._ctl.fell_back(pool.config, self._running, str(e))
            return
        self._pools.append(pool)
        self._pending = None
        if self._switch is not None:
            self._switch.main_s += main_s

    def _finish_switch(self, sw: _Switch) -> None:
        """The new pool served its first batch: measure the switch and charge it."""
        self._switch = None
        old_share = self._latest.stats.wait_share if self._latest else 0.0
        # What the switch cost the loop: the wait beyond what the old pool would have made.
        cost = max(0.0, sw.wait_s - old_share * sw.wall_s)
        pool = sw.pool
        up = (pool.ready_at - pool.started_at) if pool.ready_at and pool.started_at else 0.0
        cfg = pool.config
        self._meter.reset(self._window(cfg), skip=cfg.queue, group=cfg.num_workers)
        if self._tuning and sw.reason == "controller":
            self._ctl.charge(cfg, cost)
        wanted, self._budget_deferred = self._budget_deferred, None
        if wanted is not None and self._tuning:
            # The old pool is retired: its workers are out of the budget from here on.
            self._want_budget(wanted)
        # The first pool after the batch made in this process is a start, not a decision.
        event = "started" if sw.reason.startswith("start") else "switched"
        emit(event, f"switched {sw.old.short()} -> {cfg.short()} ({sw.reason}): workers "
             f"up in {up:.2f} s, {sw.batches} batches of overlap, cost {cost:.3f} s of wait "
             f"beyond the old pool's (starting and stopping pools took {sw.main_s:.3f} s "
             "here, partly while waiting anyway)",
             config=cfg.kwargs(), old=sw.old.kwargs(), cost_s=cost, startup_s=up,
             main_s=sw.main_s, overlap_batches=sw.batches, reason=sw.reason)

    # ---- figures

    def _memory(self) -> MemoryFigures:
        # Under DDP every rank's controller must see the same figures: the agreed ones.
        if self._shared_mem is not None:
            return self._shared_mem
        return self._memory_here()

    def _memory_here(self) -> MemoryFigures:
        pids = self._pools[-1].pids() if self._pools else []
        sizes = [s for s in (pss_bytes(p) for p in pids) if s]
        if sizes:
            return MemoryFigures(sum(sizes) // len(sizes), self._batch_bytes or 0, True)
        return MemoryFigures(own_pss(), self._batch_bytes or 0, False)

    def _summarize(self) -> None:
        first, last = self._first, self._latest
        if first is None or last is None:
            msg = (f"{self._served} batches, fewer than one window "
                   f"({self._meter.size}); nothing measured")
        else:
            a, b = first.config, last.config
            parts = []
            if a.num_workers != b.num_workers:
                parts.append(f"num_workers {a.num_workers} \u2192 {b.num_workers}")
            if (a.num_workers or b.num_workers) and a.prefetch_factor != b.prefetch_factor:
                parts.append(f"prefetch {a.prefetch_factor or '-'} \u2192 "
                             f"{b.prefetch_factor or '-'}")
            head = ", ".join(parts) or f"{b.short()} kept"
            ratio = (last.stats.batches_per_s / first.stats.batches_per_s
                     if first.stats.batches_per_s else 1.0)
            msg = (f"{head}: wait {100 * first.stats.wait_share:.0f} % \u2192 "
                   f"{100 * last.stats.wait_share:.0f} %, {ratio:.1f}x")
            cost = getattr(self._ctl, "switch_cost_s", 0.0) if self._tuning else 0.0
            if cost:
                msg += f" (switches cost {cost:.2f} s)"
        self.summary = msg
        emit("summary", f"first epoch: {msg}", summary=msg)


def _length(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except TypeError:
        return None


def _root_path(dataset: Any) -> str | None:
    """The dataset's folder where it exposes one (for the verdict's commands)."""
    for attr in cache._ROOT_ATTRS:
        val = getattr(dataset, attr, None)
        if isinstance(val, (str, os.PathLike)):
            return os.fspath(val)
    src = getattr(dataset, "source", None)
    val = getattr(src, "root", None) or getattr(src, "path", None)
    return os.fspath(val) if isinstance(val, (str, os.PathLike)) else None


def _reference(dataset: Any, fixed: dict[str, Any], kw: dict[str, Any]) -> TorchLoader:
    """A plain DataLoader with the user's arguments, never iterated: torch's own checks, and
    the sampler and batch_sampler exactly as torch builds them (shuffle, generator)."""
    _check_torch()
    nw = fixed.get("num_workers", 0)
    ctx = kw["multiprocessing_context"]
    if isinstance(ctx, str):
        torch.multiprocessing.get_context(ctx)  # ValueError naming the valid methods
    # torch refuses these three without workers; the tuned pools will have some. With
    # num_workers=0 given, they are checked as torch checks them (its ValueError).
    given_zero = "num_workers" in fixed and not nw
    kw = dict(kw, multiprocessing_context=ctx if nw or given_zero else None)
    if nw or given_zero:
        kw.update(prefetch_factor=fixed.get("prefetch_factor"),
                  persistent_workers=bool(fixed.get("persistent_workers")))
    return TorchLoader(dataset, num_workers=nw, **kw)


def _check_torch() -> None:
    """torch added DataLoader's in_order= in 2.6 (the floor pyproject.toml declares); an
    older torch, kept by an install with --no-deps, would fail with a bare TypeError."""
    import inspect

    if "in_order" not in inspect.signature(TorchLoader.__init__).parameters:
        raise UsageError(f"autotune.DataLoader needs torch 2.6 or newer (DataLoader's "
                         f"in_order=), but torch {torch.__version__} is installed; "
                         "pip install 'torch>=2.6' (keeping your CUDA build's index).")


class _EpochIter:
    """One epoch's iterator (what `iter(loader)` returns)."""

    def __init__(self, owner: DataLoader, token: object) -> None:
        self._owner, self._token = owner, token

    def __iter__(self) -> _EpochIter:
        return self

    def __next__(self) -> Any:
        return self._owner._next(self._token)

    def __len__(self) -> int:
        return len(self._owner)


__all__ = ["DataLoader", "TUNED"]
