"""`autotune.DataLoader`: torch's DataLoader, tuned while the user's own loop trains.

The epoch's index batches come from the user's sampler or batch_sampler (or the sampler
torch builds from shuffle and generator), drawn lazily from one `IndexStream`; each inner
torch DataLoader (a `Pool`) takes a lease of it. A switch starts the new pool idle while
the old one serves, and once every new worker is up it closes the old lease at a batch
boundary and hands the rest of the epoch to the new pool, so no index batch is lost,
repeated or reordered. Timing is two clock reads per next(); decisions are taken there,
once per window, never in a thread.

The first epoch's first batch is made in this process before any worker starts (never
with a worker_init_fn: the dataset may work only in workers): its bytes fit the start point
to /dev/shm (autotune.shmfit). A pool that fails for a reason of
autotune's (autotune.online.failure) is replaced at once by one that needs less; the index
batches it had taken but not delivered go back to the stream, so the epoch goes on with
nothing lost or repeated (an IterableDataset loses the rest of that epoch instead).

The DataLoader holds what its parts share (the pools, the target configuration, the
controller, the meter, the ranks) and owns one of each part: the epochs (autotune.online.
epoch: the iterator, each epoch's pools), the switches (autotune.online.switch), the budgets
(autotune.online.budget: memory, /dev/shm, the workers' time budget) and, on a failure of
autotune's, the fallback (autotune.online.fallback).
"""

from __future__ import annotations

import inspect
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import IterableDataset

from autotune.errors import TorchTooOld, UsageError
from autotune.online import cache, ddp, why
from autotune.online.budget import Budget
from autotune.online.config import TUNED, Config
from autotune.cpus import usable_cores
from autotune.online.controller import Controller, MemoryFigures, emit
from autotune.online.epoch import Epoch, EpochIter
from autotune.online.measure import Meter, WindowStats, window_of
from autotune.online.memory import default_budget, over_limit
from autotune.online.pool import Pool, warn_unpinned
from autotune.online.switch import Switch, Switcher
from autotune.online.untuned import DeferredIter, keep_fresh_workers, keep_iterable_workers

_UNSET: Any = object()


