"""autotune.DataLoader's epochs: the iterator `iter(loader)` returns, the epoch's base seed
and index stream, the pool each epoch starts with (or keeps), the batches taken from the
serving pool, and the pools retired."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from autotune.online import datastate, failure
from autotune.online.config import Config
from autotune.online.controller import Controller, emit
from autotune.online.fallback import recover_or_raise
from autotune.online.measure import MIN_WINDOW
from autotune.online.pool import Pool
from autotune.sendable import why_unsendable
from autotune.online.stream import IndexStream, length_of
from autotune.online.weakowner import WeakOwner

log = logging.getLogger("autotune.online")

RESUME_WAIT_S = 5.0  # a kept pool that fails to resume: how long its workers may take to end


class EpochIter:
    """One epoch's iterator (what `iter(loader)` returns)."""

    def __init__(self, owner: Any, token: object) -> None:
        self._owner, self._token = owner, token

    def __iter__(self) -> EpochIter:
        return self

    def __next__(self) -> Any:
        epoch, token = self._owner._epoch, self._token
        # Not `self` in this frame: an exception from the user's Dataset keeps the frames it
        # passed in its traceback (a reference cycle, freed only by the garbage collector),
        # and an iterator held there would keep its dead epoch live after the loop has left
        # it (the next `for` then a plain second iterator, autotune.online.untuned).
        del self
        return epoch.next(token)

    def __len__(self) -> int:
        return len(self._owner)


