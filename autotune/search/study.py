"""`autotune search`: an Optuna study over DataLoader settings under measured ceilings.

Each trial is one `bench` measurement (fresh process, cold cache). The study runs through
Optuna's ask-and-tell interface so that the search, not Optuna, decides what a trial
costs: a configuration already measured is answered from the study without measuring it
again, a failed or over-memory configuration is recorded with its reason, and Ctrl-C
ends the study with everything measured so far kept in its storage (SQLite by default;
any Optuna storage URL, so several machines can share one study).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.bench.config import BenchConfig
from autotune.bench.runner import run_bench
from autotune.errors import AutotuneError, UsageError
from autotune.search import guard
from autotune.search import recommend as rec_mod
from autotune.search.ceilings import Ceilings
from autotune.search.records import TrialRecord
from autotune.search.space import SearchSpace, config_key, load_space
from autotune.search.verdict import Verdict, decide

CEILING_TOLERANCE = 0.03
SCHEMA = "autotune.search/1"
Progress = Callable[[str], None]


@dataclass
class SearchOptions:
    """What to search and how. Defaults are the CLI's."""

    preset: str = "resnet50"
    space: str | None = None
    trials: int = 20
    timeout_s: float | None = None
    compute_ms: float | None = None
    step: str | None = None
    batch_size: int | None = None
    seconds: float = 10.0
    warmup_batches: int | None = None
    study: str | None = None
    storage: str | None = None
    grid: bool = False
    out: str | os.PathLike[str] = "autotune-out"
    max_memory_mib: float | None = None
    seed: int = 0
    cold: bool = True
    probe: bool = True
    probe_fio: bool = True
    format: str = "auto"
    baseline: bool = True
    early_stop: bool = True
    # Stop a trial whose running images/s falls under this share of the best so far
    # (None: never; the grid always measures every configuration whole).
    prune_below: float | None = 0.7
    # Before one configuration is named, measure the `confirm` fastest (and the knee) again
    # in a longer window (confirm_seconds, or recommend.confirm_window): the best of many
    # short noisy windows is flattered by its noise. 0: name the winner from the trials.
    confirm: int = 2
    confirm_seconds: float | None = None
    # How trials start (e.g. IoThrottle(...).popen) and which path's disk to watch.
    popen: Any = None
    monitor_path: str | None = None
    # An active IoThrottle: the storage probe runs under it, and each trial joins it once
    # torch is imported (libraries stay on local disk, as a job's do; see run_bench).
    throttle: Any = None

    def validate(self) -> SearchOptions:
        if self.trials < 1:
            raise UsageError(f"trials must be at least 1, but got {self.trials}.")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise UsageError(f"timeout must be positive, but got {self.timeout_s:g}.")
        if self.seconds <= 0:
            raise UsageError(f"seconds must be positive, but got {self.seconds:g}.")
        if self.compute_ms is not None and self.step is not None:
            raise UsageError("give either --compute-ms (an emulated step) or --step (a real "
                             "one), not both.")
        if self.prune_below is not None and not 0 < self.prune_below <= 1:
            raise UsageError(f"prune_below must be in (0, 1], but got {self.prune_below:g}; "
                             "0.7 stops trials running 30 % or more below the best so far.")
        if self.confirm < 0:
            raise UsageError(f"confirm must be at least 0, but got {self.confirm}.")
        if self.confirm_seconds is not None and self.confirm_seconds <= 0:
            raise UsageError(f"confirm_seconds must be positive, but got {self.confirm_seconds:g}.")
        if self.max_memory_mib is not None and self.max_memory_mib <= 0:
            raise UsageError(f"max_memory must be positive, but got {self.max_memory_mib:g} MiB.")
        return self


