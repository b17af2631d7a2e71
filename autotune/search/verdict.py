"""The search's verdict: the one engine (autotune.verdict) fed with the recommended
configuration's own window (what the monitor saw its processes and the disk do) and the
ceilings measured apart from the trials. A ceiling a trial overtook is not given: it was
a wrong measurement, and the best trial being "at" it would be true by construction."""

from __future__ import annotations

from typing import Any

from autotune.monitor.figures import SystemFigures
from autotune.search.ceilings import Ceilings
from autotune.search.records import TrialRecord
from autotune.verdict import RuleInputs, Verdict
from autotune.verdict import decide as decide_rules


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def decide(rec: TrialRecord, best: TrialRecord, ceilings: Ceilings, *,
           batch_size: int | None = None, step_s: float | None = None,
           dataset: str | None = None, worker_bound: int | None = None,
           job_args: str = "") -> Verdict:
    """The verdict for the recommended configuration `rec` (best: the fastest measured)."""
    figs = SystemFigures.from_dict(rec.system_figures) if rec.system_figures else None
    no_step = rec.au is None
    p = rec.params
    inp = RuleInputs(
        # No step: the loader alone is measured, input-bound by construction.
        au=0.0 if no_step else rec.au, data_share=rec.data_wait_fraction,
        step_time_s=rec.step_ms / 1000 if rec.step_ms else step_s,
        images_per_s=rec.images_per_s, batch_size=p.get("batch_size", batch_size),
        steps=rec.batches or 0,
        loader={"num_workers": p.get("num_workers"), "prefetch_factor": p.get("prefetch_factor")},
        job_cores=ceilings.cores, system=figs, probe=ceilings.probe, dataset=dataset,
        storage_ceiling=ceilings.valid("storage"), storage_unit=ceilings.storage_unit,
        storage_overtaken="storage" in ceilings.lower_bounds,
        storage_concurrency=ceilings.storage_best_concurrency,
        decode_ceiling=ceilings.valid("decode"), worker_bound=worker_bound,
        stages=rec.stages, job_args=job_args)
    v = decide_rules(inp)
    v.evidence[1:1] = _search_lines(rec, best, ceilings, no_step)
    return v


def _search_lines(rec: TrialRecord, best: TrialRecord, ceilings: Ceilings,
                  no_step: bool) -> list[str]:
    ips = best.images_per_s or 0.0
    lines: list[str] = [f"recommended {rec.images_per_s:,.0f} images/s, AU {_pct(rec.au)}, "
                        f"data wait {_pct(rec.data_wait_fraction)}; best measured {ips:,.0f} "
                        "images/s"]
    if no_step:
        lines.append("no step (compute 0): the loader alone is measured, so it is the "
                     "limit by construction; the verdict says which part of it")
    for name, v in sorted(ceilings.finite().items(), key=lambda kv: kv[1]):
        lines.append(f"{name} ceiling {v:,.0f} images/s: best = {ips / v:.0%} of it")
    for name, lb in ceilings.lower_bounds.items():
        lines.append(f"{name} ceiling: not used ({lb['measured']:,.0f} measured, overtaken "
                     f"by {lb['at_least']:,.0f}: a wrong measurement)")
    if ceilings.ram_backed:
        lines.append(f"the dataset is RAM-backed ({ceilings.ram_backed}): never cold")
    return lines


def job_args_of(base: Any) -> str:
    """The search options that name the job, for the verdict's next command: the user's
    Dataset factory, their step, a preset other than the default."""
    import shlex

    from autotune.bench.config import DEFAULT_PRESET

    out = []
    if getattr(base, "dataset_factory", None):
        out.append(f"--dataset-factory {shlex.quote(base.dataset_factory)}")
    elif getattr(base, "preset", None) and base.preset != DEFAULT_PRESET:
        out.append(f"--preset {shlex.quote(base.preset)}")
    if getattr(base, "step", None):
        out.append(f"--step {shlex.quote(base.step)}")
    return " ".join(out)


def worker_bound_of(space: Any) -> int | None:
    w = getattr(space, "num_workers", None)
    return max(w) if w else None
