"""autotune.DataLoader's budgets: memory and /dev/shm read from the job's environment, the
memory figures the controller sees, and the workers' time budget sampled in a burst (it
raises the worker bound, or gives the verdict once tuning settled under AU 0.90)."""

from __future__ import annotations

import logging
import os
import time
import weakref
from dataclasses import replace
from typing import Any, Callable

from autotune.cpus import usable_cores
from autotune.online import cache, ddp, why
from autotune.online.config import Config
from autotune.online.controller import Controller, MemoryFigures, emit
from autotune.online.limits import over_budget, shm_room
from autotune.online.measure import WindowStats
from autotune.online.memory import worker_memory
from autotune.online.weakowner import WeakOwner
from autotune.shmfit import measure_batch

log = logging.getLogger("autotune.online")

# A burst describes this loader only where the loop took batches from it for at least this
# share of the seconds sampled, from the same workers throughout.
IN_USE_SHARE = 0.5
VERDICT_BURSTS = 3   # bursts tried for the verdict before it is given without a budget


def read_environment() -> tuple[Any, str | None]:
    """autotune.environment's reading, or None and why it failed (a budget unknown is not
    checked, and the loader says so: it must not end the user's run)."""
    from autotune.environment import read_environment as read

    try:
        return read(), None
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"


def root_path(dataset: Any) -> str | None:
    """The dataset's folder where it exposes one (for the verdict's commands)."""
    for attr in cache._ROOT_ATTRS:
        val = getattr(dataset, attr, None)
        if isinstance(val, (str, os.PathLike)):
            return os.fspath(val)
    src = getattr(dataset, "source", None)
    val = getattr(src, "root", None) or getattr(src, "path", None)
    return os.fspath(val) if isinstance(val, (str, os.PathLike)) else None


# Every autotune.DataLoader of this process: /dev/shm is one for all of them (a validation
# loader's batches beside the training loader's): what the others hold is not one's room.
LOADERS: weakref.WeakSet[Any] = weakref.WeakSet()


def shm_held_by_others(dl: Any) -> int:
    """Bytes of /dev/shm the other autotune.DataLoaders of this process may hold now: the
    batches in flight of their live epochs' pools with workers (autotune.shmfit's margin)."""
    from autotune.shmfit import needed_bytes

    held = 0
    for other in list(LOADERS):
        epoch = getattr(other, "_epoch", None)  # None: a loader whose construction failed
        if other is dl or epoch is None or epoch.live is None or not other._batch_bytes:
            continue
        for p in other._pools:
            if p.config.num_workers:
                held += needed_bytes(p.config.num_workers, p.config.prefetch_factor,
                                     other._batch_bytes)
    return held


def _beside(dl: Any) -> Callable[[], int]:
    """What the other loaders hold in /dev/shm beyond what they held when `dl` read its
    free space (the environment, at construction): that was already missing from it.
    Nothing under torch.distributed: there every rank must take the same decision from
    the same figures (autotune.online.ddp), and this one is each process's own."""
    ref = weakref.ref(dl)
    then = shm_held_by_others(dl)

    def beside() -> int:
        me = ref()
        if me is None or getattr(me, "_sync", None) is not None:
            return 0
        return max(0, shm_held_by_others(me) - then)
    return beside


