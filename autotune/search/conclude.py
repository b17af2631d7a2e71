"""The end of a search: the pool the recommendation is chosen from (the confirmed figures
when every candidate has one), the knee, the verdict, the result and its files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.search import recommend as rec_mod
from autotune.search.confirm import ckey, confirmed
from autotune.search.records import TrialRecord
from autotune.search.result import SearchResult, options_dict
from autotune.search.session import Session
from autotune.search.verdict import decide, job_args_of, worker_bound_of


def _trial_records(study: Any) -> list[TrialRecord]:
    return [TrialRecord.from_dict(d) for t in study.trials if (d := t.user_attrs.get("record"))]


def hosts_summary(trials: list[TrialRecord], here: dict[str, Any]) -> list[dict[str, Any]]:
    """Trials grouped by class of hosts (CPU model, cores, storage class): figures compare
    only within a group; this host's group first."""
    groups: dict[str, dict[str, Any]] = {}
    for t in trials:
        h = t.host or here
        g = groups.setdefault(h.get("key", "?"), {
            "key": h.get("key"), "cpu_model": h.get("cpu_model"), "cores": h.get("cores"),
            "storage_class": h.get("storage_class"), "hostnames": [], "trials": 0,
            "best_images_per_s": None, "this_host": h.get("key") == here.get("key")})
        if h.get("hostname") not in g["hostnames"]:
            g["hostnames"].append(h.get("hostname"))
        if t.state in ("duplicate", "skipped"):
            continue
        g["trials"] += 1
        if t.ok and (g["best_images_per_s"] is None or t.images_per_s > g["best_images_per_s"]):
            g["best_images_per_s"] = t.images_per_s
    return sorted(groups.values(), key=lambda g: (not g["this_host"], g["key"] or ""))


def _pool(s: Session, measured: list[TrialRecord], baseline: TrialRecord | None,
          conf: dict[str, TrialRecord], stop_reason: str,
          warnings: list[str]) -> list[TrialRecord]:
    """What the winner is named from: the longer windows when every candidate has one; a
    search that stopped before confirming (timeout, Ctrl-C) names it from the trials and
    says so. The baseline was measured like any trial: when nothing the search tried
    beats it, it is the recommendation, never a slower configuration."""
    pool = measured + ([baseline] if baseline is not None and baseline.ok else [])
    cands = rec_mod.confirm_candidates(pool, s.opts.confirm, baseline) if s.opts.confirm else []
    conf_ok = [c for c in conf.values() if c.ok]
    for c in conf.values():
        if not c.ok:
            warnings.append(f"confirming {c.params} failed ({c.reason}): it is not a "
                            "candidate for the recommendation")
    missing = [c for c in cands if ckey(c.params) not in conf]
    if len(cands) > 1 and conf_ok and not missing:
        for c in conf_ok:
            s.ceilings.revise(c.number, c.images_per_s)  # type: ignore[union-attr]
        return conf_ok
    if len(cands) > 1:
        warnings.append(f"the recommendation is not confirmed: {len(missing) or len(cands)} of "
                        f"the {len(cands)} configurations to confirm "
                        + ("were not measured again in a longer window" if missing else
                           "failed their confirmation")
                        + f" ({stop_reason}); the figures are single windows"
                        + _windows(cands))
    return pool


def _windows(trials: list[TrialRecord]) -> str:
    """The lengths of the windows the trials were measured in (a cold window ends with the
    dataset's first pass, and a window stays open for its batches, so not --seconds)."""
    secs = sorted(t.measured_s for t in trials if t.measured_s)
    if not secs:
        return ""
    lo, hi = secs[0], secs[-1]
    return f" of {lo:.1f} s" if hi - lo < 0.05 else f" of {lo:.1f}-{hi:.1f} s"


