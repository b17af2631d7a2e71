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
import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.bench.config import BenchConfig
from autotune.errors import UsageError
from autotune_base.fsutil import unwritable_reason
from autotune.search import guard, shared
from autotune.search.ceilings import Ceilings
from autotune.search.records import TrialRecord
from autotune.search.result import SearchResult
from autotune.search.session import SEARCH_SECONDS
from autotune_converters.objstore.url import is_s3

Progress = Callable[[str], None]


@dataclass
class SearchOptions:
    """What to search and how. Defaults are the CLI's."""

    preset: str = "resnet50"
    space: str | None = None
    # The user's own dataset ('file.py:function' called with the dataset path) and the
    # ranks on the node (each with its own DataLoader; default LOCAL_WORLD_SIZE, else 1).
    dataset_factory: str | None = None
    procs_per_node: int | None = None
    trials: int = 20
    timeout_s: float | None = None
    compute_ms: float | None = None
    step: str | None = None
    batch_size: int | None = None
    # The measured window per trial; None: SEARCH_SECONDS, or longer where a long emulated
    # step needs it (BenchConfig.window_needed_s, per configuration).
    seconds: float | None = None
    warmup_batches: int | None = None
    study: str | None = None
    storage: str | None = None
    grid: bool = False
    out: str | os.PathLike[str] = "autotune-out"
    max_memory_mib: float | None = None
    # RLIMIT_NOFILE for each trial's measurement (BenchConfig.max_open_files): a cluster's
    # `ulimit -n` reproduced here, while this process keeps its own.
    max_open_files: int | None = None
    # fio's scratch directory when the dataset's mount is read-only (probe's --scratch).
    scratch: str | None = None
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
    # A study shared by several hosts (a server database or journal:PATH): a trial whose
    # host sends no heartbeat for this many seconds is interrupted and measured again.
    heartbeat_grace: int = 60
    # The whole run (autotune.search.runcache): measure the later epochs (a warm trial, or
    # the page cache's hit rate where the dataset does not fit), and with `epochs` project
    # the run's time with and without conversion (`--convert auto` decides from it).
    whole_run: bool = True
    epochs: int | None = None

    def validate(self) -> SearchOptions:
        if self.trials < 1:
            raise UsageError(f"trials must be at least 1, but got {self.trials}.")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise UsageError(f"timeout must be positive, but got {self.timeout_s:g}.")
        if self.seconds is not None and self.seconds <= 0:
            raise UsageError(f"seconds must be positive, but got {self.seconds:g}.")
        if self.compute_ms is not None and self.step is not None:
            raise UsageError("give either compute_ms (an emulated step) or step (a real "
                             "one), not both.", setting=("compute_ms", "step"))
        if self.prune_below is not None and not 0 < self.prune_below <= 1:
            raise UsageError(f"prune_below must be in (0, 1], but got {self.prune_below:g}; "
                             "0.7 stops trials running 30 % or more below the best so far.")
        if self.confirm < 0:
            raise UsageError(f"confirm must be at least 0, but got {self.confirm}.")
        if self.confirm_seconds is not None and self.confirm_seconds <= 0:
            raise UsageError(f"confirm_seconds must be positive, but got {self.confirm_seconds:g}.")
        if self.scratch is not None and not os.path.isdir(self.scratch):
            raise UsageError(f"scratch directory {self.scratch}: not a directory; give a "
                             "writable directory on the dataset's storage.", setting="scratch")
        if self.max_memory_mib is not None and self.max_memory_mib <= 0:
            raise UsageError(f"max_memory must be positive, but got {self.max_memory_mib:g} MiB.")
        if self.epochs is not None and (int(self.epochs) != self.epochs or self.epochs < 1):
            raise UsageError(f"epochs must be a whole number, at least 1, but got {self.epochs}.",
                             setting="epochs")
        if int(self.heartbeat_grace) != self.heartbeat_grace or self.heartbeat_grace < 2:
            raise UsageError(f"heartbeat_grace must be a whole number of seconds, at least 2, but "
                             f"got {self.heartbeat_grace}.", setting="heartbeat_grace")
        return self


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


def procs_per_node(given: int | None) -> int:
    """Ranks on the node: as given, else LOCAL_WORLD_SIZE (torchrun sets it), else 1."""
    if given is not None:
        return given
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def default_study_name(dataset: Path | str, preset: str) -> str:
    h = hashlib.sha1(str(dataset).encode()).hexdigest()[:8]
    name = str(dataset).rstrip("/").rsplit("/", 1)[-1] if is_s3(dataset) else Path(dataset).name
    return f"{name or 'dataset'}-{preset}-{h}"