@dataclass
class SearchResult:
    dataset: str
    study: str
    storage: str
    options: dict[str, Any]
    space: dict[str, Any]
    ceilings: Ceilings
    trials: list[TrialRecord]
    baseline: TrialRecord | None
    best: TrialRecord | None
    recommended: TrialRecord | None
    verdict: Verdict | None
    stop_reason: str
    seconds: float
    batch_size: int
    out_dir: str
    report_html: str | None = None
    json_file: str | None = None
    warnings: list[str] = field(default_factory=list)
    confirmations: list[TrialRecord] = field(default_factory=list)
    # The baseline's configuration measured in the longer window (when it was confirmed).
    baseline_confirmed: TrialRecord | None = None

    @property
    def gain_vs_baseline(self) -> float | None:
        if not (self.recommended and self.baseline and self.baseline.ok):
            return None
        base = like_for_like_baseline(self.recommended, self.baseline, self.baseline_confirmed)
        return self.recommended.images_per_s / base.images_per_s  # type: ignore[operator]

    def _brief(self, t: TrialRecord | None) -> dict[str, Any] | None:
        if t is None:
            return None
        return {"config": t.params, "images_per_s": t.images_per_s, "au": t.au,
                "data_wait_fraction": t.data_wait_fraction, "peak_rss_mib": t.peak_rss_mib,
                "trial": t.number, "state": t.state, "reason": t.reason,
                "timeline_file": t.timeline_file, "window_s": t.window_s,
                "first_images_per_s": t.first_images_per_s}

    def to_dict(self) -> dict[str, Any]:
        rec = self.recommended
        return {
            "schema": SCHEMA, "dataset": self.dataset, "study": self.study,
            "storage": self.storage, "options": self.options, "space": self.space,
            "ceilings": self.ceilings.to_dict(),
            "recommended": self._brief(rec), "best": self._brief(self.best),
            "baseline": self._brief(self.baseline),
            "baseline_confirmed": self._brief(self.baseline_confirmed),
            "gain_vs_baseline": self.gain_vs_baseline,
            "verdict": self.verdict.to_dict() if self.verdict else None,
            "snippet": rec_mod.dataloader_snippet(rec.params, self.batch_size) if rec else None,
            "yaml": rec_mod.yaml_block(rec.params, self.batch_size) if rec else None,
            "trials": [t.to_dict() for t in self.trials],
            "confirmed": [t.to_dict() for t in self.confirmations],
            "stop_reason": self.stop_reason, "seconds": self.seconds,
            "report_html": self.report_html, "warnings": self.warnings,
        }


def like_for_like_baseline(rec: TrialRecord, baseline: TrialRecord,
                           confirmed: TrialRecord | None) -> TrialRecord:
    """The baseline figure to set `rec` against: its confirmation when `rec` comes from a
    confirmation window too (a short window against a long one would not compare)."""
    if rec.window_s is not None and confirmed is not None and confirmed.ok:
        return confirmed
    return baseline


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


def default_study_name(dataset: Path, preset: str) -> str:
    h = hashlib.sha1(str(dataset).encode()).hexdigest()[:8]
    return f"{dataset.name or 'dataset'}-{preset}-{h}"


def _storage(url: str) -> Any:
    import optuna

    if url.startswith("sqlite:///"):
        # SQLite serialises writers; a generous busy timeout lets a second search process
        # on the same file wait its turn instead of failing with "database is locked".
        return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})
    return url


def _measure_ceilings(root: Path, opts: SearchOptions, base: BenchConfig,
                      say: Progress) -> Ceilings:
    from autotune.data.transforms import build_transform
    from autotune.search import ceilings as ceil_mod
    from converters.registry import open_source

    probe_res = None
    if opts.probe:
        from autotune.probe import probe

        say("probing storage (fio + cold replay of the dataset's files)")
        probe_res = probe(root, size=256 * 2**20, runtime=3.0, replay_files=1000,
                          replay_seconds=5.0, run_fio=opts.probe_fio, cold=opts.cold,
                          progress=say)
    say("measuring the decode rate from memory")
    source = open_source(root, base.format)
    blobs = ceil_mod.sample_blobs(source, 200, seed=opts.seed)
    demand_ms = base.compute_ms if base.step is None else 0.0
    return ceil_mod.measure(transform=build_transform(base.transform), blobs=blobs,
                            batch_size=base.batch_size, compute_ms=demand_ms, probe=probe_res)


def _ceilings_from(d: dict[str, Any]) -> Ceilings:
    return Ceilings(storage=d.get("storage"), decode=d.get("decode"), demand=d.get("demand"),
                    cores=d.get("cores", 1), decode_per_core=d.get("decode_per_core"),
                    storage_best_concurrency=d.get("storage_best_concurrency"),
                    evidence=d.get("evidence", []), probe=None)


