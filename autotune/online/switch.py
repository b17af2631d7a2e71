"""autotune.DataLoader's switches: a new pool started idle while the old one serves, handed
the rest of the epoch at a batch boundary once its workers are up, measured and charged;
under torch.distributed, the decisions the ranks take together at agreed steps. An
IterableDataset switches at the next epoch boundary instead."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from autotune.online import datastate, failure
from autotune.online.config import Config
from autotune.online.controller import Controller, MemoryFigures, emit
from autotune.online.measure import window_of
from autotune.online.pool import Pool
from autotune.online.weakowner import WeakOwner

log = logging.getLogger("autotune.online")

READY_TIMEOUT_S = 120.0  # a pool whose workers are not up by then is given up


@dataclass
class Switch:
    pool: Pool
    old: Config
    reason: str
    decided_at: float
    main_s: float = 0.0     # seconds spent in this process starting, opening, retiring
    wait_s: float = 0.0     # wait inside next() from the decision to the new pool's first batch
    wall_s: float = 0.0
    batches: int = 0


class Switcher:
    """One loader's switches. `owner` is the autotune.DataLoader: its pools, controller,
    meter and ranks are read and changed here."""

    def __init__(self, owner: Any, target: Config) -> None:
        self._owner = WeakOwner(owner)
        self.pending: Pool | None = None    # the new pool, its workers coming up
        self.current: Switch | None = None  # from the decision to the new pool's first batch
        self.forced: list[Config] = []      # tests: configurations to switch to, in turn
        # DDP: this rank's failed configuration and the fallback it took (None: a new pool
        # that could not start), told to every rank at the next decision step.
        self.failed: tuple[Config, Config | None] | None = None
        self.agreed = target                # DDP: the configuration the ranks agreed on
        self.next_decision = window_of(target)
        self.kept_said = False              # keeps_workers() said why tuning stopped

    @property
    def _dl(self) -> Any:
        return self._owner()  # the loader

    def note_failed(self, failed: Config, to: Config | None) -> None:
        """DDP: a failure to tell the ranks at the next decision step. One this rank fell
        back from (`to`: where it runs now) replaces any before it (a later fallback's
        failed configuration is the earlier one's fallback, and needs as much as what
        failed first); a new pool that could not start does not replace one."""
        if self.failed is None or to is not None:
            self.failed = (failed, to)

    def drop(self) -> None:
        """Forget the switch under way (its pool is retired by the caller)."""
        self.pending, self.current = None, None

    def begin(self, cfg: Config, reason: str) -> None:
        dl = self._dl
        if dl._iterable:
            dl._target = cfg
            emit("switch", f"{cfg.short()} from the next epoch on (an IterableDataset "
                 "switches at epoch boundaries)", config=cfg.kwargs())
            return
        if cfg == dl._running or self.keeps_workers():
            return
        t = time.perf_counter()
        pool = dl._epoch.new_pool(cfg)
        if cfg.num_workers:
            pool.start_idle()  # idle: its workers come up while the old pool serves
        self.pending, dl._target = pool, cfg
        self.current = Switch(pool, dl._running, reason, t, time.perf_counter() - t)

    def epoch_unmeasured(self, ran: Config, served: int, measured: bool) -> None:
        """After an IterableDataset's epoch that ran a trial (`ran`, not the kept
        configuration) and closed no window: its workers start anew each epoch and their
        first queue of batches is not counted, so an epoch this short never measures it.
        Back to the kept configuration from the next epoch on, and tuning stops (it stayed
        on the trial for good, the kept one reported)."""
        dl = self._dl
        kept = dl._ctl.tuned
        if (measured or not (dl._iterable and dl._tuning) or ran.persistent_workers
                or ran != dl._target or ran == kept):
            return   # kept workers carry a window on into the next epoch
        dl._target, dl._tuning = kept, False
        emit("unmeasured", f"an epoch of {served} batches is too short to measure "
             f"{ran.short()} (up to the new pool's first {ran.queue} batches are not "
             f"counted, and a window needs {window_of(ran)}): back to {kept.short()} from "
             "the next epoch on, and tuning stops", config=kept.kwargs(), tried=ran.kwargs())

    def keeps_workers(self) -> bool:
        """Whether the serving pool's workers are the user's to keep (persistent_workers=True
        given) and the loop has changed the dataset since they started: torch's kept
        workers go on with the dataset as it was, and a new pool's would see the change (a
        new size, another item set). Then no switch, and tuning stops there (said once)."""
        dl = self._dl
        pool = dl._pools[-1] if dl._pools else None
        if (pool is None or pool.dataset_state is None
                or not dl._fixed.get("persistent_workers")):
            return False
        what = datastate.changed(pool.dataset_state, datastate.state(dl.dataset))
        if what is None:
            return False
        if not self.kept_said:
            self.kept_said, dl._tuning = True, False
            emit("kept-workers", f"{what} changed since the workers of {pool.config.short()} "
                 "started, and persistent_workers=True is yours: they are kept, as torch "
                 "keeps them (with the dataset as it was), so tuning stops at "
                 f"{pool.config.short()}; give persistent_workers=False for new workers "
                 "each epoch", config=pool.config.kwargs(), changed=what)
        return True

    def poll(self) -> None:
        """The pending pool: activated once its workers are up, given up if they fail."""
        pool, dl = self.pending, self._dl
        assert pool is not None
        if pool.ready():
            self.activate(pool)
            return
        reason = None
        if pool.died():
            reason = "a worker exited while starting"
        elif pool.started_at is not None and \
                time.perf_counter() - pool.started_at > READY_TIMEOUT_S:
            reason = f"workers not up after {READY_TIMEOUT_S:.0f} s"
        if reason is None:
            return
        self.drop()
        dl._epoch.retire(pool)
        dl._target = dl._running
        if dl._sync is not None:
            self.note_failed(pool.config, None)  # told to every rank at the next decision step
            return
        new = dl._ctl.failed(pool.config, reason) if dl._tuning else None
        if new is not None and new != dl._running:
            self.begin(new, "controller")

    def activate(self, pool: Pool) -> None:
        """Close the last pool's lease at a batch boundary and give the new pool the rest."""
        dl = self._dl
        last = dl._pools[-1]
        # A pool without workers fetches in this process: let it serve one more batch while
        # the new workers fetch their first.
        boundary = last.lease.next + (0 if last.config.num_workers else 1)
        last.lease.stop = boundary
        try:
            main_s = pool.open(dl._epoch.stream, boundary)
        except Exception as e:  # noqa: BLE001 (the old pool serves on)
            last.lease.stop = None
            pool.lease.give_back()
            if failure.classify(e, pool.procs()) is None:
                raise
            self.drop()
            dl._epoch.retire(pool)
            dl._target = dl._running
            if dl._sync is not None:   # every rank falls back alike at the next step
                self.note_failed(pool.config, dl._running)
            elif dl._tuning and isinstance(dl._ctl, Controller):
                dl._ctl.fell_back(pool.config, dl._running, str(e))
            return
        dl._pools.append(pool)
        self.pending = None
        if self.current is not None:
            self.current.main_s += main_s

    def after_batch(self, step: float | None, wait: float) -> bool:
        """Count a batch served during a switch; whether one is under way."""
        sw = self.current
        if sw is None:
            return False
        sw.wait_s += wait
        sw.wall_s += wait + (step or 0.0)
        sw.batches += 1
        if self._dl._pools[0] is sw.pool:
            self.finish(sw)
        return True

    def finish(self, sw: Switch) -> None:
        """The new pool served its first batch: measure the switch and charge it."""
        dl, budget = self._dl, self._dl._budget
        self.current = None
        old_share = dl._latest.stats.wait_share if dl._latest else 0.0
        # What the switch cost the loop: the wait beyond what the old pool would have made.
        cost = max(0.0, sw.wait_s - old_share * sw.wall_s)
        pool = sw.pool
        # Up when its first batch came at the latest (a pool handed on at an epoch's end,
        # still starting, never saw its ready flags read: it said "up in 0.00 s").
        up = ((pool.ready_at or time.perf_counter()) - pool.started_at
              if pool.started_at else None)
        took = "?" if up is None else f"{up:.2f}"
        cfg = pool.config
        dl._meter.reset(dl._window(cfg), skip=cfg.queue, group=cfg.num_workers)
        if dl._tuning and sw.reason == "controller":
            dl._ctl.charge(cfg, cost)
        wanted, budget.deferred = budget.deferred, None
        if wanted is not None and dl._tuning:
            # The old pool is retired: its workers are out of the budget from here on.
            budget.want(wanted)
        # The first pool after the batch made in this process is a start, not a decision.
        event = "started" if sw.reason.startswith("start") else "switched"
        emit(event, f"switched {sw.old.short()} -> {cfg.short()} ({sw.reason}): workers "
             f"up in {took} s, {sw.batches} batches of overlap, cost {cost:.3f} s of wait "
             f"beyond the old pool's (starting and stopping pools took {sw.main_s:.3f} s "
             "here, partly while waiting anyway)",
             config=cfg.kwargs(), old=sw.old.kwargs(), cost_s=cost, startup_s=up,
             main_s=sw.main_s, overlap_batches=sw.batches, reason=sw.reason)

    def decide_together(self) -> None:
        """DDP: the agreed decision step (every rank is here at this same step)."""
        dl = self._dl
        assert dl._sync is not None
        need = window_of(self.agreed)
        self.next_decision = dl._steps + need
        local = dl._meter.peek() if len(dl._meter.steps) >= need else None
        busy = self.current is not None or self.pending is not None
        mem = dl._budget.memory_here()
        failed, self.failed = self.failed, None
        try:
            shared = dl._sync.exchange(local, busy, mem.per_worker, mem.per_batch,
                                       _failure(*failed) if failed is not None else None,
                                       switching=busy)
        except RuntimeError as e:  # a rank out of step (uneven epochs) or gone
            dl._sync, dl._tuning = None, False
            log.warning("ranks out of step at step %d (%s): tuning stopped at %s", dl._steps,
                        e, dl._running.short(), extra={"autotune_event": "ddp-stopped",
                                                       "autotune": {"step": dl._steps}})
            return
        dl._budget.shared_mem = MemoryFigures(shared.per_worker, shared.per_batch, mem.measured)
        if shared.failed and shared.switching:
            # A rank still switching would finish its switch after the ranks fell back (into
            # the failed configuration, or a larger one): the failure is told again at the
            # next step, once no rank is (no switch begins meanwhile).
            self.failed = failed
            return
        if shared.failed:
            self.agreed = _agree_failed(dl._ctl, shared)
        elif shared.slowest is not None:
            dl._meter.reset(dl._window(dl._running), group=dl._running.num_workers)
            dl._on_window(shared.slowest)
            self.agreed = dl._target
        else:
            return
        if self.agreed != dl._running and self.pending is None and self.current is None:
            self.begin(self.agreed, "controller")
        self.next_decision = dl._steps + window_of(self.agreed)


def _failure(failed: Config, to: Config | None) -> tuple[int, int, int, int]:
    """A rank's failure as the exchange carries it (prefetch_factor None, and no fallback,
    as -1)."""
    return (failed.num_workers, failed.prefetch_factor or -1,
            to.num_workers if to is not None else -1,
            (to.prefetch_factor or -1) if to is not None else -1)


def _agree_failed(ctl: Any, shared: Any) -> Config:
    """What every rank takes after a rank's failure, from the same figures on each: the
    fallback that rank took (its pool failed mid-run: every rank carries on there, none
    tries the failed configuration again), else the controller's next step past a new
    pool that could not start."""
    w, pf = shared.failed_cfg
    failed = ctl.make(w, pf if pf > 0 else None)
    if shared.fallback is None:
        return ctl.failed(failed, "a rank's new pool could not start") or ctl.tuned
    to = ctl.make(shared.fallback[0], shared.fallback[1] if shared.fallback[1] > 0 else None)
    ctl.fell_back(failed, to, "a rank's pool failed")
    emit("failed", f"{failed.short()} failed on a rank: every rank carries on at {to.short()} "
         "and none tries it again", config=to.kwargs(), failed=failed.kwargs())
    return to
