"""`analyze(log)`: step timings of a training log, joined with system metrics, diagnosed.

The log is read once, as a stream. Each record is weighted by the batches it stands for
(pytorch/examples and timm print every Nth batch: a line at batch 50 after one at 40
stands for 10; the first line of an epoch for the batches since the epoch began, at most
one logging interval, since an excerpt may begin mid-epoch), the first batches of the run
are left out as warm-up (max(5, workers x prefetch)), and the rest is summed: data-time
share, AU, step-time quantiles, images/s, per-epoch and over-the-run trends. The share
counts every other step line, epoch-start stalls included; `steady_data_time_share` leaves
out the first lines of each epoch (when the workers start), and those are reported apart
(`epoch_starts`). A line printed twice (two log handlers) counts once. Then the metrics of
the same time window are joined and `rules.decide` gives the verdict. The inputs (log, monitor directory, probe, format) are
read by `inputs.py`, the pass over the records is `logpass.py`; what the monitor's run.json
says beside the verdict (a job that failed, /dev/shm, the disk watched) is `runinfo.py`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.analyze import trend
from autotune.analyze.inputs import (Inputs, detect_format, load_probe, make_parser,
                                     resolve_inputs, step_log_beside)
from autotune.analyze.join import SystemFigures, join_metrics
from autotune.analyze.logpass import LogPass
from autotune.analyze.runinfo import failed_unlogged, run_facts
from autotune.analyze.parsers import LogParser, ProfileSummary, Skip
from autotune.analyze.reader import SPOOL_PREFIX, STDIN, LineTimes, iter_lines, spooled
from autotune.verdict.rules import RuleInputs, decide
from autotune.errors import UsageError
from autotune.verdict import Verdict

OWN = "own"             # the format of autotune.instrument()'s step log
SHORT_LOG_LINES = 20    # fewer measured step lines: the share is given with a confidence note
OTHER_APART = 2.0       # the line's other reading disagrees this many times: say both
MIN_ACROSS = 5         # steps logged by two ranks or more before their shortest step is used
WHY_APART_RUNNING = ("the printed lines are a sample of the batches, the running averages count "
                     "every batch: a wait between printed lines (a slow start, a stall every "
                     "N batches) shows only in the averages")
WHY_APART_SAMPLE = ("one iteration per line is a small sample: a stall in it, or one that "
                    "missed it, moves it far from the averages")


@dataclass
class Analysis:
    """Everything `autotune analyze` found; `to_dict()` is the --json document."""

    log: str
    format: str
    lines: dict[str, Any]
    steps: int
    batches: int
    warmup_steps: int
    epochs: int
    ranks: int
    batch_size: int | None
    batch_size_source: str
    data_time_share: float | None
    au: float | None
    step_time_s: dict[str, float | None]
    iteration_time_s: dict[str, float | None]
    data_wait_s: dict[str, float | None]
    images_per_s: float | None
    window: tuple[float, float] | None
    times_from: str | None
    trend: dict[str, Any]
    system: SystemFigures | None
    probe: dict[str, Any] | None
    loader: dict[str, Any] | None
    dataset: str | None
    verdict: Verdict
    profile: ProfileSummary | None = None
    warnings: list[str] = field(default_factory=list)
    steady_data_time_share: float | None = None
    epoch_starts: dict[str, Any] | None = None
    share_from: dict[str, Any] | None = None
    confidence: dict[str, Any] = field(default_factory=lambda: {"level": "normal", "note": None})
    run: dict[str, Any] | None = None     # the monitor's run.json: how the job ended, the disk
    # Ranks in one log: at each step, the shortest of the ranks' steps (the others waited
    # in all_reduce for the slowest); the step's own time, None with one rank.
    step_time_shortest_rank_s: dict[str, float | None] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "log": self.log, "format": self.format, "lines": self.lines,
            "steps": self.steps, "batches": self.batches, "warmup_steps": self.warmup_steps,
            "epochs": self.epochs, "ranks": self.ranks,
            "batch_size": self.batch_size, "batch_size_source": self.batch_size_source,
            "data_time_share": self.data_time_share,
            "steady_data_time_share": self.steady_data_time_share, "au": self.au,
            "input_bound": None if self.au is None else self.au < 0.90,
            "step_time_s": self.step_time_s,
            "step_time_shortest_rank_s": self.step_time_shortest_rank_s,
            "iteration_time_s": self.iteration_time_s,
            "data_wait_s": self.data_wait_s, "images_per_s": self.images_per_s,
            "window": list(self.window) if self.window else None, "times_from": self.times_from,
            "trend": self.trend,
            "metrics": self.system.to_dict() if self.system is not None else None,
            "probe": _probe_brief(self.probe), "loader": self.loader, "dataset": self.dataset,
            "profile": self.profile.to_dict() if self.profile else None,
            "epoch_starts": self.epoch_starts, "share_from": self.share_from,
            "confidence": self.confidence,
            "run": self.run, "verdict": self.verdict.to_dict(), "warnings": self.warnings,
        }


def _probe_brief(probe: dict[str, Any] | None) -> dict[str, Any] | None:
    if not probe:
        return None
    v = probe.get("verdict") or {}
    fio = probe.get("fio") or {}
    return {"path": probe.get("path"), "storage_files_per_s": v.get("storage_files_per_s"),
            "best_concurrency": v.get("best_concurrency"),
            "rand_read_iops": (fio.get("rand_read") or {}).get("iops"), "class": v.get("class")}


def analyze(log: str | os.PathLike[str], *, metrics: str | os.PathLike[str] | None = None,
            probe: str | os.PathLike[str] | dict[str, Any] | None = None,
            batch_size: int | None = None, format: str = "auto",
            regex: str | os.PathLike[str] | None = None, dataset: str | None = None,
            warmup: int | None = None) -> Analysis:
    """Parse a training log, join it with metrics, and diagnose it.

    Args:
        log: the log file (any size, gzip allowed), "-" for standard input, or an
            `autotune monitor` output dir.
        metrics: the monitor's metrics.jsonl (default: the one in a monitor dir).
        probe: `autotune probe --json` output (path or dict): the storage ceiling.
        batch_size: samples per step when the log does not say (most text logs).
        format: auto, a name in autotune.analyze.parsers.BUILTIN, or regex (with `regex`).
        regex: YAML file with a user pattern (see autotune.analyze.parsers.regex).
        dataset: the dataset path, for the next command (else from the step log's header
            or the monitor's run.json).
        warmup: steps at the start left out (default max(5, workers x prefetch)).

    Raises UsageError for a missing/unreadable file or a log with no step timing.
    """
    kw = {"metrics": metrics, "probe": probe, "batch_size": batch_size, "format": format,
          "regex": regex, "dataset": dataset, "warmup": warmup}
    if os.fspath(log) == STDIN:
        return _from_stdin(kw)
    inp = resolve_inputs(log, metrics, dataset)
    warnings = list(inp.notes)
    fmt = _format(inp, format, regex)
    parser = make_parser(fmt, regex)
    times = LineTimes.for_log(inp.log)
    acc = LogPass(warmup, times, parser.other_kind)
    lines, profiles = _stream(parser, inp.log, acc, warnings)
    used_warm = _finish(acc, warnings)
    meta, loader, dataset = _job(parser, dataset, inp.dataset, warnings)
    profile = profiles[-1] if profiles else None
    if acc.measured.n == 0 and profile is None:
        raise _unlogged(inp, _no_timing(inp.log, fmt, lines, parser))
    f = _figures(acc, parser, fmt, batch_size, meta, profile, times, warnings)
    system = _system(inp.metrics, f["window"], warnings)
    steady, starts, share_from, conf = _shares(acc, parser, f["data_share"], profile, warnings)
    probe_d = load_probe(probe) if isinstance(probe, (str, os.PathLike)) else probe
    shortest, across_note = _shortest_rank_step(acc, f["step_q"])
    run, said = run_facts(inp.run, inp.run_dir, system, f["steps"], dataset,
                          warmup_only=used_warm, loader=loader)
    verdict, warm = _verdict(f, (shortest or f["step_q"]).get("p50"), loader, system, probe_d,
                             dataset, parser, **_failures(run), warmup_only=used_warm)
    verdict.evidence.extend(e for e in (parser.caveat, conf["note"], across_note) if e)
    verdict.evidence.extend(_next_search_notes(verdict, loader, warm))
    verdict.evidence.extend(trend.epochs_described(acc.epochs))
    return Analysis(
        log=str(inp.log), format=fmt, lines=lines, steps=f["steps"], batches=f["batches"],
        warmup_steps=0 if used_warm else acc.warm.n, epochs=len(acc.epochs), ranks=_ranks(acc),
        batch_size=f["bs"], batch_size_source=f["bs_src"], data_time_share=f["data_share"],
        au=f["au"], step_time_s=f["step_q"], step_time_shortest_rank_s=shortest,
        iteration_time_s=f["iter_q"],
        data_wait_s=f["data_q"], images_per_s=f["ips"], window=f["window"],
        times_from=f["times_from"], trend=f["trend"], system=system, probe=probe_d,
        loader=loader, dataset=dataset, verdict=verdict, profile=profile,
        warnings=said + warnings + parser.notes, steady_data_time_share=steady,
        epoch_starts=starts, share_from=share_from, confidence=conf, run=run)


def _failures(run: dict[str, Any] | None) -> dict[str, Any]:
    """RuleInputs' causes of a failed job, from the analysis's `run` section."""
    return {"shm_failure": (run or {}).get("shm"), "files_failure": (run or {}).get("files")}


def _verdict(f: dict[str, Any], step_s: float | None, loader: dict[str, Any] | None,
             system: SystemFigures | None, probe: dict[str, Any] | None, dataset: str | None,
             parser: LogParser, **run: Any) -> tuple[Verdict, str | None]:
    """The verdict engine on the log's figures (`step_s`: the step's own time; `run`: how
    the run went, RuleInputs' shm_failure, files_failure and warmup_only), and why its next
    search is --warm (None: it is not)."""
    cores, procs = _cores(getattr(parser, "meta", {}) or {}), procs_per_node(parser)
    warm = warm_because(loader, f["bs"], cores, procs)
    return decide(RuleInputs(au=f["au"], data_share=f["data_share"], step_time_s=step_s,
                             images_per_s=f["ips"], batch_size=f["bs"], steps=f["steps"],
                             loader=loader, system=system, probe=probe, dataset=dataset,
                             job_cores=cores, job_args=_job_args(loader, procs),
                             warm_because=warm, **run)), warm


def procs_per_node(parser: LogParser) -> int:
    """The ranks on one host, from the step log's headers (autotune's own log writes one
    per rank, with its host and rank): a next search's --procs-per-node. 1 otherwise."""
    hosts: dict[str, set[int]] = {}
    for h in getattr(parser, "headers", None) or []:
        rank = h.get("rank")
        if type(rank) is int and rank >= 0:
            hosts.setdefault(str(h.get("host")), set()).add(rank)
    return max((len(r) for r in hosts.values()), default=1)