def _measure_ceilings(root: Path, opts: SearchOptions, base: BenchConfig,
                      say: Progress, env: Any = None) -> Ceilings:
    from autotune.cache import ram_backed
    from autotune.data.transforms import build_transform
    from autotune.search import ceilings as ceil_mod
    from autotune.search.precheck import check_samples
    from autotune.search.space import load_space
    from autotune_converters.registry import open_source

    source = None
    if not base.dataset_factory:
        source = open_source(root, base.format)
        # A space that searches batch_size measures its smallest too: the cheapest.
        sizes = load_space(opts.space, cores=1, cuda=False).choices.get("batch_size")
        check_samples(root, len(source), base, opts.cold, sizes)
    probe_res = None
    if opts.probe:
        from autotune.probe import probe

        if is_s3(root):
            from autotune.probe.objstore import probe_objects

            say("probing object storage (GETs of the dataset's objects)")
            # No ranged reads: the ceiling is GETs of the objects a trial reads whole.
            probe_res = probe_objects(root, max_objects=1000, seconds=5.0, cold=opts.cold,
                                      ranges=False, progress=say)
        else:
            say("probing storage (fio + cold replay of the dataset's files)")
            probe_res = probe(root, size=256 * 2**20, runtime=3.0, replay_files=1000,
                              replay_seconds=5.0, run_fio=opts.probe_fio, cold=opts.cold,
                              progress=say, scratch=opts.scratch, environment=env)
    demand_ms = base.compute_ms if base.step is None else 0.0
    transform = build_transform(base.transform)
    if base.dataset_factory:
        from autotune.bench import factory

        say("measuring the dataset factory's samples per core (files warm)")
        ud = factory.build(base.dataset_factory, str(root))
        n = ud.info(base.dataset_factory, str(root))["images"]
        c = ceil_mod.measure(transform=transform, blobs=[], batch_size=base.batch_size,
                             compute_ms=demand_ms, probe=probe_res, samples=n,
                             user_dataset=ud.dataset,
                             step=base.step)
        c.iterable = ud.iterable
    else:
        say("measuring the decode rate from memory")
        assert source is not None
        blobs = ceil_mod.sample_blobs(source, 200, seed=opts.seed)
        c = ceil_mod.measure(transform=transform, blobs=blobs, batch_size=base.batch_size,
                             compute_ms=demand_ms, probe=probe_res, samples=len(source),
                             step=base.step)
        c.iterable = bool(source.iterable)
    c.ram_backed = None if is_s3(root) else ram_backed(root)
    return c


def _fingerprint(root: Path, opts: SearchOptions, base: BenchConfig) -> dict[str, Any]:
    """What must match for a study to be resumed rather than mixed with other figures."""
    return {"dataset": str(root), "preset": opts.preset, "batch_size": base.batch_size,
            "compute_ms": base.compute_ms, "step": base.step,
            # The window as measured: a study of the old 10 s default resumes as it was.
            "seconds": opts.seconds if opts.seconds is not None else base.seconds,
            "cold": opts.cold, "format": opts.format, "dataset_factory": base.dataset_factory,
            "procs_per_node": base.procs_per_node}


def _check_out(out: Path) -> None:
    """--out must be a folder this user can make or write: refused before the first trial,
    without creating it (nothing is left behind by a search that stops before it starts)."""
    p, why = unwritable_reason(out)
    if why:
        raise UsageError(f"{out}: {p} {why}; name a folder you can write for the study and "
                         "its results", setting="out")


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
    root = _dataset_root(dataset, opts)
    out = Path(opts.out)
    _check_out(out)
    overrides, base = _base_config(opts)
    name = opts.study or default_study_name(root, opts.preset)
    url = opts.storage or f"sqlite:///{(out / 'study.db').absolute()}"
    shared_url = shared.is_shared(url)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler, pruner = _sampler_and_pruner(opts, base, shared_url)
    db = guard.sqlite_path(url)
    with contextlib.ExitStack() as held:
        if db is not None:
            db.parent.mkdir(parents=True, exist_ok=True)
            held.enter_context(guard.StudyFileLock(db))
        # The storage first: an unreachable server stops the search before anything is
        # written locally (no --out, no search.json that would look like a result).
        storage = shared.open_storage(url, int(opts.heartbeat_grace))
        try:
            study = optuna.create_study(study_name=name, storage=storage,
                                        direction="maximize", sampler=sampler, pruner=pruner,
                                        load_if_exists=True)
        except Exception as e:  # noqa: BLE001 - sqlalchemy / driver errors: say which storage
            raise shared.unreachable(url, e) from e
        claims = shared.claims_for(storage, url, study)
        if shared_url:
            host_claim = shared.claim_host(claims, name, url)
            held.callback(claims.release, host_claim)
        out.mkdir(parents=True, exist_ok=True)
        (out / "timelines").mkdir(exist_ok=True)
        # Optuna warns that heartbeats are meant for optimize(); this loop sends its own.
        held.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message=".*[Hh]eartbeat.*")
        return _run_study(study, root, name, url, opts, base, overrides, out, say, t0,
                          exclusive=db is not None,
                          shared_study=shared.SharedStudy(storage, url, claims, root,
                                                          int(opts.heartbeat_grace)))