def _fingerprint(root: Path, opts: SearchOptions, base: BenchConfig) -> dict[str, Any]:
    """What must match for a study to be resumed rather than mixed with other figures."""
    return {"dataset": str(root), "preset": opts.preset, "batch_size": base.batch_size,
            "compute_ms": base.compute_ms, "step": base.step, "seconds": opts.seconds,
            "cold": opts.cold, "format": opts.format}


def run_search(dataset: str | os.PathLike[str], opts: SearchOptions | None = None, *,
               progress: Progress | None = None) -> SearchResult:
    """Search DataLoader settings for `dataset`; see SearchOptions and the module doc.

    KeyboardInterrupt ends the study: the trial in flight is recorded as failed
    ("interrupted") and the result holds everything measured (stop_reason says so).
    """
    import optuna

    opts = (opts or SearchOptions()).validate()
    say = progress or (lambda _m: None)
    t0 = time.monotonic()
    root = Path(dataset).absolute()
    if not root.exists():
        raise UsageError(f"{root}: no such file or directory.")
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "timelines").mkdir(exist_ok=True)
    overrides = {"compute_ms": opts.compute_ms, "step": opts.step, "batch_size": opts.batch_size,
                 "seconds": opts.seconds, "warmup_batches": opts.warmup_batches,
                 "cold": opts.cold, "format": opts.format, "seed": opts.seed}
    base = BenchConfig.from_preset(opts.preset, **overrides).validate()
    name = opts.study or default_study_name(root, opts.preset)
    url = opts.storage or f"sqlite:///{(out / 'study.db').absolute()}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = (optuna.samplers.RandomSampler(seed=opts.seed) if opts.grid else
               optuna.samplers.TPESampler(seed=opts.seed, n_startup_trials=4))
    pruner: Any = optuna.pruners.NopPruner()
    if opts.prune_below is not None and not opts.grid:
        from autotune.search.pruning import BestFractionPruner

        # Judge after 40 % of the window: the first seconds carry the queue filled at warm-up.
        pruner = BestFractionPruner(opts.prune_below, min_steps=max(2, math.ceil(0.4 * opts.seconds)))
    db = guard.sqlite_path(url)
    with contextlib.ExitStack() as held:
        if db is not None:
            held.enter_context(guard.StudyFileLock(db))
        try:
            study = optuna.create_study(study_name=name, storage=_storage(url),
                                        direction="maximize", sampler=sampler, pruner=pruner,
                                        load_if_exists=True)
        except Exception as e:  # noqa: BLE001 - sqlalchemy / driver errors: say which storage
            raise AutotuneError(f"cannot open Optuna storage {url} ({type(e).__name__}: {e}); "
                                "check the URL, or use a server database (PostgreSQL, MySQL) "
                                "when several machines share one study.") from e
        return _run_study(study, root, name, url, opts, base, overrides, out, say, t0,
                          exclusive=db is not None)


