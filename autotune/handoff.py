"""The answer in code: a search's result handed back to the training script.

    import autotune
    loader = DataLoader(dataset, **autotune.loader_kwargs("autotune-out/search.json"))

    res = autotune.tune("/data/train", factory=my_module.make_dataset, compute_ms=250)
    loader = DataLoader(res.dataset, **res.loader_kwargs); res.verdict; res.report_html

`loader_kwargs` reads OUT/search.json (a search always writes it): the recommended
configuration's DataLoader keywords, batch_size included, and only those valid for the
dataset's kind (no shuffle= for an IterableDataset, no prefetch_factor without workers).
It warns when the machine's usable cores differ from the ones the search measured on:
the recommendation is a figure of that machine.
"""

from __future__ import annotations

import inspect
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from autotune.errors import UsageError


def loader_kwargs(search_json: str | os.PathLike[str], *, warn: bool = True) -> dict[str, Any]:
    """DataLoader(dataset, **loader_kwargs(path)) for the recommended configuration."""
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
    side = d.get("after") or d     # the loop: the staged copy's recommendation
    rec = (side.get("recommended") or {}) if isinstance(side, dict) else {}
    if not rec.get("config"):
        raise UsageError(f"{p}: no recommended configuration in it (the search completed no "
                         "configuration: see its trials' reasons)")
    from autotune.search.recommend import kwargs_of

    kw = side.get("loader_kwargs")
    if not kw:  # a search.json written before the key existed
        iterable = bool((side.get("ceilings") or {}).get("iterable"))
        bs = (rec["config"].get("batch_size") or side.get("batch_size")
              or (side.get("options") or {}).get("batch_size"))
        if not bs:
            raise UsageError(f"{p}: no batch size in it (written by an older autotune without "
                             "'batch_size'); search again, or pass batch_size= yourself")
        kw = kwargs_of(rec["config"], int(bs), iterable=iterable)
    if warn:
        _warn_if_other_machine(side, p)
    return kw


def _warn_if_other_machine(d: dict[str, Any], p: Path) -> None:
    from autotune.cpus import usable_cores

    searched = (d.get("ceilings") or {}).get("cores")
    here = usable_cores()
    if searched and searched != here:
        warnings.warn(f"{p}: the search measured on {searched} usable core(s), this machine has "
                      f"{here}: the recommended num_workers is a figure of that machine; search "
                      "again here", RuntimeWarning, stacklevel=3)


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
    SearchOptions fields (compute_ms, batch_size, trials, out, procs_per_node, ...)."""
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