class Epoch:
    """One loader's epochs. `owner` is the autotune.DataLoader: its pools, target
    configuration, controller and meter are read and changed here."""

    def __init__(self, owner: Any) -> None:
        self._owner = WeakOwner(owner)
        self.stream: IndexStream | None = None
        self.inner_gen = torch.Generator()
        self.epochs = 0
        self.live: object | None = None
        self.probing: Config | None = None   # the start point, while the first batch is made
        self.pos = 0                         # batches of this epoch delivered to the loop
        self.served = 0
        self.last_return: float | None = None
        self.carry = 0.0                     # bookkeeping seconds not yet counted as wait
        self.epoch_cfg: Config | None = None   # the configuration the last epoch began with

    @property
    def _dl(self) -> Any:
        return self._owner()  # the loader

    def start(self) -> object:
        """A new epoch: the previous one ended, the base seed drawn, the first pool open;
        the token of the epoch's iterator (an older iterator's next() ends)."""
        dl = self._dl
        if self.live is not None:
            self.end(completed=False)
        sampler_iter = None if dl._iterable else iter(dl._index_sampler)
        # After iter(sampler), as torch's iterator does; one draw per epoch iterator.
        if not (dl._ref_persistent and self.epochs > 0):
            seed = int(torch.empty((), dtype=torch.int64).random_(generator=dl.generator).item())
            self.inner_gen = torch.Generator()
            self.inner_gen.manual_seed(seed)
        self.epochs += 1
        # Where num_workers is tuned, torch's loader without workers is the reference: it
        # draws the sampler's end only when the loop asks there, so the pools' prefetch
        # stops at its len(). With workers given, torch's own prefetch draws it.
        self.stream = None if sampler_iter is None else IndexStream(
            sampler_iter, None if dl._fixed.get("num_workers") else length_of(dl._index_sampler))
        self.begin()
        token = self.live = object()
        return token

    def new_pool(self, cfg: Config) -> Pool:
        dl = self._dl
        pool = Pool(dl.dataset, cfg, dl._common, auto_collation=dl._auto,
                    iterable=dl._iterable, generator=self.inner_gen,
                    mp_context=dl.multiprocessing_context, worker_init_fn=dl.worker_init_fn,
                    recoverable=self.recoverable(cfg))
        # Workers kept past an epoch: what they hold of the dataset, checked before the
        # tuner's are kept (unchanged()) and before the user's are replaced by a switch
        # (autotune.online.switch).
        if cfg.num_workers and cfg.persistent_workers:
            pool.dataset_state = datastate.state(dl.dataset)
        return pool

    def recoverable(self, cfg: Config) -> bool:
        """Whether a failure of this configuration's pool is autotune's to recover: it has
        workers and autotune chose their number or their queue."""
        fixed = self._dl._fixed
        return bool(cfg.num_workers) and not (
            "num_workers" in fixed and "prefetch_factor" in fixed)

    def measure_first(self, cfg: Config) -> bool:
        """Whether the epoch's first batch is made in this process, before any worker starts
        (the batch's bytes decide what fits in /dev/shm). Never with a worker_init_fn: a
        dataset it sets up (a file handle opened per worker) may work only in workers."""
        dl = self._dl
        return (dl._tuning and dl._batch_bytes is None and cfg.num_workers > 0
                and dl.worker_init_fn is None
                and "num_workers" not in dl._fixed and isinstance(dl._ctl, Controller))

    def probed(self, batch: Any) -> Config:
        """The start point once the epoch's first batch was made here: refitted to that
        batch, or no workers where a worker could not send it back (its queue thread would
        drop every batch and the epoch wait for ever)."""
        dl, cfg, self.probing = self._dl, self.probing, None
        assert cfg is not None
        why = why_unsendable(batch)
        # Ranks that decide together stop together (every rank makes its first batch at
        # the same step): one rank without workers would fall out of their exchanges.
        if dl._sync is not None and dl._sync.any(why is not None) and why is None:
            why = "another rank's first batch could not be pickled"
        if why is None:   # refitted to this rank's figures, then to every rank's
            fitted = dl._ctl.refit(cfg)
            return fitted if dl._sync is None else dl._sync.least(fitted, dl._ctl)
        dl._tuning, dl._sync = False, None
        emit("unsendable", f"the first batch cannot be sent from a worker process ({why}): "
             "a worker's queue thread would drop every batch and the epoch wait for ever, "
             "so loading stays in this process (num_workers=0, torch's default) and tuning "
             "stops; return tensors, arrays, numbers or strings from the dataset and "
             "collate_fn (no tensor that requires grad) to let workers load it", warn=True,
             error=why)
        return Config(0, None, False, cfg.pin_memory)

    def begin(self) -> None:
        dl = self._dl
        if dl._iterable and dl._sw.forced:
            dl._target = dl._sw.forced.pop(0)
        cfg = dl._target
        last = self.epoch_cfg
        self.epoch_cfg = cfg
        if dl._iterable and last is not None and last != cfg:
            # Decided during the last epoch ("from the next epoch on"); it takes effect now.
            emit("switched", f"switched {last.short()} -> {cfg.short()} at the epoch boundary "
                 "(an IterableDataset switches between epochs)", config=cfg.kwargs(),
                 old=last.kwargs(), reason="epoch")
        self.pos, self.seen_at_begin = 0, (dl._latest, cfg)
        pool, reused, cfg = self.first_pool(cfg)
        for p in dl._pools:
            self.retire(p)
        dl._pools = [pool]
        self.served = 0
        self.last_return = None
        self.carry = 0.0
        if not reused:
            dl._meter.reset(dl._window(cfg), skip=cfg.queue, group=cfg.num_workers)
        try:
            self.open_first(pool)
        except Exception as e:  # noqa: BLE001 (ours recovered, the user's raised)
            recover_or_raise(dl, e)

    def open_first(self, pool: Pool) -> None:
        """Open the epoch's first pool. A pool whose workers were started before the epoch
        (the last epoch's, kept, or a switch's new pool) and ended before it (or end while it
        resumes them) is renewed: a terminal's Ctrl-C signals the whole process group, and
        its workers exit with code 0. Nothing of the epoch was fetched yet, so the samples
        are the same. A pool of autotune's whose worker was killed by SIGKILL, SIGBUS or
        SIGTERM (memory) raises instead, to fall back."""
        dl = self._dl
        started = bool(pool.procs())
        dead = failure.dead_workers(pool.procs())
        try:
            if dead:
                raise failure.killed_error(dead)  # a worker ended between the epochs
            pool.open(self.stream, 0)
            return
        except Exception:
            if not started:
                raise
            # Resuming reads what the last epoch's workers left in the queue: it fails
            # while they exit, before they are seen gone.
            dead = dead or failure.ending(pool.procs(), RESUME_WAIT_S)
            if not dead or (pool.recoverable and failure.killed(dead)):
                raise
        pool = self.renew(pool, dead)
        dl._pools = [pool]
        dl._meter.reset(dl._window(pool.config), skip=pool.config.queue,
                        group=pool.config.num_workers)
        pool.open(self.stream, 0)

    def first_pool(self, cfg: Config) -> tuple[Pool, bool, Config]:
        """The pool the epoch starts with, whether it is the last epoch's, kept, and the
        configuration the epoch's meter is for."""
        dl = self._dl
        if dl._sw.pending is not None:
            pool, dl._sw.pending = dl._sw.pending, None
            return self.unchanged(pool), False, cfg
        if dl._pools and dl._pools[-1].config == cfg:
            pool = dl._pools.pop()
            fresh = self.unchanged(pool)
            return fresh, fresh is pool, cfg
        if self.measure_first(cfg):
            # The first batch is made here; the start point is fitted to it and its workers
            # start while this process makes the next batches (a switch, see _after_batch).
            self.probing = cfg
            cfg = Config(0, None, False, cfg.pin_memory)
        return self.new_pool(cfg), False, cfg

    def unchanged(self, pool: Pool) -> Pool:
        """`pool`, kept from before this epoch, or a new pool of its configuration when the
        loop changed the dataset since its workers started and persistent_workers is the
        tuner's (see autotune.online.datastate): torch's default starts new workers every
        epoch, and the kept ones would go on with the dataset as it was."""
        dl = self._dl
        if pool.dataset_state is None or "persistent_workers" in dl._fixed:
            return pool  # the user's kept workers: kept, as torch keeps them
        what = datastate.changed(pool.dataset_state, datastate.state(dl.dataset))
        if what is None:
            return pool
        emit("dataset-changed", f"{what} changed since the workers of {pool.config.short()} "
             "started: new workers for this epoch, as torch's default "
             "(persistent_workers=False) would start them; give persistent_workers to "
             "decide it yourself", config=pool.config.kwargs(), changed=what)
        return self._replace(pool)

    def renew(self, pool: Pool, dead: list[tuple[int, int]]) -> Pool:
        """A new pool of `pool`'s configuration, `pool` (its `dead` workers ended) retired."""
        what = ", ".join(f"pid {pid} exit code {code}" for pid, code in dead)
        emit("renewed", f"the workers of {pool.config.short()} ended between the epochs "
             f"({what}): a new pool of the same configuration serves it",
             config=pool.config.kwargs(), dead=dead)
        return self._replace(pool)

    def _replace(self, pool: Pool) -> Pool:
        """A new pool of `pool`'s configuration; `pool` retired."""
        pool.lease.give_back()
        self.retire(pool)
        new = self.new_pool(pool.config)
        sw = self._dl._sw.current
        if sw is not None and sw.pool is pool:
            sw.pool = new  # a switch kept across the epoch's end: it ends with the new pool
        return new

    def end(self, completed: bool) -> None:
        """Keep the pool the next epoch starts with (a persistent one, or a switch's new
        pool still coming up); stop the others."""
        dl, sw = self._dl, self._dl._sw
        self.live = None
        keep: Pool | None = None
        if sw.pending is not None:
            keep = sw.pending
        elif dl._pools and dl._pools[-1].config == dl._target:
            keep = dl._pools[-1]
        for p in dl._pools + ([sw.pending] if sw.pending else []):
            if p is not keep:
                self.retire(p)
        if keep is not None and not keep.config.persistent_workers:
            self.retire(keep)
            keep = None
        if sw.current is not None and sw.current.pool is not keep:
            sw.current = None
        dl._pools = [keep] if keep is not None and keep is not sw.pending else []
        if keep is None:
            sw.pending = None
        if completed and self.epochs == 1 and dl.summary is None:
            dl._summarize()
        # An epoch left early counts once it served a window's worth (a loop that breaks
        # at N batches every epoch); one a fallback cut ran another configuration.
        latest, began = self.seen_at_begin
        if (completed or self.served >= MIN_WINDOW) and began == self.epoch_cfg:
            sw.epoch_unmeasured(began, self.served, dl._latest is not latest)

    def retire(self, pool: Pool) -> None:
        t = time.perf_counter()
        alive = pool.shutdown()
        self._dl.retired.append(alive)
        sw = self._dl._sw.current
        if sw is not None:
            sw.main_s += time.perf_counter() - t
        if alive:
            log.warning("workers %s of %s still running after shutdown", alive,
                        pool.config.short(), extra={"autotune_event": "not-gone",
                                                    "autotune": {"pids": alive}})

    # ---- one batch

    def next(self, token: object) -> Any:
        dl, sw = self._dl, self._dl._sw
        if token is not self.live:
            raise StopIteration
        t0 = time.perf_counter()
        step = None if self.last_return is None else t0 - self.last_return
        if sw.forced and not dl._iterable and sw.pending is None and sw.current is None:
            sw.begin(sw.forced.pop(0), "forced")
        if sw.pending is not None:
            sw.poll()
        while True:
            try:
                batch = self.take()
                break
            except StopIteration:
                if self.stream is None or self.stream.past_end():
                    self.end(completed=True)
                    raise
                # The sampler yields more than its len(): the serving pool goes on there.
                dl._pools[-1].open(self.stream, self.pos)
        self.served += 1
        t1 = time.perf_counter()
        dl._after_batch(batch, step, t1 - t0 + self.carry)
        self.last_return = time.perf_counter()
        # The loop waited through the bookkeeping too (a decision, a pool started): count
        # it in the next batch's wait, not in the user's step.
        self.carry = self.last_return - t1
        dl.overhead_s += self.carry
        return batch

    def take(self) -> Any:
        dl = self._dl
        while True:
            while len(dl._pools) > 1 and dl._pools[0].done:
                self.retire(dl._pools.pop(0))
            pool = dl._pools[0]
            try:
                dead = failure.dead_workers(pool.procs()) if pool.recoverable else []
                if dead:
                    raise failure.killed_error(dead)
                with failure.watching(pool.procs() if pool.recoverable else []):
                    batch = pool.next()
            except StopIteration:
                raise
            except Exception as e:  # noqa: BLE001 (ours recovered, the user's raised)
                recover_or_raise(dl, e)
                continue
            self.pos += 1
            return batch