def _run_study(study: Any, root: Path, name: str, url: str, opts: SearchOptions,
               base: BenchConfig, overrides: dict[str, Any], out: Path, say: Progress,
               t0: float, *, exclusive: bool) -> SearchResult:
    import optuna
    from optuna.trial import TrialState

    fp = _fingerprint(root, opts, base)
    old = study.user_attrs.get("fingerprint")
    if old is not None and old != fp:
        diff = ", ".join(f"{k}: {old.get(k)!r} -> {v!r}" for k, v in fp.items() if old.get(k) != v)
        raise UsageError(f"study {name!r} in {url} was measured with other settings ({diff}); "
                         "figures would not compare. Pass a new --study name or the same settings.")
    study.set_user_attr("fingerprint", fp)
    warnings: list[str] = []

    if "ceilings" in study.user_attrs:
        ceilings = _ceilings_from(study.user_attrs["ceilings"])
        say("resuming: ceilings from the study")
    else:
        with opts.throttle.joined() if opts.throttle is not None else contextlib.nullcontext():
            ceilings = _measure_ceilings(root, opts, base, say)
        study.set_user_attr("ceilings", json.loads(json.dumps(ceilings.to_dict())))
        if ceilings.probe is not None:
            (out / "probe.json").write_text(json.dumps(ceilings.probe, indent=1))
    cuda = _cuda()
    space = load_space(opts.space, cores=ceilings.cores, cuda=cuda,
                       best_concurrency=ceilings.storage_best_concurrency)
    max_mem = opts.max_memory_mib
    if max_mem is None:
        import psutil

        max_mem = psutil.virtual_memory().total / 2**20 / 2

    def bench(params: dict[str, Any], label: str, trial: Any = None,
              seconds: float | None = None) -> TrialRecord:
        o = {**overrides, "seconds": seconds} if seconds is not None else overrides
        cfg = BenchConfig.from_preset(opts.preset, **o, **params).validate()
        tl = out / "timelines" / f"{label}.jsonl"
        ticks = 0

        def on_tick(secs: float, ips: float) -> str | None:
            nonlocal ticks
            ticks += 1
            trial.report(ips, ticks)
            if not trial.should_prune():
                return None
            best = study.best_value
            return (f"pruned after {secs:.0f} s of the {opts.seconds:g} s window: "
                    f"{ips:,.0f} images/s so far, under {opts.prune_below:.0%} of the best "
                    f"trial's {best:,.0f}")

        r = run_bench(root, cfg, popen=opts.popen, throttle=opts.throttle,
                      monitor_path=opts.monitor_path,
                      timeline=tl, progress=lambda m: say(f"{label}: {m}"),
                      on_tick=on_tick if trial is not None and not opts.grid else None)
        rec = TrialRecord.from_bench(-1, params, r.to_dict())
        if rec.ok and rec.memory_mib > max_mem:
            rec.state = "rejected"
            rec.reason = (f"peak memory {rec.memory_mib:,.0f} MiB (RSS of the loader tree + "
                          f"/dev/shm) is over --max-memory {max_mem:,.0f} MiB")
            rec.hint = "fewer workers or a lower prefetch_factor"
        return rec

    stop_reason = "trials"
    deadline = t0 + opts.timeout_s if opts.timeout_s else None
    baseline: TrialRecord | None = None
    try:
        # The rule of thumb is always measured, once per study, so the gain is honest.
        if opts.baseline:
            if "baseline" in study.user_attrs:
                baseline = TrialRecord.from_dict(study.user_attrs["baseline"])
            else:
                bp = rec_mod.baseline_params(ceilings.cores)
                say(f"baseline (rule of thumb): {bp}")
                baseline = bench(bp, "baseline")
                baseline.number = -1
                study.set_user_attr("baseline", json.loads(json.dumps(baseline.to_dict())))
            if baseline.ok:
                _revise(ceilings, baseline, say)

        for t in guard.orphaned_trials(study, exclusive=exclusive):
            owner = t.user_attrs.get("owner")
            rec = TrialRecord(t.number, dict(t.params), "interrupted",
                              reason=guard.interrupted_reason(owner))
            optuna.trial.Trial(study, t._trial_id).set_user_attr("record", rec.to_dict())
            study.tell(t.number, state=TrialState.FAIL)
            say(f"trial {t.number}: {rec.reason}")

        measured: dict[tuple, TrialRecord] = {}
        for t in study.trials:
            rec_d = t.user_attrs.get("record")
            if rec_d and rec_d.get("state") in ("complete", "failed", "rejected", "pruned"):
                measured.setdefault(config_key(rec_d["params"]), TrialRecord.from_dict(rec_d))
        if opts.grid:
            todo = [p for p in space.grid() if config_key(p) not in measured]
            for p in todo:
                study.enqueue_trial({k: v for k, v in p.items() if v is not None
                                     and not (k == "persistent_workers" and p["num_workers"] == 0)})
            budget = len(todo)
        else:
            budget = max(0, opts.trials - len(measured))
            if budget == 0:
                stop_reason = "trials (already measured)"
        runs = dupes = 0
        n_total = budget
        while runs < budget:
            if deadline is not None and time.monotonic() >= deadline:
                stop_reason = "timeout"
                break
            trial = study.ask()
            trial.set_user_attr("owner", guard.owner_tag())
            params = space.suggest(trial)
            key = config_key(params)
            prev = measured.get(key)
            if prev is not None:
                dupes += 1
                rec = TrialRecord.from_dict(prev.to_dict())
                rec.number, rec.state, rec.duplicate_of = trial.number, "duplicate", prev.number
                trial.set_user_attr("record", rec.to_dict())
                if prev.ok:
                    study.tell(trial, prev.images_per_s)
                else:
                    study.tell(trial, state=TrialState.PRUNED if prev.state == "pruned"
                               else TrialState.FAIL)
                if dupes > 40:  # TPE keeps proposing measured points: the space is exhausted
                    stop_reason = "space exhausted"
                    break
                continue
            runs += 1
            best_so_far = max((r.images_per_s for r in measured.values() if r.ok), default=None)
            left = f", {max(0, deadline - time.monotonic()):.0f} s left" if deadline else ""
            say(f"trial {runs} of {n_total}: {params}"
                + (f" (best so far {best_so_far:,.0f} images/s{left})" if best_so_far else left))
            try:
                rec = bench(params, f"trial-{trial.number:03d}", trial)
            except KeyboardInterrupt:
                rec = TrialRecord(trial.number, params, "interrupted",
                                  reason="interrupted (Ctrl-C); measured again on resume")
                trial.set_user_attr("record", rec.to_dict())
                study.tell(trial, state=TrialState.FAIL)
                raise
            rec.number = trial.number
            trial.set_user_attr("record", json.loads(json.dumps(rec.to_dict())))
            measured[key] = rec
            if rec.ok:
                study.tell(trial, rec.images_per_s)
            elif rec.state == "pruned":
                say(f"trial {runs}: {rec.reason}")
                study.tell(trial, state=TrialState.PRUNED)
            else:
                study.tell(trial, state=TrialState.FAIL)
            if rec.ok:
                _revise(ceilings, rec, say)
            if opts.early_stop and not opts.grid and rec.ok:
                lim = ceilings.smallest(firm=True)
                if lim and rec.images_per_s >= (1 - CEILING_TOLERANCE) * lim[1]:
                    stop_reason = (f"ceiling reached: {rec.images_per_s:,.0f} images/s is within "
                                   f"{CEILING_TOLERANCE:.0%} of the {lim[0]} ceiling {lim[1]:,.0f}")
                    break
        else:
            if opts.grid:
                stop_reason = "grid complete"
        if opts.confirm and stop_reason != "timeout":
            pool = list(measured.values()) + ([baseline] if baseline is not None else [])
            if not _confirm(study, pool, baseline, opts, base, bench, say, deadline):
                stop_reason = "timeout (while confirming)"
    except KeyboardInterrupt:
        stop_reason = "interrupted (Ctrl-C): results so far"

    res = _conclude(study, root, name, url, opts, space, ceilings, baseline, stop_reason,
                    time.monotonic() - t0, base.batch_size, out, warnings)
    write_outputs(res)
    return res