def conclude(s: Session, name: str, url: str, baseline: TrialRecord | None, stop_reason: str,
             seconds: float) -> Any:
    """The SearchResult of a finished (or stopped) search."""
    ceilings = s.ceilings
    assert ceilings is not None and s.space is not None
    trials = _trial_records(s.study)
    # What this host concludes from: trials of hosts like it (other classes are listed,
    # grouped, and not compared with these).
    here = [t for t in trials if s.shared.same_class(t.host)]
    measured = [t for t in here if t.state not in ("duplicate", "skipped")]
    for t in measured + ([baseline] if baseline is not None else []):
        if t.ok:  # a resumed study: what an earlier run measured counts too
            ceilings.revise(t.number, t.images_per_s)
    warnings: list[str] = []
    conf = confirmed(s.study, s.shared.host_key)
    measured, pool_base, conf = _fit_now(s, measured, baseline, conf, warnings)
    pool = _pool(s, measured, pool_base, conf, stop_reason, warnings)
    best = rec_mod.best_trial(pool)
    rec = rec_mod.knee(pool)
    step_s = s.base.compute_ms / 1000 if s.base.step is None and s.base.compute_ms else None
    verdict = decide(rec, best, ceilings, batch_size=s.base.batch_size, step_s=step_s,
                     dataset=str(s.root), worker_bound=worker_bound_of(s.space),
                     job_args=job_args_of(s.base)) if rec and best else None
    if best is None:
        warnings.append("no configuration completed: see each trial's reason and hint")
    if baseline is not None and not baseline.ok:
        warnings.append(f"the rule-of-thumb baseline "
                        f"{'was not run' if baseline.state == 'skipped' else 'failed'}: "
                        f"{baseline.reason}")
    shm = _shm_outcome(s, trials, verdict, rec)
    return SearchResult(dataset=str(s.root), study=name, storage=url,
                        # The ranks as measured (LOCAL_WORLD_SIZE where none was given).
                        options={**options_dict(s.opts),
                                 "procs_per_node": s.base.procs_per_node},
                        space=s.space.to_dict(),
                        ceilings=ceilings, trials=trials, baseline=baseline, best=best,
                        recommended=rec, verdict=verdict, stop_reason=stop_reason,
                        seconds=seconds, batch_size=s.base.batch_size, out_dir=str(s.out),
                        confirmations=list(conf.values()),
                        baseline_confirmed=(conf.get(ckey(baseline.params))
                                            if baseline is not None else None),
                        dataset_format=s.fmt,
                        warnings=warnings + [lb["reason"] for lb in ceilings.lower_bounds.values()]
                        + s.space.notes,
                        host=dict(s.shared.host), hosts=hosts_summary(trials, s.shared.host),
                        environment=s.env.to_dict(),
                        max_memory={"mib": s.max_mem, "source": s.max_mem_source},
                        shm=shm, open_files=s.files_gate.to_dict(),
                        sendable=s.send_gate.to_dict(), endpoint=_endpoint(str(s.root)))


def _fit_now(s: Session, measured: list[TrialRecord], baseline: TrialRecord | None,
             conf: dict[str, TrialRecord], warnings: list[str]) -> tuple[Any, Any, Any]:
    """A resumed study may hold figures an earlier search measured with a larger /dev/shm:
    configurations that do not fit here are listed but never recommended (the baseline
    returned is None when it is one of them: still shown, not a candidate)."""
    gate = s.shm_gate
    if gate is None or not gate.active:
        return measured, baseline, conf
    gone = [t for t in measured if t.ok and gate.why(t.params)]
    if baseline is not None and baseline.ok and gate.why(baseline.params):
        gone.append(baseline)
        baseline = None
    if gone:
        warnings.append(f"{len(gone)} configuration(s) measured earlier in this study do not "
                        "fit this /dev/shm: listed, not candidates for the recommendation")
    return ([t for t in measured if t not in gone], baseline,
            {k: c for k, c in conf.items() if not gate.why(c.params)})


def _shm_outcome(s: Session, trials: list[TrialRecord], verdict: Any,
                 rec: TrialRecord | None) -> dict[str, Any] | None:
    """search.json's `shm`; when /dev/shm cut configurations, the verdict names it as a
    limit of the recommendation and gives the size that runs what was cut."""
    from autotune.search.shmgate import skipped_for_shm

    gate = s.shm_gate
    if gate is None:
        return None
    n = skipped_for_shm(trials)
    d = gate.to_dict(n)
    if gate.bound and gate.active:
        lines = gate.lines(n)
        d["lines"] = lines
        if verdict is not None:
            w = (rec.params.get("num_workers") if rec is not None else None) or 0
            verdict.summary += (f"; /dev/shm limited the search to configurations whose "
                                f"batches fit ({gate.space_skipped} of "
                                f"{gate.space_size} not run"
                                + (", so the loading runs in the training process"
                                   if w == 0 and not gate.workers_fit else "") + ")")
            verdict.evidence.append(lines[0])
            fixes = lines[1:] if gate.baseline_skipped is None else lines[2:]
            if w == 0 and not gate.workers_fit:
                # "Set num_workers" alone would crash here: the room comes first.
                verdict.advice[:0] = [f"workers need room in /dev/shm first: no configuration "
                                      f"with workers fits the "
                                      f"{(gate.budget.budget_bytes or 0) / 2**20:,.0f} MiB "
                                      "this rank may use"] + fixes
            else:
                verdict.advice.extend(fixes)
    return d


def write_outputs(res: Any) -> None:
    """out/search.json and out/report.html, each written whole or not at all."""
    from autotune.report import html as report_html
    from autotune.report import write_json
    from autotune_base.fsutil import write_text_atomic

    out = Path(res.out_dir)
    res.json_file = str(out / "search.json")
    res.report_html = str(out / "report.html")
    d = res.to_dict()
    write_json(res.json_file, d)
    write_text_atomic(res.report_html, report_html.render([(f"search: {res.dataset}", d)]))


def _endpoint(dataset: str) -> str | None:
    """An s3:// dataset's S3-compatible endpoint as the search read it (--endpoint-url is
    handed on as AWS_ENDPOINT_URL), shown without user:password or query; None for AWS or
    a local dataset."""
    if not dataset.startswith("s3://"):
        return None
    from autotune_converters.objstore.client import S3Config

    try:
        ep = S3Config.from_env().endpoint_url
    except Exception:  # noqa: BLE001  (a figure for the printed code, never a failure)
        return None
    from autotune_converters.objstore.url import shown_endpoint

    return shown_endpoint(ep) if ep else None