class Budget:
    """One loader's budgets. `owner` is the autotune.DataLoader: its controller, ranks,
    pools and switch are read here, and a raised worker bound starts a switch there."""

    def __init__(self, owner: Any) -> None:
        self._owner = WeakOwner(owner)
        LOADERS.add(owner)
        # What the job's container allows, read once for this loader: every budget below.
        self.env, self.env_error = read_environment()
        self.stage_clock: Any = None  # autotune's own ImageDataset's stage seconds
        self.oom_group = False
        self.tensors = 0  # in the first batch (first_batch): open files while in flight
        self.shm_source = ""
        self.shared_mem: MemoryFigures | None = None
        self.said_why = False
        self.deferred: WindowStats | None = None  # a budget wanted during a switch
        self.burst: why.Burst | None = None      # the time budget being sampled, apart
        self.windows: list[WindowStats] = []
        self.burst_cfg: Config | None = None
        self.burst_pids: frozenset[int] = frozenset()
        self.busy = 0.0        # the loop's seconds in this loader (wait + step) in the burst
        self.verdict_bursts = 0
        self.purpose = "verdict"                # or "bound": the workers' blocked share
        self.stages0: dict[str, float] | None = None
        # The budget sampled at the worker bound: (its configuration, budget, seconds,
        # stages), the verdict's own when tuning settles there blocked on storage.
        self.bound_seen: tuple[Config, dict[str, Any], float, Any] | None = None

    @property
    def _dl(self) -> Any:
        return self._owner()  # the loader

    # ---- memory and /dev/shm

    def join_ranks(self, sync: ddp.RankSync | None) -> ddp.RankSync | None:
        """Under torch.distributed: this rank's share of the node's workers (the memory
        budget's share is in default_budget already)."""
        ctl = self._dl._ctl
        if sync is not None and isinstance(ctl, Controller):
            ctl.bound = max(1, ctl.bound // sync.local)
            if sync.rank != 0:
                ctl.cache_key_store = False
        return sync

    def fit_environment(self) -> None:
        """The /dev/shm budget (autotune.shmfit: free /dev/shm and the cgroup's remaining
        memory, this rank's share of the node); under cgroup v2 memory.oom.group=1 it and
        the default memory budget are halved (shmfit.oom_group_divisor, as search does),
        for there a worker killed takes the whole job with it."""
        from autotune.online.ddp import nccl_in_use
        from autotune.shmfit import shm_budget

        ctl, env = self._dl._ctl, self.env
        if env is None:
            e = self.env_error
            log.warning("the environment could not be read (%s): /dev/shm is not budgeted", e,
                        extra={"autotune_event": "environment", "autotune": {"why": str(e)}})
            return
        sb = shm_budget(env, self._dl._local, nccl=nccl_in_use())
        ctl.shm = sb.budget_bytes
        ctl.shm_ranks = max(1, self._dl._local or 1)
        ctl.beside = _beside(self._dl)
        self.shm_source = sb.source
        if sb.oom_group:
            self.oom_group = True
            emit("oom-group", f"{env.memory.source}: memory.oom.group is 1, so a worker the "
                 "OOM killer ends takes the whole job with it and no fallback is possible: "
                 f"budgets halved (/dev/shm {(ctl.shm or 0) / 2**20:,.0f} MiB, memory "
                 f"{ctl.budget / 2**20:,.0f} MiB)", shm_budget=ctl.shm, budget=ctl.budget)

    def first_batch(self, batch: Any) -> None:
        """The first batch's bytes (the loader's, for /dev/shm) and its tensors (open files
        in flight: autotune.openfiles)."""
        b = measure_batch(batch)
        self._dl._batch_bytes, self.tensors = b.total, b.tensors

    def memory(self) -> MemoryFigures:
        # Under DDP every rank's controller must see the same figures: the agreed ones
        # (a batch's tensors are the same on each: this rank's count).
        if self.shared_mem is not None:
            return replace(self.shared_mem, tensors=self.tensors)
        return self.memory_here()

    def memory_here(self) -> MemoryFigures:
        pools = self._dl._pools
        size, measured, try_one = worker_memory(pools[-1].pids() if pools else [],
                                                self._dl.multiprocessing_context, self.oom_group)
        return MemoryFigures(size, self._dl._batch_bytes or 0, measured, self.tensors,
                             try_one=try_one)

    # ---- the workers' time budget

    def cancel(self) -> None:
        """Drop the burst under way, if any."""
        if self.burst is not None:
            self.burst.cancel()
            self.burst = None

    def want(self, stats: WindowStats) -> None:
        """Start a time-budget burst (a process of its own, a few seconds) when one is
        needed: the climb stopped at the worker bound short of AU 0.95 (are the workers
        blocked on I/O? then the bound rises), or tuning settled under AU 0.90 (the
        verdict, said once). Never under DDP for the bound: the ranks must agree on it."""
        dl = self._dl
        if self.burst is not None or (dl._sync is not None and dl._sync.rank):
            return
        ctl = dl._ctl
        if getattr(ctl, "wants_budget", False) and dl._sync is None:
            purpose = "bound"
        elif not self.said_why and getattr(ctl, "phase", None) == "settled" \
                and stats.au < why.INPUT_BOUND_AU:
            purpose = "verdict"
            seen = self.bound_seen
            if getattr(ctl, "storage", False) and seen is not None and seen[0] == ctl.tuned:
                # Settled where the bound's budget was sampled, blocked on storage: that
                # budget is the verdict's; no second burst, the verdict at once.
                best = getattr(ctl, "best", None)
                self.verdict(seen[0], seen[1], seen[2], seen[3],
                             best.stats if best is not None and best.stats else stats)
                return
        else:
            return
        if dl._switch is not None or dl._pending is not None:
            # A switch under way (the controller settling back, say): the old pool's workers
            # still serve beside the new pool's, and the budget would count both. Sample
            # once the new pool serves alone (Switcher.finish asks again).
            self.deferred = stats
            return
        self.deferred = None
        serving = dl._pools[-1] if dl._pools else None
        pids = serving.pids() if serving is not None else []
        self.burst, self.burst_cfg, self.purpose = why.Burst(
            os.getpid(), workers=pids, path=root_path(dl.dataset)), dl._running, purpose
        self.burst_pids, self.busy = frozenset(pids), 0.0
        self.verdict_bursts += purpose == "verdict"
        self.windows = []
        clock = self.stage_clock
        self.stages0 = clock.totals() if clock is not None else None

    def window(self, stats: WindowStats, cfg: Config) -> None:
        """A window while a burst samples: its figures go with the budget; when the budget
        is in, it raises the worker bound or gives the verdict."""
        burst = self.burst
        if burst is None:
            return
        if cfg != self.burst_cfg:  # another pool now: the budget would mix two
            self.cancel()
            return
        self.windows.append(stats)
        if self.purpose == "bound" or not burst.done():
            return  # the bound's budget is taken per batch (bound_done)
        self.burst = None
        if getattr(self._dl._ctl, "phase", None) == "settled":
            wall = time.perf_counter() - burst.started
            budget = self.result(burst)
            if budget.pop("apart", False) and self.verdict_bursts < VERDICT_BURSTS:
                return  # another burst at the next window (want)
            latest = self._dl._latest
            stats = why.merge(self.windows) or (latest.stats if latest else None)
            self.verdict(cfg, budget, wall, self.stages(cfg, wall), stats)

    def result(self, burst: why.Burst) -> dict[str, Any]:
        """The burst's time budget where it describes this loader at work; else a missing
        budget that says why (key "apart"). A validation loader's workers sampled while the
        training loop ran sit idle, and a pool not kept between epochs is replaced by new
        workers the sample does not count: either read as "the workers are idle, the wait
        is in the main process" or "1 worker: too few workers", about a loader held back
        by decode or storage."""
        got = burst.result()
        if got.get("available") is False:
            return got   # the sampler's own failure, said as it is, not retried as "apart"
        serving = self._dl._pools[-1] if self._dl._pools else None
        span = min(time.perf_counter() - burst.started, burst.seconds)
        if serving is None or frozenset(serving.pids()) != self.burst_pids:
            why_not = ("the workers sampled were replaced by another pool's during the "
                       "sample (workers not kept between epochs)")
        elif self.busy < IN_USE_SHARE * span:
            why_not = (f"the loop took batches from this loader {self.busy:.1f} s of the "
                       f"{span:.1f} s sampled (its workers idle between its epochs, as a "
                       "validation loader's are)")
        else:
            return got
        return {"available": False, "reason": why_not, "apart": True,
                "fix": "`autotune monitor` samples the whole run"}

    def stages(self, cfg: Config, wall: float) -> Any:
        """The stage budget since the burst began (autotune's own ImageDataset), else None."""
        if self.stage_clock is None or self.stages0 is None:
            return None
        from autotune.data.stages import stage_budget

        return stage_budget(self.stages0, self.stage_clock.totals(),
                            workers=cfg.num_workers, wall_s=wall)

    def credit(self, step: float | None, wait: float) -> None:
        """The loop's seconds in this loader inside the burst's window: the span a batch
        closes (the step before it and its wait), clipped to the window. Before the window's
        figures are read (a batch slower than the window is in it for the part inside: behind
        a slow disk no batch ends within the window)."""
        burst = self.burst
        if burst is None:
            return
        now = time.perf_counter()
        lo = max(now - wait - (step or 0.0), burst.started)
        self.busy += max(0.0, min(now, burst.started + burst.seconds) - lo)

    def after_batch(self) -> None:
        """The bound's budget needs no window of its own: act on it at once (behind a slow
        disk the next window closes many seconds later)."""
        if self.burst is not None and self.purpose == "bound" and self.burst.done():
            self.bound_done()

    def bound_done(self) -> None:
        """The bound's budget is in: the worker bound from it, and the climb goes on."""
        burst, cfg, dl = self.burst, self.burst_cfg, self._dl
        assert burst is not None and cfg is not None
        budget = self.result(burst)
        self.burst = None
        wall = time.perf_counter() - burst.started
        self.bound_seen = (cfg, budget, wall, self.stages(cfg, wall))
        new = self.bound_from(budget)
        if new is not None and new != dl._running and dl._pending is None \
                and dl._switch is None:
            dl._sw.begin(new, "controller")

    def bound_from(self, budget: dict[str, Any]) -> Config | None:
        """The worker bound from the workers' blocked share (bounds.worker_bound)."""
        from autotune.monitor.timebudget import TimeBudget
        from autotune.verdict.bounds import worker_bound

        ctl = self._dl._ctl
        tb = TimeBudget.from_dict(budget) if budget.get("available", True) else None
        wc = tb.cls("workers") if tb is not None else None
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
            f"the {wc.at_once(tb.wall_s)} workers were blocked on storage {wc.blocked():.0%}{also} of "
            "their time (the bound is cores / (1 - blocked))")

    def no_room(self, v: Any, cfg: Config) -> None:
        """A "too few workers" verdict where one more worker, even one batch ahead, does not
        fit this job's /dev/shm or memory budget: said so, with the fix, in place of "raise
        num_workers" (in Docker's 64 MiB /dev/shm, 18 MiB batches and 1 worker: 2 workers
        would have failed as torch's "unable to allocate shared memory")."""
        ctl = self._dl._ctl
        mem = getattr(ctl, "memory", None)
        if mem is None or getattr(ctl, "budget", None) is None:
            return
        shm = shm_room(ctl)
        more = cfg.with_(num_workers=cfg.num_workers + 1, prefetch_factor=1)
        why_not = over_budget(more, cfg.with_(num_workers=0), mem(), ctl.budget, shm)
        if why_not is None:
            return
        from autotune.openfiles import fix as files_fix

        fix = ("a larger /dev/shm (`docker run --shm-size`, a Kubernetes emptyDir of medium "
               "Memory), a smaller batch element (uint8, normalised on the accelerator) or a "
               "smaller batch lets more workers run" if "/dev/shm" in why_not else
               f"to let more workers run, {files_fix()}" if "(ulimit -n)" in why_not else
               "more memory for the job, or a lighter dataset per worker, lets more run")
        v.summary += f"; but more workers do not fit: {why_not}; {fix}"
        v.advice = [a for a in v.advice if "num_workers" not in a] + [fix]

    def verdict(self, cfg: Config, budget: dict[str, Any], wall: float, stages: Any,
                stats: WindowStats | None) -> None:
        """Why AU stays under 0.90 after tuning: the verdict engine, said once. A storage
        verdict ends the tuning: no setting can help (the verdict names convert/stage)."""
        if stats is None or stats.au >= why.INPUT_BOUND_AU:
            return  # it kept up over the burst: nothing to explain yet
        self.said_why = True
        dl = self._dl
        bound = getattr(dl._ctl, "bound", None)
        v = why.explain(why.Figures(
            stats=stats, loader=cfg.kwargs(), batch_size=dl.batch_size,
            cores=usable_cores(), budget=budget, stages=stages,
            dataset=root_path(dl.dataset),
            worker_bound=bound if dl._sync is not None else None, ranks=dl._local))
        from autotune.verdict.rules.on_cpu import TOO_FEW_WORKERS

        if v.bottleneck == "loader" and TOO_FEW_WORKERS in v.summary:
            self.no_room(v, cfg)
        dl.verdict = v
        if v.bottleneck == "storage" and hasattr(dl._ctl, "storage_verdict"):
            dl._ctl.storage_verdict()
        # At WARNING: the one record that says the run is still held back and what to do,
        # which a user without logging set up saw nothing of.
        emit("verdict", f"AU {stats.au:.2f} after tuning (under {why.INPUT_BOUND_AU:.2f}): "
             f"{v.summary}; next: {v.next_command}", warn=True, bottleneck=v.bottleneck,
             au=stats.au, verdict=v.to_dict())