@dataclass(frozen=True)
class _Seen:
    config: Config
    stats: WindowStats


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

    An IterableDataset keeps the num_workers and persistent_workers given (torch's 0 and
    False when not given): every worker iterates it, so the worker count decides what it
    yields. With workers given, its prefetch_factor is tuned, between epochs only (not with
    persistent_workers=True given: a new pool would replace the workers kept). One live
    iterator at a time: `iter()` ends the previous epoch, unless its iterator is still held
    (`next(iter(loader))` inside the loop): that second iterator is then a plain torch
    DataLoader's, untuned, and the live epoch goes on.

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
    one above the cgroup's limit is warned about) bounds the workers' own memory plus the batches
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
        order = _in_order(in_order)
        self._ref = _reference(dataset, self._fixed, dict(
            batch_size=batch_size, shuffle=shuffle, sampler=sampler, batch_sampler=batch_sampler,
            collate_fn=collate_fn, drop_last=drop_last, timeout=timeout,
            worker_init_fn=worker_init_fn, multiprocessing_context=multiprocessing_context,
            generator=generator, pin_memory_device=pin_memory_device, **order))
        if memory_budget is not None and memory_budget <= 0:
            raise UsageError(f"memory_budget must be a positive number of bytes, but got "
                             f"{memory_budget}.")
        self._budget = Budget(self)
        self._env = self._budget.env
        if memory_budget is not None and (over := over_limit(memory_budget, self._env)):
            warnings.warn(over, stacklevel=2)
        self.dataset = dataset
        if _controller is not False:
            self._budget.stage_clock = why.attach_stage_clock(dataset)
        self._user_settings(generator, collate_fn, timeout, worker_init_fn,
                            multiprocessing_context, pin_memory_device, order)
        self._cuda = torch.cuda.is_available()
        warn_unpinned(self._fixed)
        self._tuning = _controller is not False
        held: frozenset[str] = frozenset()
        if self._iterable:
            held = keep_iterable_workers(self._fixed, multiprocessing_context,
                                         tuning=self._tuning)
        else:
            keep_fresh_workers(dataset, self._fixed, tuning=self._tuning)
            ddp.say_whole_dataset(self._ref, shuffle)
        me = weakref.ref(self)  # no cycle: a dropped loader stops its workers at once, as torch's
        # Under torch.distributed (map-style): the gloo group and this rank's share of the
        # node; without one (an IterableDataset) the share still comes from LOCAL_WORLD_SIZE.
        sync = ddp.RankSync.create() if self._tuning and not self._iterable else None
        self._local = sync.local if sync is not None else ddp.local_world_size()
        self._ctl = _controller if _controller not in (None, False) else Controller(
            fixed=self._fixed, cuda=self._cuda,
            budget=memory_budget or default_budget(self._env, self._local),
            memory=lambda: me()._memory(), cache_key=cache.dataset_key(
                dataset, key, self.batch_size, usable_cores(), self._local),
            needs_workers=worker_init_fn is not None, held=held)
        self._init_state()
        self._sync = self._budget.join_ranks(sync)
        self._start()

    def _user_settings(self, generator: Any, collate_fn: Any, timeout: float,
                       worker_init_fn: Any, multiprocessing_context: Any,
                       pin_memory_device: str, order: dict[str, bool]) -> None:
        """The user's arguments as torch's DataLoader keeps them, and what every pool gets."""
        self.batch_size, self.drop_last = self._ref.batch_size, self._ref.drop_last
        self.sampler, self.batch_sampler = self._ref.sampler, self._ref.batch_sampler
        self.generator, self.collate_fn = generator, collate_fn
        self.timeout, self.worker_init_fn = timeout, worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self._iterable = isinstance(self.dataset, IterableDataset)
        self._auto = self.batch_sampler is not None
        self._index_sampler = self.batch_sampler if self._auto else self.sampler
        # torch draws no base seed for the later epochs of a persistent pool.
        self._ref_persistent = bool(self._fixed.get("num_workers")
                                    and self._fixed.get("persistent_workers"))
        self._common: dict[str, Any] = dict(collate_fn=collate_fn, timeout=timeout,
                                            pin_memory_device=pin_memory_device, **order)
        if self._iterable:
            self._common.update(batch_size=self.batch_size, drop_last=self.drop_last)

    def _start(self) -> None:
        """The budgets fitted to the environment and the start point (agreed by the ranks
        under DDP); the first window's meter."""
        if self._tuning and isinstance(self._ctl, Controller):
            self._budget.fit_environment()
        if self._sync is None and isinstance(self._ctl, Controller):
            self._ctl.sample_bound = True  # ranks would have to agree on a raised bound
        self._target: Config = self._ctl.start()
        if self._sync is not None:
            self._target = self._sync.broadcast(self._target)
            self._ctl.adopt(self._target)
        self._sw = Switcher(self, self._target)
        self._meter = Meter(self._window(self._target), early=self._sync is None,
                            group=self._target.num_workers)

    def _window(self, cfg: Config) -> int:  # under DDP: closed at the agreed decision steps
        return 10**9 if self._sync is not None else window_of(cfg)

    def _init_state(self) -> None:
        self._pools: list[Pool] = []          # the serving pool, and one retiring before it
        self._live: Callable[[], Any] = lambda: None  # the live epoch's iterator, weakly
        self._second_said = False
        self._batch_bytes: int | None = None
        self._epoch = Epoch(self)
        self._steps = 0                       # batches served since construction
        # Seconds spent in this loader's own work after each fetch (the meter, decisions,
        # starting and stopping pools): what tuning costs the training process.
        self.overhead_s = 0.0
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
        """Bytes the workers' own memory and the batches in flight may take (both pools during a
        switch); settable while training."""
        return int(self._ctl.budget)

    @memory_budget.setter
    def memory_budget(self, value: int) -> None:
        if value <= 0:
            raise UsageError(f"memory_budget must be a positive number of bytes, but got {value}.")
        if over := over_limit(value):
            warnings.warn(over, stacklevel=2)
        self._ctl.budget = int(value)

    # The pool serving now (the training process itself for the first batch).
    num_workers = property(lambda self: self._running.num_workers)
    prefetch_factor = property(lambda self: self._running.prefetch_factor)
    persistent_workers = property(lambda self: self._running.persistent_workers)
    pin_memory = property(lambda self: self._running.pin_memory)

    @property
    def planned_kwargs(self) -> dict[str, Any]:
        """The settings the loader runs, or is starting now (its first pool's while the
        first batch is made in the training process), as DataLoader keywords: what a
        step log's header records (autotune.instrumentation.loader_info)."""
        return self._target.kwargs()

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

    @property
    def _pending(self) -> Pool | None:
        """The new pool of the switch under way, its workers coming up."""
        return self._sw.pending

    @property
    def _switch(self) -> Switch | None:
        """The switch under way, from its decision to the new pool's first batch."""
        return self._sw.current

    def __iter__(self) -> Iterator[Any]:
        if self._epoch.live is not None and self._live() is not None:
            return DeferredIter(self)  # the next epoch, or a peek: autotune.online.untuned
        return self._tuned_epoch()

    def _tuned_epoch(self) -> EpochIter:
        # The iterator holds the loader (as torch's does); the loader's parts hold it weakly.
        self._live = weakref.ref(it := EpochIter(self, self._epoch.start()))
        return it

    def close(self) -> None:
        """Stop every worker now (they also stop when the loader is collected)."""
        self._budget.cancel()
        why.detach_stage_clock(self.dataset, self._budget.stage_clock)
        self._budget.stage_clock = None
        for p in self._pools + ([self._sw.pending] if self._sw.pending else []):
            self._epoch.retire(p)
        self._pools, self._epoch.live = [], None
        self._sw.drop()

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _force_config(self, num_workers: int, prefetch_factor: int | None = 2) -> None:
        """Tests: switch to this configuration at the next batch boundary (at the next epoch
        for an IterableDataset). Build the loader with `_controller=False` so that the
        controller does not switch as well."""
        self._sw.forced.append(Config(num_workers, prefetch_factor if num_workers else None,
                                      bool(self._fixed.get("persistent_workers", True)),
                                      bool(self._fixed.get("pin_memory", self._cuda))))

    # ---- after each batch

    def _after_batch(self, batch: Any, step: float | None, wait: float) -> None:
        if self._batch_bytes is None:
            self._budget.first_batch(batch)
        if self._epoch.probing is not None:
            cfg = self._epoch.probed(batch)
            self._target = self._sw.agreed = cfg
            if cfg.num_workers:
                self._sw.begin(cfg, "start: the first batch was made in this process")
        self._steps += 1
        self._budget.credit(step, wait)   # before a window closes and reads the burst
        if not self._sw.after_batch(step, wait) and step is not None:
            # An epoch's first batch waits for the epoch's start: no step to measure.
            stats = self._meter.add(step, wait)
            if stats is not None:
                self._on_window(stats)
        self._budget.after_batch()
        if self._sync is not None and self._steps >= self._sw.next_decision:
            self._sw.decide_together()

    def _on_window(self, stats: WindowStats) -> None:
        cfg = self._running
        seen = _Seen(cfg, stats)
        self._first = self._first or seen
        self._latest = seen
        if not self._tuning or (self._iterable and self._target != cfg):
            return
        self._budget.window(stats, cfg)
        new = self._ctl.observe(stats, cfg)
        if new is not None and new != cfg:
            self._sw.begin(new, "controller")
        self._budget.want(stats)

    # ---- figures

    def _memory(self) -> MemoryFigures:
        return self._budget.memory()

    def _summarize(self) -> None:
        first, last = self._first, self._latest
        if first is None or last is None:
            msg = (f"{self._epoch.served} batches, {self._meter.counted} of them measured "
                   f"(not the first, nor a new pool's queue): fewer than one window "
                   f"({window_of(self._running)}); nothing measured")
        else:
            # The configuration kept so far, not a trial under way (the target): a trial
            # begun in the last window was reported as the first epoch's change, and the
            # configuration it was measured against as "a trial".
            kept = self._ctl.tuned if self._tuning else self._target
            msg = _first_epoch_text(first, last, kept)
            if self._target != kept:
                msg += f"; trying {self._target.short()}"
            cost = getattr(self._ctl, "switch_cost_s", 0.0) if self._tuning else 0.0
            if cost:
                msg += f" (switches cost {cost:.2f} s)"
        self.summary = msg
        emit("summary", f"first epoch: {msg}", summary=msg)


