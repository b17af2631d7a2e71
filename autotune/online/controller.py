"""The in-loop controller: a known-good start, then hill climbing one knob at a time.

As tf.data's autotune does, it changes one knob (num_workers, then prefetch_factor) a step
at a time and keeps a change only when the wait share of a full window fell beyond the
noise of the two windows; it is bounded by the worker bound and a memory budget (workers'
own memory plus the batches in flight, both pools counted during a switch's overlap). It settles
when AU >= 0.95 or no knob helps, and tunes again only when the wait share stays above the
settled one for several windows. At the worker bound with the workers blocked on storage
the bound rises (more reads in flight hide a latency); when one worker past the cores then
does not help, the storage's own rate is the limit: it settles there at once (a deeper
prefetch adds no reads in flight) and, as after any storage verdict, switches no more.
Every decision is one logging record on "autotune.online" (autotune.online.decisions). The
next step and the bound it meets are autotune.online.steps'; what a configuration may hold
(memory, /dev/shm) is autotune.online.limits'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from autotune.online import cache, limits, steps
from autotune.online.config import Config
from autotune.online.decisions import emit
from autotune.online.limits import MemoryFigures
from autotune.online.measure import WindowStats, beyond_noise, noise_margin

SETTLE_AU = 0.95
RETUNE_WINDOWS = 3      # windows in a row above the settled wait share before tuning again
RETUNE_MARGIN = 0.05    # ... by at least this much (and beyond the window's noise)
RULE_MAX_WORKERS = 8    # the rule of thumb: min(8, cores)


def _worker_bound() -> int:
    """Most workers the controller may try: the verdict engine's worker bound on the
    usable cores (cgroup quota, affinity), the one `search` and the verdicts use."""
    from autotune.cpus import usable_cores
    from autotune.verdict.bounds import worker_bound

    return worker_bound(usable_cores())


@dataclass
class _Trial:
    config: Config
    stats: WindowStats | None = None
    switch_cost_s: float = 0.0


@dataclass
class Controller:
    """Decides the next configuration from each full window of the current one.

    `fixed` holds the settings the user gave (never changed); `memory` returns the figures
    for the budget check."""

    fixed: dict[str, Any]
    cuda: bool
    budget: int
    memory: Callable[[], MemoryFigures]
    cache_key: str | None = None
    cache_key_store: bool = True          # False on DDP ranks other than 0
    bound: int = field(default_factory=lambda: _worker_bound())
    phase: str = "measure"                # measure -> trial ... -> (confirm ->) settled
    best: _Trial | None = None
    first: _Trial | None = None           # the start point's first window (the summary's "before")
    last: WindowStats | None = None
    trials: list[_Trial] = field(default_factory=list)
    _knob: int = 0
    _high: int = 0
    sample_bound: bool = False            # the loader can sample the workers' time budget
    bound_hit: bool = False               # a num_workers step was refused at the bound
    bound_checked: bool = False           # ... and the workers' blocked share looked at
    _reopen: bool = False
    # Configurations a trial rejected since the last retune: a re-opened climb does not
    # switch to them again (each switch costs; the same window would say the same).
    _rejected: set = field(default_factory=set)
    _current: Config | None = None
    _cause: _Trial | None = None
    # The bound before the workers were seen blocked on storage (None: never raised).
    cores_bound: int | None = None
    storage: bool = False                 # storage-bound: no configuration helps, no switches
    # /dev/shm this loader's batches may fill (autotune.shmfit; None: unknown, not checked).
    shm: int | None = None
    # What the process's other loaders hold in /dev/shm beyond what they held when `shm`
    # was read (limits.shm_room).
    beside: Callable[[], int] | None = None
    shm_ranks: int = 1   # the ranks sharing this node's /dev/shm: a fix names the node's size
    # Configurations whose pool failed (shm refused, a worker killed): neither they nor any
    # needing as much (as many workers and as long a queue) is tried again in this run.
    failed_configs: list = field(default_factory=list)
    # A worker_init_fn was given: the dataset may work only in workers set up by it, so no
    # configuration loads in this process (num_workers=0) unless the user gave that.
    needs_workers: bool = False
    # Knobs not given but never tuned: an IterableDataset's prefetch_factor when the user
    # keeps its workers (a pool for another one would replace them; autotune.online.untuned).
    held: frozenset = frozenset()
    cut: bool = False     # cut to fit /dev/shm or memory, or a pool failed (cache.remember)

    # ---- configurations

    def make(self, num_workers: int, prefetch_factor: int | None = 2) -> Config:
        """A configuration with the user's settings applied over the tuned ones."""
        w = self.fixed.get("num_workers", num_workers)
        pf = self.fixed.get("prefetch_factor", prefetch_factor) if w else None
        return Config(w, pf, bool(self.fixed.get("persistent_workers", True)),
                      bool(self.fixed.get("pin_memory", self.cuda)))

    @property
    def knobs(self) -> list[str]:
        if self.fixed.get("num_workers") == 0:
            return []
        return [k for k in ("num_workers", "prefetch_factor") if k not in {*self.fixed, *self.held}]

    def min_workers(self) -> int:
        # A prefetch_factor or persistent_workers=True the user gave needs workers in torch;
        # a worker_init_fn, workers to run it.
        need = ("prefetch_factor" in self.fixed or self.fixed.get("persistent_workers")
                or self.needs_workers)
        return 1 if need else 0

    def start(self) -> Config:
        """The start point: this dataset's cached settings, else the rule of thumb; capped by
        the worker bound and the budget."""
        stored = cache.load(self.cache_key) if self.cache_key else None
        if stored and isinstance(stored.get("num_workers"), int):
            # at least the workers this loader needs (a cache written without a worker_init_fn)
            cfg = self.make(max(self.min_workers(), min(stored["num_workers"], self.bound)),
                            stored.get("prefetch_factor") or 2)
            source = "cached for this dataset and machine"
        else:
            cfg = self.make(min(RULE_MAX_WORKERS, self.bound), 2)
            source = "the rule of thumb min(8, usable cores)"
        if not self.knobs:
            source = "the settings given: nothing to tune"
        elif "num_workers" in self.fixed:   # an IterableDataset's workers, or the user's
            source = "num_workers as given, prefetch_factor " + (
                "cached for this dataset and machine" if stored else "torch's default")
        wanted, cfg = cfg, limits.fit(self, cfg)
        self._current = cfg
        source += f" gave {wanted.short()}, cut to fit the budgets" if cfg != wanted else ""
        emit("start", f"start at {cfg.short()} ({source}; worker bound {self.bound})",
             config=cfg.kwargs(), source=source, bound=self.bound)
        if cfg != wanted:   # refit, after the first batch, then sees nothing more to cut
            limits.say_fit(self, wanted, cfg, None)
            self.cut = True
        return cfg

    def refit(self, cfg: Config) -> Config:
        """The start point again, once the first batch is measured: within the /dev/shm and
        memory budgets."""
        fitted = limits.fit(self, cfg)
        if fitted != cfg:
            limits.say_fit(self, cfg, fitted, self.memory().per_batch)
            self.cut = True
        self._current = fitted
        return fitted

    def needs_as_much(self, cfg: Config) -> Config | None:
        """The failed configuration `cfg` needs as much as (None: none)."""
        for f in self.failed_configs:
            if cfg.num_workers >= f.num_workers and cfg.queue >= f.queue:
                return f
        return None

    def fell_back(self, failed: Config, to: Config, why: str) -> None:
        """A pool of `failed` failed and the loop carries on at `to`: neither `failed` nor
        any configuration needing as much is tried again; `to` is where tuning stands."""
        if failed not in self.failed_configs:
            self.failed_configs.append(failed)
        self.cut = True
        self._current = to
        trial = self._trial(to)
        if self.best is None or self.needs_as_much(self.best.config) is not None:
            self.best = trial
        if self.phase == "trial":
            self.phase = "measure"  # the trial is over: measure where the loop now runs
        self._cause = None

    def adopt(self, cfg: Config) -> None:
        """Run from `cfg` instead of the own start point (DDP: rank 0's)."""
        self._current = cfg

    # ---- the climb

    def charge(self, cfg: Config, cost_s: float) -> None:
        """A switch's own cost, charged to the configuration that caused it: the one tried,
        and for the way back from a rejected trial, that trial."""
        self._current = cfg
        (self._cause or self._trial(cfg)).switch_cost_s += cost_s
        self._cause = None

    @property
    def switch_cost_s(self) -> float:
        """Every switch's cost so far."""
        return sum(t.switch_cost_s for t in self.trials)

    def failed(self, cfg: Config, why: str) -> Config | None:
        """A pool could not be started: drop the knob and go on from the best."""
        if cfg not in self.failed_configs:
            self.failed_configs.append(cfg)  # not tried again in this run
        emit("failed", f"{cfg.short()} could not start ({why}); staying at "
             f"{self._best_cfg().short()}", config=cfg.kwargs(), why=why)
        self._knob += 1
        return self._next_step()

    def observe(self, stats: WindowStats, cfg: Config) -> Config | None:
        """One full window of `cfg`; the configuration to switch to, or None."""
        self._current = cfg
        self.last = stats
        trial = self._trial(cfg)
        if trial.stats is None or self.phase != "settled":
            trial.stats = stats
        if self.first is None:
            self.first = _Trial(cfg, stats)
        if self.phase in ("measure", "confirm"):
            self.best = trial
            return self._next_step()
        if self.phase == "trial":
            return self._judge(trial)
        if self.phase == "budget":
            return None  # until workers_blocked()
        return self._watch(stats, cfg)

    def _trial(self, cfg: Config) -> _Trial:
        for t in reversed(self.trials):
            if t.config == cfg:
                return t
        t = _Trial(cfg)
        self.trials.append(t)
        return t

    def _best_cfg(self) -> Config:
        return self.best.config if self.best else (self._current or self.make(0))

    def _judge(self, trial: _Trial) -> Config | None:
        best = self.best
        assert best is not None and best.stats is not None and trial.stats is not None
        old, new = best.stats, trial.stats
        fields = dict(config=trial.config.kwargs(), wait_before=old.wait_share,
                      wait_after=new.wait_share, noise=max(old.noise, new.noise),
                      switch_cost_s=trial.switch_cost_s)
        if beyond_noise(old, new):
            emit("keep", f"keep {trial.config.short()}: wait {_pct(old.wait_share)} -> "
                 f"{_pct(new.wait_share)} (noise {_pct(max(old.noise, new.noise))}; switch "
                 f"cost {trial.switch_cost_s:.2f} s charged to it)", **fields)
            self.best = trial
            return self._next_step()
        how = "worse" if new.wait_share - old.wait_share > noise_margin(old, new) else "within the noise"
        emit("reject", f"{trial.config.short()} does not help: wait {_pct(old.wait_share)} -> "
             f"{_pct(new.wait_share)}, {how}; back to {best.config.short()}", **fields)
        self._knob += 1
        self._rejected.add(trial.config)
        if steps.past_cores(self.cores_bound, trial.config, best.config):
            # Blocked on storage, and one more read in flight did not help: the storage's
            # rate is the limit; a deeper prefetch adds no reads in flight either.
            self.storage = True
            self._cause = trial
            return self._settle(f"the workers were waiting (blocked on storage, or asleep "
                                f"inside their work) and {trial.config.num_workers} workers (past the "
                                f"{self.cores_bound} cores) did not help")
        # From a rejected trial go straight to the next one, or back to the best.
        nxt = self._next_step()
        if nxt is None or nxt == best.config:
            self._cause = trial  # the way back is this trial's cost
            return best.config
        return nxt

    def storage_verdict(self) -> None:
        """The verdict said storage: more workers or a deeper queue cannot help; no more
        switches (the verdict names `autotune convert` / `stage`)."""
        self.storage = True

    def _next_step(self) -> Config | None:
        best = self.best
        if best is not None and best.stats is not None and best.stats.au >= SETTLE_AU:
            if self.phase != "confirm" and not self.storage:
                # One window at AU >= 0.95 may be a full queue's or a quiet moment's (seen:
                # "settled in 2 s, AU 0.98" in a run whose AU was 0.71): one more window of
                # the same configuration before settling on it.
                self.phase = "confirm"
                return None
            return self._settle(f"AU {best.stats.au:.2f} >= {SETTLE_AU} in two windows in a row")
        cand = steps.propose(self)
        if cand is steps.PAUSE:
            return None
        if cand is None:
            return self._settle("no knob helps further")
        self.phase = "trial"
        self._cause = self._trial(cand)
        emit("try", f"try {cand.short()} (from {self._best_cfg().short()})",
             config=cand.kwargs())
        return cand

    def _settle(self, why: str) -> Config | None:
        best = self._best_cfg()
        self.phase = "settled"
        self._high = 0
        share = self.best.stats.wait_share if self.best and self.best.stats else 0.0
        emit("settle", f"settled at {best.short()}: {why}, wait {_pct(share)}",
             config=best.kwargs(), why=why, wait=share)
        if self.cache_key and self.cache_key_store:
            cache.remember(self.cache_key, best, cut=self.cut)
        cur = self._current
        return best if cur is not None and cur != best else None

    def _watch(self, stats: WindowStats, cfg: Config) -> Config | None:
        best = self.best
        if best is None or best.stats is None or cfg != best.config or self.storage:
            return None
        settled = best.stats.wait_share
        if stats.wait_share > settled + max(RETUNE_MARGIN, 2 * stats.noise):
            self._high += 1
        else:
            self._high = 0
        if self._high < RETUNE_WINDOWS:
            return None
        emit("retune", f"wait {_pct(stats.wait_share)} above the settled {_pct(settled)} for "
             f"{RETUNE_WINDOWS} windows: tuning again from {cfg.short()}",
             wait=stats.wait_share, settled=settled)
        best.stats = stats
        self._knob = 0
        self._rejected.clear()  # the conditions changed: what did not help may now
        self.phase = "measure"
        return self._next_step()

    @property
    def wants_budget(self) -> bool:
        """The climb waits at the worker bound for the workers' time budget: blocked on
        I/O, they raise the bound (bounds.worker_bound); see workers_blocked."""
        return self.phase == "budget"

    def workers_blocked(self, blocked: float | None, bound: int, why: str) -> Config | None:
        """The workers' blocked share measured at the bound, and the bound it gives
        (autotune.verdict.bounds.worker_bound). A higher bound re-opens the climb on
        num_workers from the best configuration. Waiting at the bound, the climb goes on
        at once (the configuration to switch to, or None): the window that hit the bound
        is measured already, and behind a slow disk another takes many seconds. Otherwise
        the next full window proposes."""
        self.bound_checked = True
        waiting = self.phase == "budget"
        if waiting:
            self.phase = "measure"
        steps.raise_bound(self, blocked, bound, why)
        return self._next_step() if waiting else None

    @property
    def tuned(self) -> Config:
        """The best configuration so far."""
        return self._best_cfg()


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"
