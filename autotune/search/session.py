"""One search over an open Optuna study: ceilings, space, the baseline and the trial loop.

The study runs through Optuna's ask-and-tell interface so that the search, not Optuna,
decides what a trial costs: a configuration already measured is answered from the study
without measuring it again, a failed or over-memory configuration is recorded with its
reason, and a trial left running by a search that died is marked interrupted (and its
configuration measured again). The settings' checks before any trial are
autotune.search.precheck's; the study's trials as other searches left them,
autotune.search.sharedtrials'.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.bench.config import BenchConfig
from autotune.bench.runner import run_bench
from autotune.errors import UsageError
from autotune.search import recommend as rec_mod
from autotune.search import sharedtrials
from autotune.search.ceilings import Ceilings
from autotune.search.filesgate import FilesGate, files_gate
from autotune.search.sendgate import SendGate
from autotune.search.precheck import batch_note, check_seconds, check_window, cold_need
from autotune.search.records import TrialRecord
from autotune.search.space import SearchSpace

CONFIRMED = "confirmed:"   # study user attribute per confirmed configuration
CEILING_TOLERANCE = 0.03
SEARCH_SECONDS = 10.0  # a trial's window by default (longer where the step needs it)
Progress = Callable[[str], None]


class _NoTrial:
    number = None  # a claim not tied to a trial (the baseline)


def _stored(d: dict[str, Any]) -> Any:
    """JSON-safe copy for a study attribute (the storage serialises it)."""
    return json.loads(json.dumps(d))


def _stop_for_the_step(d: dict[str, Any]) -> None:
    """Raise where the user's --step cannot be imported: every configuration would fail
    the same way. A usage error (exit 2), as for a factory that cannot be loaded. (A step
    that raises while it runs fails its trial only: it may fail in one configuration and
    not another.)"""
    if d.get("failure_kind") == "step_import":
        raise UsageError(f"{d.get('reason')}; {d.get('hint')}.", setting="step")


class Session:
    """The state of one search: what it measures with, and what it measured.

    `ceilings` and `space` are set by `prepare()`; `bench()` measures one configuration
    in a fresh process and turns the result into a TrialRecord.
    """

    def __init__(self, study: Any, root: Path, opts: Any, base: BenchConfig,
                 overrides: dict[str, Any], out: Path, say: Progress, t0: float,
                 shared: Any = None) -> None:
        from autotune.search.shared import Claims, SharedStudy

        self.study, self.root, self.opts, self.base = study, root, opts, base
        self.overrides, self.out, self.say = overrides, out, say
        self.deadline = t0 + opts.timeout_s if opts.timeout_s else None
        self.ceilings: Ceilings | None = None
        self.space: SearchSpace | None = None
        self.fmt = "folder"
        self.max_mem = 0.0
        self.max_mem_source = "--max-memory"
        # What the job's container allows, read once for the whole search (every budget).
        from autotune.environment import read_environment

        self.env = read_environment(root, scratch=getattr(opts, "scratch", None))
        self.cuda = False
        # Which configurations' batches fit in /dev/shm (autotune.search.shmgate); set by
        # fit_shm() after prepare(), None before (nothing refused).
        self.shm_gate: Any = None
        self.files_gate = FilesGate()  # and the trials' open-files limit (filesgate)
        self.send_gate = SendGate()    # and whether a worker could send a batch (sendgate)
        # Other hosts' trials, claims, heartbeats; this host (its class keys the ceilings,
        # the baseline and what counts as measured: figures compare within one class).
        self.shared: SharedStudy = shared or SharedStudy(
            None, "sqlite://", Claims(), root, int(getattr(opts, "heartbeat_grace", 60)))
        # Measurement processes forked from one interpreter that has torch imported
        # (autotune.bench.warm), unless the caller starts them its own way.
        from autotune.bench.warm import WarmStarter

        self.warm = WarmStarter() if opts.popen is None else None

    def close(self) -> None:
        """End what the search started for its measurements (the warm interpreter)."""
        if self.warm is not None:
            self.warm.close()

    def _attr(self, what: str) -> str:
        """A study attribute of this class of hosts ("ceilings:1a2b3c4d")."""
        return f"{what}:{self.shared.host_key}"

    # -- setting up --------------------------------------------------------------------

    def check_fingerprint(self, fp: dict[str, Any], name: str, url: str) -> None:
        attrs = self.study.user_attrs   # one read of the storage
        old = attrs.get("fingerprint")
        measured = bool(self.study.get_trials(deepcopy=False)) or any(
            k.startswith(("baseline:", CONFIRMED)) and v for k, v in attrs.items())
        if old is not None and old != fp and not measured:
            # Nothing measured (a search refused up front, or stopped in its probe): the
            # new settings take the study over, and its ceilings are measured again.
            for k in attrs:
                if k.startswith(("ceilings:", "probe:")):
                    self.study.set_user_attr(k, None)
        elif old is not None and old != fp:
            diff = ", ".join(f"{k}: {old.get(k)!r} -> {v!r}" for k, v in fp.items()
                             if old.get(k) != v)
            raise UsageError(f"study {name!r} in {url} was measured with other settings "
                             f"({diff}); figures would not compare. Pass a new --study name or "
                             "the same settings.")
        self.study.set_user_attr("fingerprint", fp)

    def prepare(self, measure_ceilings: Callable[[], Ceilings], cuda: bool) -> None:
        """Ceilings (from the study when resuming), the space, the memory bound."""
        from autotune.search.space import load_space

        from autotune_converters import registry

        self.fmt = ("factory" if self.base.dataset_factory
                    else registry.resolve(self.root, self.opts.format))
        attrs = self.study.user_attrs
        if attrs.get(self._attr("ceilings")):
            self.ceilings = Ceilings.from_dict(attrs[self._attr("ceilings")])
            # The probe too: a resumed search gives the same evidence and format advice.
            self.ceilings.probe = attrs.get(self._attr("probe"))
            self.say("resuming: ceilings and probe from the study (measured on a host like "
                     "this one)")
        else:
            throttle = self.opts.throttle
            with throttle.joined() if throttle is not None else contextlib.nullcontext():
                self.ceilings = measure_ceilings()
            self.study.set_user_attr(self._attr("ceilings"), _stored(self.ceilings.to_dict()))
            if self.ceilings.probe is not None:
                self.study.set_user_attr(self._attr("probe"), _stored(self.ceilings.probe))
                (self.out / "probe.json").write_text(json.dumps(self.ceilings.probe, indent=1))
        # The workers are per rank: each rank's share of the node's cores (more only where
        # the storage probe shows latency to hide).
        self.cuda = cuda
        self.space = load_space(self.opts.space, cores=self.cores_per_rank, cuda=cuda,
                                best_concurrency=self.ceilings.storage_best_concurrency)
        if self.base.procs_per_node > 1:
            self.space.notes.append(
                f"{self.base.procs_per_node} ranks on {self.ceilings.cores} usable cores: "
                f"num_workers is per rank (bound from {self.cores_per_rank} core(s) each); "
                "images/s is the node's (ranks x the slowest rank), memory is summed")
        check_window(self)
        check_seconds(self)
        batch_note(self)
        self._decide_max_memory()

    def _decide_max_memory(self) -> None:
        self.max_mem = self.opts.max_memory_mib
        if self.max_mem is None:
            # Half the job's memory: its cgroup's limit where one is set (a pod's 16 GiB,
            # not the node's 1 TiB), else the host's; under memory.oom.group=1 (the whole
            # job killed at the limit, nothing to recover) half again, as the loader's.
            from autotune.shmfit import oom_group_divisor

            div = oom_group_divisor(self.env)
            self.max_mem = self.env.memory_total() / 2**20 / 2 / div
            self.max_mem_source = (f"half of {self.env.memory_total_source()}"
                                   + (f", divided by {div}: memory.oom.group=1 kills the "
                                      "whole job at the limit" if div > 1 else ""))
        elif over := self.env.over_limit(int(self.max_mem * 2**20),
                                         f"--max-memory {self.max_mem:,.0f} MiB"):
            # As autotune.DataLoader's memory_budget=: a bound the container cannot give.
            self.say(f"warning: {over}")
            self.space.notes.append(over)  # type: ignore[union-attr]

    @property
    def cores_per_rank(self) -> int:
        return max(1, self.ceilings.cores // self.base.procs_per_node)  # type: ignore[union-attr]

    def needs(self, params: dict[str, Any]) -> tuple[int, int]:
        """(batches a measurement of `params` needs in one cold pass: its warm-up and the
        fewest a figure is made of; batches of its size each rank's pass holds)."""
        need, bs = cold_need(self.base, params)
        n = self.ceilings.samples  # type: ignore[union-attr]
        return need, (n or 0) // self.base.procs_per_node // bs

    def fit_shm(self) -> None:
        """Measure the first batch (no workers) and gate the space on /dev/shm: what
        does not fit is never run, num_workers=0 joins when nothing else fits."""
        from autotune.search.shmgate import measure_gate

        self.shm_gate = measure_gate(self.root, self.base, self.base.procs_per_node, self.say,
                                     self.env)
        # What /dev/shm cuts counts only what a cold pass could measure: a larger /dev/shm
        # would not run the rest, and the verdict must not say it would.
        self.shm_gate.apply(self.space, runnable=lambda p: self.cold_unfit(p) is None)
        self.files_gate = files_gate(self.shm_gate, getattr(self.opts, "max_open_files", None))
        self.files_gate.apply(self.space, lambda p: self.cold_unfit(p) is None, self.shm_gate.why)
        self.send_gate = SendGate(self.shm_gate.unsendable)
        self.send_gate.apply(self.space, lambda p: self.cold_unfit(p) is None)

    def gate(self, params: dict[str, Any]) -> Any:
        """The first gate that refuses `params` (a batch no worker sends, /dev/shm, open
        files), or None."""
        return next((g for g in (self.send_gate, self.shm_gate, self.files_gate)
                     if g is not None and g.why(params)), None)

    def unfit_hint(self, params: dict[str, Any]) -> str:
        gate = self.gate(params) if self.cold_unfit(params) is None else None
        return gate.hint if gate is not None else "a smaller batch size, --warm, or a larger dataset"

    def unfit(self, params: dict[str, Any]) -> str | None:
        """Why this configuration is not run: one cold pass cannot hold its measurement (the
        reason a larger /dev/shm would not remove), its batches do not fit in /dev/shm, or
        its pool would run past the open-files limit; None when it can run."""
        return self.cold_unfit(params) or ((g := self.gate(params)) and g.why(params))

    def cold_unfit(self, params: dict[str, Any]) -> str | None:
        """Why one cold pass cannot hold a measurement of `params`; None when it can."""
        if not self.opts.cold or self.ceilings is None or self.ceilings.samples is None:
            return None
        need, have = self.needs(params)
        if have >= need:
            return None
        return (f"not measured: its warm-up and the batches a figure needs ({need}) are more "
                f"than the {have} batches of "
                f"{params.get('batch_size', self.base.batch_size)} in one cold pass")

    def config(self, params: dict[str, Any], seconds: float | None = None) -> BenchConfig:
        """The measurement of `params` (not validated): the search's settings, the emulated
        step scaled to the batch, and the window: `seconds`, --seconds, or the longer of
        SEARCH_SECONDS and what this configuration's step and queue need."""
        settings = {**self.overrides, **params}
        if seconds is not None:
            settings["seconds"] = seconds
        bs = params.get("batch_size")
        if bs and self.base.step is None and self.base.compute_ms:
            # The emulated step's cost scales with the batch (compute_ms is per batch at
            # the preset's or --batch-size): a larger batch is not free.
            settings["compute_ms"] = self.base.compute_ms * bs / self.base.batch_size
        return BenchConfig.from_preset(self.opts.preset, default_seconds=SEARCH_SECONDS,
                                       **settings)

    # -- measuring -----------------------------------------------------------------------

    def bench(self, params: dict[str, Any], label: str, trial: Any = None,
              seconds: float | None = None) -> TrialRecord:
        """One measurement of `params` (a pruned one when `trial` says so)."""
        opts = self.opts
        cfg = self.config(params, seconds).validate()
        on_tick = _pruner(self, trial, cfg.seconds) if trial is not None and not opts.grid else None
        popen = opts.popen or (self.warm.popen if self.warm is not None else None)
        r = run_bench(self.root, cfg, popen=popen, throttle=opts.throttle,
                      monitor_path=opts.monitor_path,
                      timeline=self.out / "timelines" / f"{label}.jsonl",
                      progress=lambda m: self.say(f"{label}: {m}"), on_tick=on_tick)
        d = r.to_dict()
        _stop_for_the_step(d)
        rec = TrialRecord.from_bench(-1, params, d)
        rec.host = dict(self.shared.host)
        if rec.ok and rec.memory_mib > self.max_mem:
            rec.state = "rejected"
            rec.reason = (f"peak memory {rec.memory_mib:,.0f} MiB ({rec.memory_kind} of the "
                          "loader tree + "
                          f"/dev/shm) is over --max-memory {self.max_mem:,.0f} MiB")
            rec.hint = "fewer workers or a lower prefetch_factor"
        return rec

    def revise(self, rec: TrialRecord) -> None:
        assert self.ceilings is not None
        note = self.ceilings.revise(rec.number, rec.images_per_s)
        if note:
            self.say(note)

    def baseline(self) -> TrialRecord | None:
        """The rule of thumb, measured once per study so the gain is honest."""
        if not self.opts.baseline:
            return None
        assert self.ceilings is not None
        if (stored := self.study.user_attrs.get(self._attr("baseline"))) is not None:
            b = TrialRecord.from_dict(stored)
        elif not self._claim_baseline():
            return None  # another host of this class measures it: read at the end
        else:
            bp = rec_mod.baseline_params(self.cores_per_rank, self.cuda)
            if (gate := self.gate(bp)) is not None:
                # Not run, and not stored: a later search with more room runs it.
                why = gate.why(bp)
                self.say(f"baseline (rule of thumb) {bp}: {why}")
                gate.baseline_skipped = {"params": bp, "reason": why}
                return TrialRecord(-1, bp, "skipped", reason=why, hint=gate.hint,
                                   host=dict(self.shared.host))
            self.say(f"baseline (rule of thumb): {bp}")
            b = self.bench(bp, "baseline")
            b.number = -1
            self.study.set_user_attr(self._attr("baseline"), _stored(b.to_dict()))
        if b.ok:
            self.revise(b)
        return b

    def _claim_baseline(self) -> bool:
        """On a shared study one host of a class measures the baseline; False when another
        (alive) does. A holder on this host whose process died is replaced."""
        from autotune.search.shared import _alive_here

        name = self._attr("baseline-claim")
        for _ in range(2):
            held = self.shared.claims.claim(name, self.shared.holder(_NoTrial))
            if held is None:
                return True
            if _alive_here(held):
                self.say(f"baseline: measured by {held.get('hostname')} (pid {held.get('pid')})")
                return False
            self.shared.claims.release(name)
        return False

    def stored_baseline(self) -> TrialRecord | None:
        """The baseline another host of this class stored (a shared study), if any."""
        # study.user_attrs asks the storage each time: another host's write is seen here.
        d = self.study.user_attrs.get(self._attr("baseline")) if self.opts.baseline else None
        return TrialRecord.from_dict(d) if d else None

    def reclaim_orphans(self, exclusive: bool) -> None:
        """Trials a search that died left running: marked interrupted, their configuration
        released (autotune.search.sharedtrials.reclaim_orphans)."""
        sharedtrials.reclaim_orphans(self, exclusive)

    def measured(self) -> dict[tuple, TrialRecord]:
        """Configuration -> its record, for every configuration the study measured on a
        host of this class."""
        return sharedtrials.measured(self)

    def running_elsewhere(self) -> int:
        """Trials other search processes are measuring now (they count in the budget)."""
        return sharedtrials.running_elsewhere(self)

    def timed_out(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline


def _pruner(s: Session, trial: Any, window_s: float) -> Callable[[float, float], str | None]:
    """A measurement's tick: reports the running rate to the trial; why to stop it when
    Optuna's pruner says so."""
    ticks = 0

    def on_tick(secs: float, ips: float) -> str | None:
        nonlocal ticks
        ticks += 1
        trial.report(ips, ticks)
        if not trial.should_prune():
            return None
        return (f"pruned after {secs:.0f} s of the {window_s:g} s window: "
                f"{ips:,.0f} images/s so far, under {s.opts.prune_below:.0%} of the "
                f"best trial's {s.study.best_value:,.0f}")

    return on_tick