def _finish(acc: LogPass, warnings: list[str]) -> bool:
    """Close the pass; True (and a warning) when every step was within the warm-up."""
    used_warm = acc.finish()
    if used_warm:
        warnings.append(f"only {acc.warm.n} step(s), all within the warm-up: the figures include "
                        "start-up")
    return used_warm


def _job(parser: LogParser, dataset: str | None, run_dataset: str | None, warnings: list[str]
         ) -> tuple[dict[str, Any], dict[str, Any] | None, str | None]:
    """The step log's header: its metadata, the loader it describes, the dataset (given,
    else the monitor's run.json, else the loader's); a warning where it shows every rank
    reading the whole dataset."""
    meta = getattr(parser, "meta", {}) or {}
    loader = meta.get("loader") if isinstance(meta.get("loader"), dict) else None
    if loader is not None and (whole := whole_dataset_warning(meta, loader)):
        warnings.append(whole)
    if dataset is None:
        dataset = run_dataset or ((loader or {}).get("dataset") or {}).get("root")
    return meta, loader, dataset


def whole_dataset_warning(meta: dict[str, Any], loader: dict[str, Any]) -> str | None:
    """A torch DataLoader that shuffled with torch's RandomSampler (shuffle=True, or one
    given) in a job of several ranks: each rank trained on the whole dataset, in an order
    of its own, unless each rank's dataset was its own share."""
    world = meta.get("world_size")
    if loader.get("sampler") != "RandomSampler" or loader.get("type") != "DataLoader" or \
            type(world) is not int or world < 2:
        return None
    n = (loader.get("dataset") or {}).get("len")
    size = f" ({n:,} samples)" if type(n) is int else ""
    return (f"the loader shuffled with a RandomSampler, not a DistributedSampler, in a job of "
            f"{world} ranks: unless each rank's dataset was its own share, each rank trained "
            f"on the whole dataset{size} every epoch, in an order of its own; pass "
            "sampler=DistributedSampler(dataset) and call its set_epoch(epoch) each epoch")