def _first_epoch_text(first: Any, last: Any, now: Config) -> str:
    """The first epoch from its first window to its last: the first configuration to the one
    the loader keeps `now` (the last window may have measured a trial it did not keep), the
    wait share in each window and the ratio of their batches/s."""
    a, b = first.config, now
    parts = []
    if a.num_workers != b.num_workers:
        parts.append(f"num_workers {a.num_workers} \u2192 {b.num_workers}")
    if (a.num_workers or b.num_workers) and a.prefetch_factor != b.prefetch_factor:
        parts.append(f"prefetch {a.prefetch_factor or '-'} \u2192 {b.prefetch_factor or '-'}")
    head = ", ".join(parts) or f"unchanged at {b.short()}"
    ratio = (last.stats.batches_per_s / first.stats.batches_per_s
             if first.stats.batches_per_s else 1.0)
    trial = "" if last.config == b else f"; the last measured a trial, {last.config.short()}"
    if not parts and last.config == b:   # the same settings: the run moved, not a setting
        trial = "; the same settings in both: the run's own change, not tuning's"
    return (f"{head}: wait {100 * first.stats.wait_share:.0f} % in the first window, "
            f"{100 * last.stats.wait_share:.0f} % in the last ({ratio:.1f}x the batches/s"
            f"{trial})")


def _reference(dataset: Any, fixed: dict[str, Any], kw: dict[str, Any]) -> TorchLoader:
    """A plain DataLoader with the user's arguments, never iterated: torch's own checks, and
    the sampler and batch_sampler exactly as torch builds them (shuffle, generator)."""
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


def _in_order(in_order: bool) -> dict[str, bool]:
    """torch's DataLoader took in_order= in 2.6; on an older torch (the environment's own,
    kept: pyproject.toml's floor is 2.1) batches always come in order, which is what
    in_order=True asks for: the keyword is left out. Out of order needs torch 2.6."""
    if _TORCH_IN_ORDER:
        return {"in_order": in_order}
    if not in_order:
        raise TorchTooOld(f"in_order=False needs torch 2.6 or newer (DataLoader's in_order=), "
                         f"but torch {torch.__version__} is installed; leave in_order out "
                         "(batches come in order), or pip install 'torch>=2.6' keeping your "
                         "CUDA build's index.")
    return {}


_TORCH_IN_ORDER = "in_order" in inspect.signature(TorchLoader.__init__).parameters


__all__ = ["DataLoader", "TUNED"]
