"""The answer in code: a search's result handed back to the training script.

    import autotune
    loader = DataLoader(dataset, **autotune.loader_kwargs("autotune-out/search.json"))

    res = autotune.tune("/data/train", factory=my_module.make_dataset, compute_ms=250)
    loader = DataLoader(my_dataset, **res.loader_kwargs); res.verdict; res.report_html

`loader_kwargs` reads OUT/search.json (a search always writes it): the recommended
configuration's loader settings (workers, prefetch, persistence, pinning) and the batch
size, only those valid for the dataset's kind (no prefetch_factor without workers), never
`shuffle` or anything else that changes what the model sees. The batch size is the
user's: see `loader_kwargs`. It warns when the search.json was made on another machine
(hostname, usable cores, a job memory whose half the recommended loader's peak is over)
or for another dataset (`dataset=`): the recommendation is a figure of that machine and
that data. /dev/shm it fits to this machine (`_fitted_to_shm`).
"""

from __future__ import annotations

import inspect
import json
import os
import socket
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from autotune.errors import UsageError


def loader_kwargs(search_json: str | os.PathLike[str], batch_size: int | None = None, *,
                  dataset: Any = None, warn: bool = True) -> dict[str, Any]:
    """`DataLoader(dataset, **loader_kwargs(path))` for the recommended configuration.

    Args:
        search_json: the search.json `autotune search --out DIR` wrote, or DIR. After a
            convert/stage loop: the staged copy's recommendation.
        batch_size: yours. Without it, the batch size the search measured when you gave it
            (`--batch-size`) or searched it; when the search measured the preset's batch
            size, which you never chose, UsageError (one line, naming it): pass yours. A
            batch size other than the measured one is used, with a warning naming both
            (the settings were found for the measured one). Where its batches would not
            fit the /dev/shm budget the search measured, or this machine's where that is
            smaller (a container's 64 MiB under a search made outside it), workers and
            prefetch are cut to what fits, and a warning says so.
        dataset: the path (or the `open_dataset` result) you train on: a warning when
            the search measured another dataset.
        warn: False silences the warnings (other machine, less memory here, other
            dataset, other batch size, settings cut to fit /dev/shm).

    Returns the DataLoader keywords: `batch_size`, `num_workers`, and where they apply
    `prefetch_factor`, `persistent_workers`, `pin_memory` (and any setting a search
    space added); never `shuffle`, a sampler or `drop_last`: the order is yours.
    """
    p, d = _read(search_json)
    side = d.get("after") or d     # the loop: the staged copy's recommendation
    rec = (side.get("recommended") or {}) if isinstance(side, dict) else {}
    if not rec.get("config"):
        raise UsageError(f"{p}: no recommended configuration in it (the search completed no "
                         "configuration: see its trials' reasons)")
    from autotune.search.recommend import NOT_LOADER_SETTINGS, kwargs_of

    kw = side.get("loader_kwargs")
    measured = (rec["config"].get("batch_size") or side.get("batch_size") or d.get("batch_size")
                or (d.get("options") or {}).get("batch_size"))
    if not kw:  # a search.json written before the key existed
        iterable = bool((side.get("ceilings") or {}).get("iterable"))
        if not measured and batch_size is None:
            raise UsageError(f"{p}: no batch size in it (written by an older autotune without "
                             "'batch_size'); search again, or pass batch_size= yourself")
        kw = kwargs_of(rec["config"], int(measured or batch_size), iterable=iterable)
    # An older search.json's shuffle=True: the order was never the search's to set.
    kw = {k: v for k, v in kw.items() if k not in NOT_LOADER_SETTINGS}
    kw["batch_size"] = _users_batch_size(d, rec, kw.get("batch_size", measured), batch_size,
                                         p, warn)
    shm, env = side.get("shm") or d.get("shm"), _environment()
    kw = _fitted_to_shm(kw, shm, measured, _shm_here(env, shm), p, warn)
    kw = _fitted_to_open_files(kw, shm, p, warn)
    if warn:
        _warn_if_other_machine(d, side, p)
        _warn_if_memory_short(d, side, env, p)
        if dataset is not None:
            _warn_if_other_dataset(side, dataset, p)
    return kw