def _system(metrics: Path | None, window: Any, warnings: list[str]) -> SystemFigures | None:
    """The monitor's figures over the log's window (a warning when not joined by time)."""
    if metrics is None:
        return None
    system = join_metrics(metrics, window)
    if system.joined_by != "time":
        warnings.append(f"metrics joined by {system.joined_by}")
    return system


# Datasets `autotune search DATASET` reads as the job did: an image folder (torchvision's,
# autotune's pipeline) or a conversion through autotune.open_dataset.
SEARCHED_AS_IS = {"ImageFolder", "DatasetFolder", "ImageDataset", "MapDataset", "ShardDataset",
                  "WdsDataset"}


# autotune's own datasets (open_dataset's, the image pipeline's): searched as is only with
# autotune's transforms; a transform of the user's is another job's decode and augment.
OPENED_BY_AUTOTUNE = {"ImageDataset", "MapDataset", "ShardDataset", "WdsDataset"}
AUTOTUNE_MODULES = ("autotune.", "autotune_converters.")


def _job_args(loader: dict[str, Any] | None, procs: int = 1) -> str:
    """What the next `search` needs to measure this job: its ranks on a node (their share
    of the cores bounds each one's workers), and its own Dataset (the step log names its
    class and, for autotune's datasets, its transform): a `--dataset-factory` where the
    class is not one search reads as is, or is one of autotune's with the user's own
    transform; a folder searched through autotune's pipeline would be another job."""
    ranks = f"--procs-per-node {procs}" if procs > 1 else ""
    factory = "--dataset-factory YOUR_FILE.py:FUNCTION" if _why_factory(loader) else ""
    return " ".join(a for a in (factory, ranks) if a)