def _dataset_root(dataset: str | os.PathLike[str], opts: SearchOptions) -> Any:
    """The dataset as the search names it: an s3:// URL as given, a local path absolute
    (and there)."""
    root: Any = str(dataset) if is_s3(dataset) else Path(dataset).absolute()
    if is_s3(root) and opts.dataset_factory:
        raise UsageError(f"{root}: --dataset-factory takes a local path; an s3:// dataset is "
                         "read by autotune's own reader.", setting="dataset_factory")
    if not is_s3(root) and not root.exists():
        raise UsageError(f"{root}: no such file or directory.")
    return root


def _base_config(opts: SearchOptions) -> tuple[dict[str, Any], BenchConfig]:
    """What every trial shares (the options that override the preset) and the preset's
    configuration with them; a missing --dataset-factory is refused here, before a trial."""
    overrides = {"compute_ms": opts.compute_ms, "step": opts.step, "batch_size": opts.batch_size,
                 "seconds": opts.seconds, "warmup_batches": opts.warmup_batches,
                 "cold": opts.cold, "format": opts.format, "seed": opts.seed,
                 "dataset_factory": opts.dataset_factory,
                 "procs_per_node": procs_per_node(opts.procs_per_node),
                 "max_open_files": opts.max_open_files}
    base = BenchConfig.from_preset(opts.preset, default_seconds=SEARCH_SECONDS,
                                   **overrides).validate()
    if base.dataset_factory:
        from autotune.bench import factory

        factory.check(base.dataset_factory)  # a missing file or function: exit 2, now
    return overrides, base


def _sampler_and_pruner(opts: SearchOptions, base: BenchConfig, shared_url: bool) -> tuple[Any, Any]:
    """Optuna's sampler (random for the grid, else seeded TPE) and pruner (none for the
    grid or without --prune-below)."""
    import optuna

    # constant_liar: TPE treats configurations running on other hosts as measured (badly),
    # so hosts sharing a study are not all sent to the same promising point.
    sampler = (optuna.samplers.RandomSampler(seed=opts.seed) if opts.grid else
               optuna.samplers.TPESampler(seed=opts.seed, n_startup_trials=4,
                                          constant_liar=shared_url))
    pruner: Any = optuna.pruners.NopPruner()
    if opts.prune_below is not None and not opts.grid:
        from autotune.search.pruning import BestFractionPruner

        # Judge after 40 % of the window: the first seconds carry the queue filled at warm-up.
        pruner = BestFractionPruner(opts.prune_below, min_steps=max(2, math.ceil(0.4 * base.seconds)))
    return sampler, pruner


def _run_study(study: Any, root: Path, name: str, url: str, opts: SearchOptions,
               base: BenchConfig, overrides: dict[str, Any], out: Path, say: Progress,
               t0: float, *, exclusive: bool, shared_study: Any) -> SearchResult:
    """Ceilings and space, the baseline, the trials, the confirmations, the result."""
    from autotune.search.session import Session

    s = Session(study, root, opts, base, overrides, out, say, t0, shared=shared_study)
    try:
        return _search_session(s, root, name, url, opts, base, say, t0, exclusive)
    finally:
        s.close()


def _search_session(s: Any, root: Path, name: str, url: str, opts: SearchOptions,
                    base: BenchConfig, say: Progress, t0: float,
                    exclusive: bool) -> SearchResult:
    from autotune.search.conclude import conclude, write_outputs
    from autotune.search.confirm import confirm
    from autotune.search.trials import run_trials

    s.check_fingerprint(_fingerprint(root, opts, base), name, shared.redact(url))
    s.prepare(lambda: _measure_ceilings(root, opts, base, say, s.env), _cuda())
    s.fit_shm()
    baseline: TrialRecord | None = None
    try:
        baseline = s.baseline()
        s.reclaim_orphans(exclusive)
        measured = s.measured()
        stop_reason = run_trials(s, measured, baseline)
        if opts.confirm and stop_reason != "timeout":
            pool = list(measured.values()) + ([baseline] if baseline is not None else [])
            if not confirm(s, pool, baseline):
                stop_reason = "timeout (while confirming)"
    except KeyboardInterrupt:
        stop_reason = "interrupted (Ctrl-C): results so far"
    if baseline is None and opts.baseline:
        baseline = s.stored_baseline()  # measured by another host of this class
        if baseline is not None and baseline.ok:
            s.revise(baseline)
    res = conclude(s, name, shared.redact(url), baseline, stop_reason, time.monotonic() - t0)
    if opts.whole_run and not stop_reason.startswith("interrupted"):
        from autotune.search.runcache import apply_run

        apply_run(s, res, say)
    write_outputs(res)
    return res