def _users_batch_size(d: dict[str, Any], rec: dict[str, Any], measured: Any,
                      batch_size: int | None, p: Path, warn: bool) -> int:
    """The batch size to hand back: the user's, or the measured one where they chose it."""
    if batch_size is None:
        if _batch_size_from(d, rec) == "preset":
            preset = (d.get("options") or {}).get("preset") or "the"
            raise UsageError(
                f"{p}: the search measured batch_size={measured}, the {preset} preset's, which "
                "you did not choose; pass yours: loader_kwargs(path, batch_size=N) (or search "
                "with --batch-size N).", setting="batch_size")
        return int(measured)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UsageError(f"batch_size must be a whole number of at least 1, but got "
                         f"{batch_size!r}.", setting="batch_size")
    if warn and measured and batch_size != measured:
        warnings.warn(f"{p}: the search measured batch_size={measured}, you pass "
                      f"batch_size={batch_size}: the recommended settings were found for "
                      f"{measured}; search again with --batch-size {batch_size} to tune for "
                      "yours.", RuntimeWarning, stacklevel=3)
    return batch_size


def _read(search_json: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    """The search.json's path (DIR/search.json for a DIR) and its object."""
    p = Path(search_json)
    if p.is_dir():
        p = p / "search.json"
    try:
        d = json.loads(p.read_text())
    except OSError as e:
        raise UsageError(f"{p}: {e.strerror}; give the search.json `autotune search --out DIR` "
                         "wrote (or DIR)") from e
    except ValueError as e:
        raise UsageError(f"{p}: not JSON ({e}); give the search.json autotune wrote") from e
    if not isinstance(d, dict):
        raise UsageError(f"{p}: not a search.json (a JSON object is expected)")
    return p, d


def _environment() -> Any:
    """This machine's `autotune.environment.Environment`, or None where it cannot be read:
    the handoff never fails for a figure it only checks against."""
    try:
        from autotune.environment import read_environment

        return read_environment(runs_fio=False)
    except Exception:  # noqa: BLE001 - unread here: the search's figures stand
        return None


def _shm_here(env: Any, shm: Any) -> Any:
    """This machine's /dev/shm budget (an `autotune.shmfit.ShmBudget`) for one rank: the
    search's ranks, or LOCAL_WORLD_SIZE where torchrun set it; None where unread."""
    if env is None or not isinstance(shm, dict) or not shm.get("batch_bytes"):
        return None
    try:
        from autotune.shmfit import shm_budget

        ranks = os.environ.get("LOCAL_WORLD_SIZE") or (shm.get("budget") or {}).get("ranks")
        return shm_budget(env, int(ranks or 1))
    except Exception:  # noqa: BLE001 - unread here: the search's budget stands
        return None


def _warn_if_memory_short(d: dict[str, Any], side: dict[str, Any], env: Any, p: Path) -> None:
    """A warning where the recommended loader's peak memory in the search is over the bound
    the search keeps its trials within (half the job's memory: its cgroup limit, else the
    host's) on this machine, and that bound is tighter here than where it searched: a
    search made on the host, a training run in a container with a memory limit."""
    from autotune.shmfit import oom_group_divisor

    rec = side.get("recommended") or {}
    peak = rec.get("peak_pss_mib") or rec.get("peak_rss_mib")
    if env is None or not isinstance(peak, (int, float)) or peak <= 0:
        return
    here = env.memory_total() / 2**20 / 2 / oom_group_divisor(env)
    searched = (side.get("max_memory") or d.get("max_memory") or {}).get("mib")
    if peak <= here or (isinstance(searched, (int, float)) and searched <= here):
        return
    kind = "PSS" if rec.get("peak_pss_mib") else "RSS"
    warnings.warn(f"{p}: the recommended configuration's loader held {peak:,.0f} MiB at its "
                  f"peak in the search ({kind} of its processes), over {here:,.0f} MiB, half "
                  f"of this machine's job memory ({env.memory_total_source()}), the bound a "
                  "search keeps its trials within: with your model beside it, a worker may be "
                  "killed for memory. Search again here, or pass fewer workers.",
                  RuntimeWarning, stacklevel=3)


def _fitted_to_shm(kw: dict[str, Any], shm: Any, measured: Any, here: Any, p: Path,
                   warn: bool) -> dict[str, Any]:
    """`kw` with its workers and prefetch cut to what /dev/shm holds at the user's batch
    size and on this machine (`here`: its budget, None where unread). The search fitted
    them to its measured batch's bytes and its own /dev/shm; a larger batch, or a
    container's 64 MiB /dev/shm under a search made outside it, puts more batches there
    than fit, and the first epoch dies ("unable to allocate shared memory"). The bytes
    scale with the batch (about: a sample's bytes times it)."""
    from autotune.shmfit import fits, max_live_batches, needed_bytes

    if not isinstance(shm, dict) or not shm.get("batch_bytes") \
            or shm.get("budget_bytes") is None:
        return kw
    workers, prefetch = int(kw.get("num_workers") or 0), kw.get("prefetch_factor")
    # Scaled from the batch size the bytes were measured at (the search's own; a search
    # of batch sizes may recommend another), else the recommended one (an older file).
    at = int(shm.get("batch_size") or measured or kw["batch_size"])
    batch = int(shm["batch_bytes"]) * kw["batch_size"] // at
    budget = searched = int(shm["budget_bytes"])
    MiB = 2**20
    where = "the search measured there"
    if here is not None and here.budget_bytes is not None and here.budget_bytes < budget:
        budget = here.budget_bytes
        where = (f"this machine's /dev/shm allows ({here.source}; the search's allowed "
                 f"{searched / MiB:,.0f} MiB)")
    if fits(workers, prefetch, batch, budget):
        return kw
    live = max_live_batches(batch, budget)
    w = min(workers, max(live - 1, 0))                 # each worker one batch ahead at least
    pf = max(1, min(prefetch or 2, (live - 1) // w)) if w else None
    out = _with_workers(kw, w, pf)
    if warn:
        now = f"num_workers={w}" + (f", prefetch_factor={pf}" if w else "")
        scaled = (f" (the search measured {int(shm['batch_bytes']) / MiB:.1f} MiB at {at})"
                  if kw["batch_size"] != at else "")
        again = (f"Search again here with --batch-size {kw['batch_size']}"
                 if kw["batch_size"] != at else "Search again here")
        warnings.warn(
            f"{p}: at batch_size={kw['batch_size']} a batch is about {batch / MiB:.1f} MiB"
            f"{scaled}: num_workers={workers}, prefetch_factor={prefetch or 2} would hold "
            f"{needed_bytes(workers, prefetch, batch) / MiB:.0f} MiB of /dev/shm, over the "
            f"{budget / MiB:.0f} MiB {where}, and die with 'unable to allocate shared "
            f"memory'; handing back {now}, which fits. {again}, or give the container a "
            "larger /dev/shm (docker run --shm-size).", RuntimeWarning, stacklevel=3)
    return out


def _with_workers(kw: dict[str, Any], w: int, pf: int | None) -> dict[str, Any]:
    """`kw` with `w` workers `pf` batches ahead, in kw's order; without workers, no setting
    that needs them (torch refuses those)."""
    from autotune.params import PARAMS

    out = {k: (w if k == "num_workers" else pf if k == "prefetch_factor" else v)
           for k, v in kw.items() if w or not getattr(PARAMS.get(k), "workers_only", False)}
    if w and "prefetch_factor" not in out:
        out["prefetch_factor"] = pf
    return out


def _fitted_to_open_files(kw: dict[str, Any], shm: Any, p: Path, warn: bool) -> dict[str, Any]:
    """`kw` with its prefetch, then its workers, cut to what this process's open-files
    limit holds (autotune.openfiles) for the tensors of the batch the search
    measured: each one in flight is an open file, and past the limit a worker drops its
    batch and the epoch waits for it for ever. A search made where `ulimit -n` is high
    says nothing of a container's or a batch system's lower one."""
    from autotune import openfiles
    from autotune.online.config import Config

    tensors = shm.get("batch_tensors") if isinstance(shm, dict) else None
    workers = int(kw.get("num_workers") or 0)
    if not isinstance(tensors, int) or tensors <= 0 or not workers:
        return kw
    cfg = Config(workers, kw.get("prefetch_factor") or 2, False, False)
    why = openfiles.over(cfg, tensors)
    if why is None:
        return kw
    while cfg.num_workers and openfiles.over(cfg, tensors):
        pf = cfg.prefetch_factor or 2
        w = cfg.num_workers if pf > 1 else cfg.num_workers - 1
        cfg = Config(w, (max(1, pf // 2) if pf > 1 else 1) if w else None, False, False)
    if warn:
        now = f"num_workers={cfg.num_workers}" + (
            f", prefetch_factor={cfg.prefetch_factor}" if cfg.num_workers else "")
        warnings.warn(f"{p}: {why}: a worker past it drops its batch and the epoch waits for "
                      f"it for ever; handing back {now}, which fits. To keep the search's, "
                      f"{openfiles.fix()}.", RuntimeWarning, stacklevel=3)
    return _with_workers(kw, cfg.num_workers, cfg.prefetch_factor)


def _batch_size_from(d: dict[str, Any], rec: dict[str, Any]) -> str:
    """search.json's `batch_size_from`, or for an older one what its options say."""
    got = d.get("batch_size_from")
    if got in ("option", "searched", "preset"):
        return got
    if "batch_size" in (rec.get("config") or {}):
        return "searched"
    opts = d.get("options")
    if not isinstance(opts, dict) or opts.get("batch_size") is not None:
        return "option"  # options unknown (a hand-written file): its batch size stands
    return "preset"


def _warn_if_other_machine(d: dict[str, Any], side: dict[str, Any], p: Path) -> None:
    from autotune.cpus import usable_cores

    host = (d.get("host") or {}).get("hostname")
    here_name = socket.gethostname()
    if host and host != here_name:
        warnings.warn(f"{p}: the search ran on {host}, this is {here_name}: the recommended "
                      "settings are figures of that machine; search again here",
                      RuntimeWarning, stacklevel=3)
    searched = (side.get("ceilings") or {}).get("cores")
    here = usable_cores()
    if searched and searched != here:
        warnings.warn(f"{p}: the search measured on {searched} usable core(s), this machine has "
                      f"{here}: the recommended num_workers is a figure of that machine; search "
                      "again here", RuntimeWarning, stacklevel=3)


def _where(x: Any) -> str:
    s = str(getattr(x, "path", x))
    return s if s.startswith("s3://") else os.path.realpath(s)


def _warn_if_other_dataset(side: dict[str, Any], dataset: Any, p: Path) -> None:
    searched = side.get("dataset")
    if searched and _where(searched) != _where(dataset):
        warnings.warn(f"{p}: the search measured {searched}, you train on {_where(dataset)}: "
                      "its settings are figures of that data; search this one",
                      RuntimeWarning, stacklevel=3)


@dataclass
class TuneResult:
    """What `tune` found: the kwargs to use, the verdict, the report, the whole search."""

    search: Any                      # autotune.search.SearchResult (or LoopResult's before)
    loader_kwargs: dict[str, Any]
    verdict: Any
    report_html: str | None
    json_file: str | None


def tune(dataset: str | os.PathLike[str], factory: Callable[[str], Any] | str | None = None,
         **options: Any) -> TuneResult:
    """Run the search in this process (its measurements in fresh processes, as the CLI's)
    for `dataset`, with the user's own Dataset when `factory` is given: a module-level
    function (or 'file.py:function') that takes the dataset path. `options` are
    SearchOptions fields (compute_ms, batch_size, trials, out, procs_per_node, ...).

    The result's `loader_kwargs` holds `batch_size` when you gave it or the space searched
    it; when the search measured the preset's, which you did not choose, it is left out
    (a RuntimeWarning says so): pass yours to the DataLoader."""
    from autotune.search import SearchOptions, run_search

    spec = factory if isinstance(factory, str) or factory is None else factory_spec(factory)
    try:
        opts = SearchOptions(dataset_factory=spec, **options)
    except TypeError as e:
        raise UsageError(f"tune(): {e}; options are SearchOptions fields") from None
    from autotune.search.recommend import kwargs_of

    res = run_search(dataset, opts)
    # The search.json's loader_kwargs, from the result in memory (not read back).
    kw = (kwargs_of(res.recommended.params, res.batch_size, iterable=res.iterable)
          if res.recommended else {})
    if kw and res.batch_size_from == "preset":
        # A model setting nobody chose is not handed on: the caller passes theirs.
        measured = kw.pop("batch_size")
        warnings.warn(f"tune(): loader_kwargs holds no batch_size: the search measured "
                      f"{measured}, the {opts.preset} preset's, which you did not choose; "
                      "pass yours to the DataLoader (DataLoader(ds, batch_size=N, "
                      "**result.loader_kwargs)), or batch_size= to tune() to measure it",
                      RuntimeWarning, stacklevel=2)
    return TuneResult(res, kw, res.verdict, res.report_html, res.json_file)


def factory_spec(fn: Callable[[str], Any]) -> str:
    """'path/file.py:function' of a module-level function, importable by a fresh process."""
    name = getattr(fn, "__qualname__", "")
    mod = inspect.getmodule(fn)
    path = getattr(mod, "__file__", None)
    if not name or "<" in name or "." in name or path is None:
        raise UsageError(f"tune(): the factory {fn!r} must be a function defined at module level "
                         "in a .py file (each measurement runs in a fresh process that imports "
                         "it); give it as 'path/file.py:function' otherwise")
    return f"{os.path.abspath(path)}:{name}"