def _why_factory(loader: dict[str, Any] | None) -> str | None:
    ds = (loader or {}).get("dataset") or {}
    kind, transform = ds.get("type"), ds.get("transform")
    if not isinstance(kind, str):
        return None
    if kind not in SEARCHED_AS_IS:
        return f"the job's Dataset is {kind} (the step log), not an image folder"
    if kind in OPENED_BY_AUTOTUNE and isinstance(transform, str) and \
            not transform.startswith(AUTOTUNE_MODULES):
        return (f"the job's {kind} runs its own transform ({transform[:120]}, the step "
                "log), not a preset's")
    return None


def _factory_note(loader: dict[str, Any] | None) -> list[str]:
    why_factory = _why_factory(loader)
    if not why_factory:
        return []
    return [f"{why_factory}: a next search measures it through --dataset-factory "
            "(FUNCTION(DATASET) returns the dataset as the job opens it), not autotune's "
            "image pipeline"]


def _next_search_notes(verdict: Verdict, loader: dict[str, Any] | None,
                       warm: str | None) -> list[str]:
    """Why the next `search` carries what the job's Dataset asks of it: a factory, --warm
    (`warm`: _verdict's reason)."""
    notes = _factory_note(loader)
    if warm and "autotune search" in verdict.next_command:
        notes.append(warm)
    return notes