CONFIRMED = "confirmed:"   # study user attribute per confirmed configuration


def _confirmed(study: Any) -> dict[str, TrialRecord]:
    # One attribute per configuration: searches sharing a study (a server database) add
    # theirs without overwriting each other's.
    return {k[len(CONFIRMED):]: TrialRecord.from_dict(d) for k, d in study.user_attrs.items()
            if k.startswith(CONFIRMED)}


def _ckey(params: dict[str, Any]) -> str:
    return json.dumps(config_key(params))


def _window(params: dict[str, Any], opts: SearchOptions, base: BenchConfig) -> float:
    step_s = base.compute_ms / 1000 if base.compute_ms else None
    return opts.confirm_seconds or rec_mod.confirm_window(params, opts.seconds, step_s)


def _confirm(study: Any, pool: list[TrialRecord], baseline: TrialRecord | None,
             opts: SearchOptions, base: BenchConfig, bench: Callable[..., TrialRecord],
             say: Progress, deadline: float | None) -> bool:
    """Measure the candidates again, each in a longer window; kept in the study, so a
    resumed search does not measure a confirmed configuration twice (unless the window
    changed). False when the deadline came first."""
    cands = rec_mod.confirm_candidates(pool, opts.confirm, baseline)
    if len(cands) < 2:
        return True  # nothing to choose between
    done = _confirmed(study)
    windows = [(t, _window(t.params, opts, base)) for t in cands]
    todo = [(t, win) for t, win in windows
            if (prev := done.get(_ckey(t.params))) is None or prev.window_s != win]
    for i, (t, win) in enumerate(todo, 1):
        if deadline is not None and time.monotonic() >= deadline:
            return False
        label = "baseline" if t.number == -1 else f"trial {t.number}"
        say(f"confirming {i} of {len(todo)}: {label} {t.params} ({t.images_per_s:,.0f} images/s "
            f"in {opts.seconds:g} s) again in a {win:g} s window")
        r = bench(t.params, f"confirm-{'baseline' if t.number == -1 else f'{t.number:03d}'}",
                  seconds=win)
        r.number, r.first_images_per_s, r.window_s = t.number, t.images_per_s, win
        study.set_user_attr(CONFIRMED + _ckey(t.params), json.loads(json.dumps(r.to_dict())))
        say(f"  {label}: {r.images_per_s:,.0f} images/s" if r.ok else f"  {label}: {r.reason}")
    return True