def warm_because(loader: dict[str, Any] | None, batch_size: int | None,
                 cores: float | None, procs: int = 1) -> str | None:
    """Why a next `search` of this job's dataset is --warm: its length (the step log's
    loader header) at the job's batch size is too short a cold pass for the search's
    default space on the job's cores (autotune.search.precheck.cold_pass_refused); None
    when it is not, or when the length is not known."""
    n = ((loader or {}).get("dataset") or {}).get("len")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0 or not batch_size:
        return None
    from autotune.search.precheck import cold_pass_refused

    if not cold_pass_refused(n, batch_size, int(cores or 1), procs):
        return None
    ranks = f" on each of its {procs} ranks" if procs > 1 else ""
    return (f"the job's dataset ({n:,} samples, the step log) makes "
            f"{n // max(1, procs) // batch_size:,} whole batches of {batch_size} per "
            f"epoch{ranks}, too few for a cold search to measure most "
            "of its space (each configuration's warm-up and 10 batches, twice its prefetch "
            "queue): the next search measures warm (--warm), as the job's later epochs "
            "read it")


def _cores(meta: dict[str, Any]) -> float | None:
    """The step log header's usable cores (fractional under a CPU quota: 0.5)."""
    c = meta.get("cores")
    return c if isinstance(c, (int, float)) and not isinstance(c, bool) and c > 0 else None


def _format(inp: Inputs, format: str, regex: str | os.PathLike[str] | None) -> str:
    """The log's format: regex with a pattern file, the one asked for, else detected."""
    if regex is not None:
        return "regex"
    if format != "auto":
        return format
    try:
        return detect_format(inp.log)
    except UsageError as e:
        raise _unlogged(inp, e) from None


def _unlogged(inp: Inputs, e: UsageError) -> UsageError:
    """A log with no step timing: where the monitor saw the job fail (often before its
    first step), how and its likely cause first, then `e`; else `e` as it is."""
    said = failed_unlogged(inp.run, inp.run_dir, inp.metrics)
    if said:
        return UsageError(f"{inp.run_dir or inp.log}: {said}. No step timing to analyse (the "
                          f"job may have failed before its first step): {e}")
    spool = Path(inp.log).name.startswith(SPOOL_PREFIX)   # standard input's copy
    steps = step_log_beside(Path(inp.log)) if not spool else None
    return UsageError(f"{inp.log}: no step timing in it, but {steps.parent} holds "
                      f"autotune's step log: `autotune analyze {steps.parent}` reads it ({e})",
                      setting="format") if steps else e


def _no_timing(log: Path, fmt: str, lines: dict[str, Any], parser: LogParser) -> UsageError:
    top = ", ".join(f"{k}: {v}" for k, v in list(lines["skipped_by_reason"].items())[:3])
    hint = f"{parser.no_timing_hint}; or" if parser.no_timing_hint else "; check the format, or"
    return UsageError(f"{log}: no step timing found as format '{fmt}' in "
                      f"{lines['total']:,} lines ({top or 'empty file'}){hint} wrap the loader "
                      "with autotune.instrument(loader)", setting="format")


def _shortest_rank_step(acc: LogPass, step_q: dict[str, float | None]
                        ) -> tuple[dict[str, float | None] | None, str | None]:
    """The shortest rank's step at each step index, where the log holds the same steps of
    two ranks or more, and what it says: a DDP rank's step includes its wait in
    all_reduce for the slowest rank, so the step's own time is the shortest rank's (the
    one that waited longest for its batch). None where no step was logged by two ranks."""
    h = acc.hist_step_shortest
    if len(acc.ranks) < 2 or h.n < MIN_ACROSS:
        return None, None
    q = h.to_dict()
    mine, all_ranks = q.get("p50"), step_q.get("p50")
    note = None
    if mine is not None and all_ranks and mine < 0.9 * all_ranks:
        note = (f"the step's own time is {mine * 1000:,.3g} ms (p50 over {h.n:,} steps of "
                f"the shortest rank's step) against {all_ranks * 1000:,.3g} ms over every "
                f"rank's steps: a DDP rank's step includes waiting in all_reduce for the "
                f"slowest rank, so the next search's --compute-ms is the shorter")
    return q, note


def _ranks(acc: LogPass) -> int:
    """The ranks the log holds: those it names, else as many as its steps repeat."""
    unique = max(1, acc.measured.n + acc.warm.n - acc.repeats)
    return len(acc.ranks) or 1 + round(acc.repeats / unique)


def _from_stdin(kw: dict[str, Any]) -> Analysis:
    """analyze() of standard input: spooled to a file, and named "-" in what it says."""
    with spooled(sys.stdin.buffer) as tmp:
        try:
            a = analyze(tmp, **kw)
        except UsageError as e:
            raise UsageError(str(e).replace(str(tmp), "- (standard input)")) from None
    a.log = STDIN
    return a


def _figures(acc: LogPass, parser: LogParser, fmt: str, batch_size: int | None,
             meta: dict[str, Any], profile: ProfileSummary | None, times: LineTimes | None,
             warnings: list[str]) -> dict[str, Any]:
    """The log's own figures: share, AU, quantiles, images/s, window, trend."""
    m = acc.measured
    bs, bs_src = _batch_size(acc, batch_size, fmt, warnings, meta)
    data_share, au = m.data_share, m.au
    ips = m.images_per_s
    if ips is None and bs is not None and m.iter > 0:
        ips = bs * m.timed_w / m.iter
    step_q, iter_q = acc.hist_step.to_dict(), acc.hist_iter.to_dict()
    steps, batches = m.n, m.w
    if profile is not None:
        steps, batches = profile.data_calls, profile.data_calls
        data_share, au, step_q, iter_q, p_ips = _profile_figures(profile, bs)
        ips = p_ips if p_ips is not None else ips
        warnings.append(profile.note or "the log gives totals only: no p95, no trend")
    window = (m.t_first, m.t_last) if m.t_first is not None and m.t_last is not None else None
    times_from = None
    if window is not None:
        times_from = ("the monitor's line times (" + times.source + ")" if acc.times_used and times
                      else "the log's timestamps")
    if m.n:
        trend_d = trend.findings(acc.epochs, acc.timeline, acc.hist_data, acc.first_epoch,
                                 meta.get("loader"))
    else:
        trend_d = {"findings": ["no trend: the log holds totals only (a profiler table or a "
                                "run summary)"],
                   "by_epoch": [], "epochs_listed": 0, "by_segment": []}
    return {"bs": bs, "bs_src": bs_src, "data_share": data_share, "au": au, "ips": ips,
            "step_q": step_q, "iter_q": iter_q, "data_q": acc.hist_data.to_dict(),
            "steps": steps, "batches": batches, "window": window, "times_from": times_from,
            "trend": trend_d}


def _shares(acc: LogPass, parser: LogParser, share: float | None, profile: ProfileSummary | None,
            warnings: list[str]) -> tuple[float | None, dict[str, Any] | None, dict[str, Any],
                                          dict[str, Any]]:
    """Steady share, epoch starts, what the share is computed from (and the lines' other
    reading), and the confidence of a short excerpt; the warnings they call for (a log
    autotune.instrument() wrote is not told to use it)."""
    m = acc.measured
    steady = acc.steady.data_share if m.n else None
    starts = None
    if acc.starts.n:
        t, st = acc.starts, acc.steady
        starts = {"lines": t.n, "batches": t.w, "data_wait_s": t.data,
                  "mean_wait_s": t.data / t.timed_w if t.timed_w else None,
                  "steady_mean_wait_s": st.data / st.timed_w if st.timed_w else None,
                  "listed": acc.starts_listed}
    share_from: dict[str, Any] = {"figures": parser.figures or None}
    other = acc.other_share() if parser.other_kind else None
    if other is not None:
        share_from.update(other=parser.other_figures, other_share=other)
        if share is not None and min(share, other) > 0 and \
                max(share, other) / min(share, other) > OTHER_APART:
            why = (WHY_APART_RUNNING if parser.other_kind == "running" else WHY_APART_SAMPLE)
            warnings.append(
                f"the share ({share:.0%}) is computed from {parser.figures}; "
                f"{parser.other_figures} give {other:.0%}, "
                f"{max(share, other) / min(share, other):.1f}x apart: {why}")
    conf: dict[str, Any] = {"level": "normal", "note": None}
    if profile is None and 0 < m.n < SHORT_LOG_LINES:
        firmer = ("a longer run gives firmer figures" if parser.name == OWN else
                  "a longer log, or autotune.instrument(loader), gives firmer figures")
        conf = {"level": "low", "note": (
            f"a short excerpt: {m.n} step line(s) standing for {m.w:,} batch(es); the shares "
            f"are estimates that a few slow batches move ({firmer})")}
    if share is None and profile is not None and profile.data_total_s is None:
        share_from["figures"] = "none: the log has no data-loading time"
    return steady, starts, share_from, conf