def _revise(ceilings: Ceilings, rec: TrialRecord, say: Progress) -> None:
    note = ceilings.revise(rec.number, rec.images_per_s)
    if note:
        say(note)


def write_outputs(res: SearchResult) -> None:
    """out/search.json and out/report.html, each written whole or not at all."""
    from autotune.report import html as report_html
    from autotune.report import write_json
    from converters.fsutil import write_text_atomic

    out = Path(res.out_dir)
    res.json_file = str(out / "search.json")
    res.report_html = str(out / "report.html")
    d = res.to_dict()
    write_json(res.json_file, d)
    write_text_atomic(res.report_html, report_html.render([(f"search: {res.dataset}", d)]))


def _conclude(study: Any, root: Path, name: str, url: str, opts: SearchOptions,
              space: SearchSpace, ceilings: Ceilings, baseline: TrialRecord | None,
              stop_reason: str, seconds: float, batch_size: int, out: Path,
              warnings: list[str]) -> SearchResult:
    trials = []
    for t in study.trials:
        d = t.user_attrs.get("record")
        if d:
            trials.append(TrialRecord.from_dict(d))
    measured = [t for t in trials if t.state != "duplicate"]
    for t in measured + ([baseline] if baseline is not None else []):
        if t.ok:  # a resumed study: what an earlier run measured counts too
            ceilings.revise(t.number, t.images_per_s)
    # The baseline was measured like any trial: when nothing the search tried beats it,
    # it is the recommendation, never a slower configuration.
    pool = measured + ([baseline] if baseline is not None and baseline.ok else [])
    # Name the winner from the longer windows when every candidate has one; a search that
    # stopped before confirming (timeout, Ctrl-C) names it from the trials and says so.
    confirmed = _confirmed(study)
    cands = rec_mod.confirm_candidates(pool, opts.confirm, baseline) if opts.confirm else []
    conf_ok = [c for c in confirmed.values() if c.ok]
    for c in confirmed.values():
        if not c.ok:
            warnings.append(f"confirming {c.params} failed ({c.reason}): it is not a "
                            "candidate for the recommendation")
    missing = [c for c in cands if _ckey(c.params) not in confirmed]
    if len(cands) > 1 and conf_ok and not missing:
        for c in conf_ok:
            ceilings.revise(c.number, c.images_per_s)
        pool = conf_ok
    elif len(cands) > 1:
        warnings.append(f"the recommendation is not confirmed: {len(missing) or len(cands)} of "
                        f"the {len(cands)} configurations to confirm "
                        + ("were not measured again in a longer window" if missing else
                           "failed their confirmation")
                        + f" ({stop_reason}); the figures are single {opts.seconds:g} s windows")
    best = rec_mod.best_trial(pool)
    rec = rec_mod.knee(pool)
    verdict = decide(rec, best, ceilings) if rec and best else None
    if best is None:
        warnings.append("no configuration completed: see each trial's reason and hint")
    if baseline is not None and not baseline.ok:
        warnings.append(f"the rule-of-thumb baseline failed: {baseline.reason}")
    options = {k: v for k, v in opts.__dict__.items() if k not in ("popen", "throttle")}
    options["throttled"] = repr(opts.throttle.limits) if opts.throttle is not None else None
    options["out"] = str(options["out"])
    return SearchResult(dataset=str(root), study=name, storage=url, options=options,
                        space=space.to_dict(), ceilings=ceilings, trials=trials,
                        baseline=baseline, best=best, recommended=rec, verdict=verdict,
                        stop_reason=stop_reason, seconds=seconds, batch_size=batch_size,
                        out_dir=str(out), confirmations=list(confirmed.values()),
                        baseline_confirmed=(confirmed.get(_ckey(baseline.params))
                                            if baseline is not None else None),
                        warnings=warnings + list(ceilings.lower_bounds.values()) + space.notes)