TOO_LONG = "line too long (over 1 MiB)"
BLANK = "blank line"
DUPLICATE_LINE = "line printed twice (the same as the one before)"
DUPLICATE_STEP = "step printed twice (same epoch, index and figures)"


def _stream(parser: LogParser, path: Path, acc: LogPass, warnings: list[str]
            ) -> tuple[dict[str, Any], list[ProfileSummary]]:
    """One pass over the log: records into `acc`; returns the line counts and any
    aggregate tables. A gzip log cut short is analyzed up to its cut (said in `warnings`)."""
    skipped: dict[str, int] = {}
    total = parsed = 0
    for ln in iter_lines(path, notes=warnings):
        total += 1
        reason = (TOO_LONG if ln.too_long else DUPLICATE_LINE if ln.duplicate
                  else BLANK if not ln.text.strip() else None)
        if reason is None:
            try:
                recs = parser.feed(ln.text, ln.lineno)
            except Skip as e:
                reason = e.reason
            else:
                kept = 0
                for r in recs:
                    if r.rank is None:
                        r.rank = ln.rank      # torchrun's [rankN]: prefix
                    kept += acc.add(r, ln.end_offset, parser.meta)
                if recs and not kept:
                    reason = DUPLICATE_STEP
        if reason is not None:
            skipped[reason] = skipped.get(reason, 0) + 1
        else:
            parsed += 1
    profiles = parser.finish()
    for reason, n in parser.dropped.items():
        key = f"{reason} (piece of a spliced line)"
        skipped[key] = skipped.get(key, 0) + n
    return ({"total": total, "parsed": parsed, "skipped": total - parsed,
             "skipped_by_reason": dict(sorted(skipped.items(), key=lambda kv: -kv[1]))},
            profiles)


def _profile_figures(p: ProfileSummary, bs: int | None) -> tuple[
        float | None, float | None, dict[str, float | None], dict[str, float | None], float | None]:
    """data share, AU, step and iteration "quantiles" (means) and images/s of a profiler
    table: data wait = the dataloader row, wall = data wait + the training-batch row."""
    none: dict[str, float | None] = {"p50": None, "p95": None, "p99": None, "max": None}
    if p.data_total_s is None:
        # A run's closing summary: wall time per step, data included; no share.
        per = p.step_total_s / p.step_calls if p.step_total_s and p.step_calls else None
        ips = p.samples_per_s or (bs * p.step_calls / p.step_total_s
                                  if bs and p.step_calls and p.step_total_s else None)
        return None, None, {**none, "p50": per}, {**none, "p50": per}, ips
    if p.step_total_s is None:
        return None, None, none, none, None
    wall = p.data_total_s + p.step_total_s
    if wall <= 0:
        return None, None, none, none, None
    mean_step = p.step_total_s / p.step_calls if p.step_calls else None
    mean_iter = wall / p.data_calls if p.data_calls else None
    return (p.data_total_s / wall, p.step_total_s / wall, {**none, "p50": mean_step},
            {**none, "p50": mean_iter}, bs * p.data_calls / wall if bs is not None else None)


def _batch_size(acc: LogPass, given: int | None, fmt: str, warnings: list[str],
                meta: dict[str, Any]) -> tuple[int | None, str]:
    if acc.batches:
        # The most frequent size: an epoch's last batch is smaller, and timm's rate x time
        # is off by a rounding here and there.
        common = max(acc.batches, key=lambda b: (acc.batches[b], b))
        src = ("the log (rate x time)" if fmt == "timm" else "the log")
        if given is not None and given != common:
            warnings.append(f"--batch-size {given} differs from the log's {common}: the log's "
                            "is used")
        return common, src
    logged = meta.get("batch_size")
    if isinstance(logged, int) and logged > 0:
        if given is not None and given != logged:
            warnings.append(f"--batch-size {given} differs from the log's {logged}: the log's "
                            "is used")
        return logged, "the log"
    if given is not None:
        return given, "--batch-size"
    return None, "unknown (pass --batch-size for images/s)"
