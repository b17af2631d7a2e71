"""Turning what a measurement left (the child's timings, the monitor's samples, how the
process ended) into a BenchResult: figures, labels, warnings, or a failure with a hint."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from autotune.bench import procs
from autotune.bench.config import MIN_WINDOW_BATCHES, BenchConfig
from autotune.bench.failures import Failure, classify_error, classify_exit
from autotune.bench.result import BenchResult
from autotune.bench.stats import INPUT_BOUND_AU, UNSTEADY_SPREAD, Batch, window_figures
from autotune.blockdev import BlockDevice
from autotune.cpus import cpu_limit
from autotune.data.presets import usable_cores
from autotune.monitor import Sample, SystemMonitor, resolve_disk, summarize
from autotune.monitor.figures import figures_of

_DISK_FIGURES = ("reads_per_s", "read_mib_s", "r_await_ms", "util_pct", "aqu_sz", "rareq_sz_kib")


def _in_window(samples: list[Sample], start: float, end: float) -> list[Sample]:
    return [s for s in samples if start <= s.monotonic - s.interval_s / 2 <= end]


def _proc_rec(s: Sample) -> dict[str, Any] | None:
    d = s.proc.to_dict() if s.proc is not None and hasattr(s.proc, "to_dict") else None
    return d if d and d.get("available") else None


def _system(samples: list[Sample], start: float | None, end: float | None,
            mon: SystemMonitor | None, go: float | None = None) -> tuple[dict[str, Any], list[Sample]]:
    """Monitor summary over the measured window; a window shorter than two samples (a
    cold pass that ended early) widens to the loader's whole run from the cache drop on
    (its start-up excluded), and without a window to the whole run."""
    if start is not None and end is not None and end > start:
        win = _in_window(samples, start, end)
        scope = "measured window"
    else:
        win, scope = samples, "whole run"
    if len(win) < 2 and go is not None and end is not None:
        wider = _in_window(samples, go, end)
        if len(wider) > len(win):
            win, scope = wider, "loader run from the cache drop (the window was under two samples)"
    if not win:
        win, scope = samples, "whole run"
    summ = summarize(win)
    figs = summ["figures"]
    out: dict[str, Any] = {"scope": scope, "samples": summ["samples"],
                           "interval_s": mon.interval if mon else None}
    dev = mon.device if mon is not None else None
    disk = {k: figs[f"disk.{k}"] for k in _DISK_FIGURES if f"disk.{k}" in figs}
    if disk:
        disk["device"] = getattr(dev, "name", None)
        out["disk"] = disk
    else:
        out["disk"] = {"unavailable": summ["unavailable"].get("disk")
                       or getattr(dev, "reason", None) or "no samples"}
    cpu = {k: figs[f"cpu.{k}"] for k in ("total_pct", "iowait_pct", "busiest_core_pct")
           if f"cpu.{k}" in figs}
    per_core: list[list[float]] = []
    for s in win:
        d = s.cpu.to_dict() if hasattr(s.cpu, "to_dict") else {}
        if d.get("available"):
            per_core.append(d["per_core_pct"])
    if per_core:
        n = min(len(p) for p in per_core)
        cpu["per_core_pct_mean"] = [sum(p[i] for p in per_core) / len(per_core) for i in range(n)]
    out["cpu"] = cpu
    gpu = {k: v for k, v in figs.items() if k.startswith("gpu")}
    out["gpu"] = gpu if gpu else {"unavailable": summ["unavailable"].get("gpu", "no GPU samples")}
    shm = [s.shm.to_dict() for s in samples if hasattr(s.shm, "to_dict")]
    shm = [d for d in shm if d.get("available")]
    if shm:
        out["shm"] = {"used_mib_max": max(d["used_bytes"] for d in shm) / 2**20,
                      "total_mib": shm[-1]["total_bytes"] / 2**20}
    procs_n = [r["processes"] for r in map(_proc_rec, samples) if r]
    if procs_n:
        out["processes_max"] = max(procs_n)
    if mon is not None:
        out["monitor_overhead_pct_of_core"] = mon.overhead().get("pct_of_core")
    return out, win


def build_result(cfg: BenchConfig, root: Path, fmt: str, child: dict[str, Any] | None,
                 samples: list[Sample], cache: dict[str, Any], proc: subprocess.Popen | None,
                 timed_out: bool, phase: str, log_tail: str, oom_kills: int,
                 cleanup: procs.Cleanup | None, mon: SystemMonitor | None,
                 parent_marks: dict[str, float], stopped: str | None = None,
                 sections: dict[float, dict[str, Any]] | None = None) -> BenchResult:
    """The BenchResult of what a measurement left: figures, labels and warnings, or a
    failure with its reason and a hint."""
    c = child or {}
    res = BenchResult(
        dataset=c.get("dataset") or {"path": str(root), "format": fmt},
        config={**cfg.to_dict(), "label": cfg.describe()},
        cold=cfg.cold and not cache.get("ram_backed"), cold_method=cache.get("method"),
        cold_reason=(None if cfg.cold and not cache.get("ram_backed") else
                     cache.get("ram_backed") or ("from memory" if cfg.in_memory else
                                                 "warm: the page cache was left as it was")),
        cache=cache,
        environment={"cores": usable_cores(), "cpu_count": os.cpu_count(),
                     "torch": c.get("torch"), "cuda": c.get("cuda"),
                     "python": platform.python_version(), "kernel": platform.release(),
                     "root": os.geteuid() == 0})
    res.process = {"pid": proc.pid if proc else None,
                   "returncode": proc.returncode if proc else None,
                   "timed_out": timed_out, "nofile_limit": c.get("nofile_limit"),
                   **(cleanup.to_dict() if cleanup else {})}
    if cleanup and cleanup.stray:
        res.warnings.append(f"{len(cleanup.stray)} process(es) of the measurement were still "
                            f"running after SIGKILL: pids {cleanup.stray}")
    _label(res, cfg, c, cache)
    marks = c.get("marks", {})
    res.system, win = _system(samples, marks.get("window_start"), marks.get("window_end"), mon,
                              go=parent_marks.get("go"))
    _process_figures(res, samples, win)
    # What the verdict engine reads (autotune.verdict), from this window's samples: the
    # CPU quota's throttling among them, summed over the window as the monitor's is.
    res.system["figures"] = figures_of(
        (_record(s, sections) for s in win), source="bench monitor",
        joined_by=res.system.get("scope", "measured window")).to_dict()
    failure = _failure(cfg, child, res.system, proc, timed_out, phase, log_tail, oom_kills,
                       stopped)
    if failure is not None:
        res.failed = True
        res.failure_kind, res.reason, res.hint = failure.kind, failure.reason, failure.hint
        res.process["log_tail"] = log_tail[-2000:]
        res.process["phase"] = (phase if timed_out or child is None
                                else (c.get("error") or {}).get("phase"))
        return res
    assert child is not None
    _figures(res, cfg, child, parent_marks)
    if child.get("ranks"):
        _rank_figures(res, cfg, child["ranks"])
    _check_cache(res, cfg, child, root, win)
    few = _too_few(cfg, res.window)
    if few is not None:  # figures kept for the record, but not a measurement
        res.failed = True
        res.failure_kind, res.reason, res.hint = few.kind, few.reason, few.hint
    return res


def _too_few(cfg: BenchConfig, window: dict[str, Any]) -> Failure | None:
    """A window of fewer batches than cfg.min_batches is not a measurement: it never
    wins, overtakes a ceiling, stops a search or counts in a gain."""
    n, need = window.get("batches") or 0, cfg.min_batches
    if n >= need:
        return None
    why = (f"at least {need} ({MIN_WINDOW_BATCHES}, and twice the prefetch queue of "
           f"{cfg.prefetch_queue} batches)" if need > MIN_WINDOW_BATCHES
           else f"at least {MIN_WINDOW_BATCHES}")
    end = (" before the end of the first cold pass over the dataset"
           if window.get("shortened") else "")
    hint = ("use a longer --seconds, a smaller --batch-size, fewer workers or a lower "
            "prefetch_factor, a larger dataset, or --warm (later passes labelled warm)")
    secs = window.get("seconds") or 0.0
    if n and not window.get("shortened") and secs > 0:
        # The window ran out of time: at the pace measured (a real step's time is known
        # only now), the warm-up and the batches a figure needs take this long.
        per = secs / n
        hint = (f"give --seconds {math.ceil((cfg.effective_warmup + need) * per)} or more "
                f"({cfg.effective_warmup} warm-up + {need} batches at the {per:.3g} s per "
                f"batch measured); or {hint}")
    return Failure("too_few_batches",
                   f"only {n} batches were measured{end} ({window.get('samples')} samples in "
                   f"{secs:.1f} s); a figure needs {why}: this is not a measurement", hint)


# What was read beside a monitor sample, in its record's order: the run queue's figures,
# the task sampler's budget of the interval, the CPU quota's throttling in it.
SECTIONS = ("sched", "budget", "cpu_quota")


def _record(s: Sample, sections: dict[float, dict[str, Any]] | None) -> dict[str, Any]:
    d = s.to_dict()
    got = (sections or {}).get(s.monotonic, {})
    d.update((k, got[k]) for k in SECTIONS if k in got)
    return d


def _label(res: BenchResult, cfg: BenchConfig, child: dict[str, Any],
           cache: dict[str, Any]) -> None:
    """Labels that hold whatever the outcome (pin without CUDA, draft, warm, memory)."""
    warnings = res.warnings
    if cfg.pin_memory and child.get("cuda") is False:
        warnings.append(f"pin_memory=True has no effect here: no CUDA device (torch "
                        f"{child.get('torch')}); this figure is what pin_memory=False "
                        "gives. Its cost or benefit shows only on a GPU machine.")
    if cfg.transform.draft:
        warnings.append("JPEG draft decoding is ON (libjpeg decodes at reduced scale): the "
                        "decode cost differs from torchvision's pipeline.")
    # Whole cores for the sums; the fractional figure under a quota (1.5 usable), as every
    # header says it, for the words (one reading of the cgroup for both).
    lim = cpu_limit()
    cores, said = lim.whole, f"{round(lim.cores, 3):g}"
    for w in child.get("warnings", []):
        if "pin_memory" in w or "worker processes in total" in w:
            continue  # said above / below in our own words
        warnings.append(f"torch: {w}")
    per_node = cfg.num_workers * cfg.procs_per_node
    if per_node > cores:
        warnings.append(f"{cfg.num_workers} workers x {cfg.procs_per_node} rank(s) on {said} "
                        "usable cores: more workers than cores only pay off while workers wait "
                        "on storage, not on decoding." if cfg.procs_per_node > 1 else
                        f"{cfg.num_workers} workers on {said} usable cores: more workers than "
                        "cores only pay off while workers wait on storage, not on decoding.")
    if cfg.procs_per_node > cores:
        warnings.append(f"{cfg.procs_per_node} ranks on {said} usable cores: more ranks than "
                        "cores share them (allowed; the figures say what that costs).")
    if cfg.in_memory:
        info = child.get("dataset") or {}
        mib = (info.get("in_memory_bytes") or 0) / 2**20
        warnings.append(f"FROM MEMORY: {info.get('images', cfg.in_memory)} images ({mib:,.0f} "
                        "MiB) held in the measurement process; storage and the page cache play "
                        "no part: this is the CPU (decode) ceiling, not a training figure.")
    elif not cfg.cold:
        frac = cache.get("resident_fraction_at_start")
        warnings.append("WARM: the page cache was not dropped"
                        + (f" ({frac:.0%} of a sample of the dataset's pages were cached at "
                           "start)" if frac is not None else "")
                        + "; this is not what a first epoch from storage gives.")
    if cache.get("ram_backed") and cfg.cold:
        warnings.append(f"NOT COLD: {cache['ram_backed']}; this figure is what RAM gives, not "
                        "a first epoch from storage (stage to a real disk to measure cold).")
    frac = cache.get("resident_fraction_after_evict")
    if frac is not None and frac > 0.05:
        warnings.append(f"cold by fadvise, but {frac:.0%} of the sampled pages stayed cached "
                        "(mapped or dirty elsewhere): the figure may be partly warm; run as root "
                        "for drop_caches.")


def _process_figures(res: BenchResult, samples: list[Sample], win: list[Sample]) -> None:
    """Peak RSS and PSS of the tree (whole run) and its CPU (the window, weighted by
    interval). The peak PSS only where every sample read it."""
    recs = [r for r in map(_proc_rec, samples) if r]
    rss = [r["rss_bytes"] for r in recs]
    res.peak_rss_mib = max(rss) / 2**20 if rss else None
    pss = [r.get("pss_bytes") for r in recs]
    res.peak_pss_mib = (max(pss) / 2**20 if pss and all(p is not None for p in pss)  # type: ignore[type-var]
                        else None)
    pct = [(r["cpu_pct"], s.interval_s) for s, r in ((s, _proc_rec(s)) for s in win) if r]
    if pct and sum(w for _, w in pct) > 0:
        res.cpu_percent = sum(c * w for c, w in pct) / sum(w for _, w in pct)


def _failure(cfg: BenchConfig, child: dict[str, Any] | None, system: dict[str, Any],
             proc: subprocess.Popen | None, timed_out: bool, phase: str, log_tail: str,
             oom_kills: int, stopped: str | None) -> Failure | None:
    """Why the measurement gave no figure, or None."""
    shm = system.get("shm", {})
    ctx = {"nofile_limit": (child or {}).get("nofile_limit"),
           "max_open_files": cfg.max_open_files, "step": cfg.step,
           "factory": cfg.dataset_factory,
           "shm_used_bytes": (shm.get("used_mib_max") or 0) * 2**20 or None,
           "shm_total_bytes": (shm.get("total_mib") or 0) * 2**20 or None,
           "log_tail": log_tail}
    if stopped:
        return Failure("pruned", stopped, "not an error: the search stopped a configuration "
                                          "that was clearly slower than the best so far")
    if child is None:
        return classify_exit(proc.returncode if proc else None, timed_out=timed_out,
                             timeout_s=cfg.effective_timeout, phase=phase, log_tail=log_tail,
                             oom_kills=oom_kills, ctx=ctx)
    if not child.get("ok"):
        return classify_error(child.get("error") or {}, ctx)
    if not child.get("batches"):
        return Failure(
            "no_batches",
            f"nothing was measured: one pass over {child.get('images')} images is "
            f"{child.get('epoch_batches')} batches of {cfg.batch_size}, and the warm-up took "
            f"{child.get('warmup_done', 0)} of them; a cold run stops at the end of the first "
            "pass",
            "use a larger dataset, a smaller --batch-size, fewer --warmup-batches, or --warm "
            "(labelled warm)")
    return None


def _figures(res: BenchResult, cfg: BenchConfig, child: dict[str, Any],
             parent_marks: dict[str, float]) -> None:
    """images/s, data wait, AU, per-batch times and the window of a measurement."""
    marks = child["marks"]
    f = window_figures([Batch(*b) for b in child["batches"]], marks["window_start"], cfg.windows)
    res.images_per_s = f.images_per_s
    res.images_per_s_overall = f.images_per_s_overall
    res.images_per_s_spread = {"min": min(f.window_rates), "max": max(f.window_rates),
                               "median": f.images_per_s_median, "relative": f.spread,
                               "windows": f.window_rates}
    res.data_wait_fraction = f.data_wait_fraction
    if cfg.has_step:
        res.au = f.step_fraction
        res.input_bound = f.step_fraction < INPUT_BOUND_AU
    res.batch_wait_ms = {"p50": f.wait_ms_p50, "p95": f.wait_ms_p95, "max": f.wait_ms_max}
    res.step_ms = ({"p50": f.step_ms_p50, "p95": f.step_ms_p95} if cfg.has_step else None)
    res.stages = child.get("stages")
    res.window = {
        "seconds": f.wall_s, "requested_seconds": cfg.seconds, "batches": f.batches,
        "samples": f.samples, "windows": len(f.window_rates),
        "stop_reason": child.get("stop_reason"),
        "extended_s": child.get("extended_s"),
        "shortened": child.get("stop_reason") == "epoch_end",
        "epochs": child.get("epochs"), "epoch_batches": child.get("epoch_batches"),
        "warmup_batches": child.get("warmup_done"),
        "warmup_s": marks["window_start"] - marks.get("loader_started", marks["window_start"]),
        "first_batch_s": (marks["first_batch"] - marks["loader_started"]
                          if "first_batch" in marks and "loader_started" in marks else None),
        "startup_s": (marks["ready"] - parent_marks["spawn"]
                      if "ready" in marks and "spawn" in parent_marks else None),
        "scan_s": (marks["scanned"] - marks["go"]) if "scanned" in marks and "go" in marks else None,
    }
    res.warnings.extend(_window_warnings(cfg, child, f,
                                         "://" in str((res.dataset or {}).get("path", ""))))


def _rank_figures(res: BenchResult, cfg: BenchConfig, ranks: list[dict[str, Any]]) -> None:
    """Each rank's figures, and the node's: every DDP step waits for the slowest rank, so
    the node delivers ranks x the slowest rank's images/s (the sum is shown beside it)."""
    per = []
    for rk in ranks:
        m = rk.get("marks") or {}
        if not rk.get("batches") or "window_start" not in m:
            continue
        f = window_figures([Batch(*b) for b in rk["batches"]], m["window_start"], cfg.windows)
        per.append({"rank": rk["rank"], "images_per_s": f.images_per_s,
                    "au": f.step_fraction if cfg.has_step else None,
                    "data_wait_fraction": f.data_wait_fraction, "batches": f.batches,
                    "seconds": f.wall_s})
    if not per:
        return
    slow = min(per, key=lambda r: r["images_per_s"])
    res.per_rank = per
    res.images_per_s = len(per) * slow["images_per_s"]
    res.images_per_s_sum = sum(r["images_per_s"] for r in per)
    res.data_wait_fraction = slow["data_wait_fraction"]
    if cfg.has_step:
        res.au = slow["au"]
        res.input_bound = slow["au"] < INPUT_BOUND_AU
    res.window["batches"] = min(r["batches"] for r in per)
    res.window["ranks"] = len(per)
    if len(per) < cfg.procs_per_node:
        res.warnings.append(f"only {len(per)} of {cfg.procs_per_node} ranks measured a window")


def _window_warnings(cfg: BenchConfig, child: dict[str, Any], f: Any,
                     remote: bool = False) -> list[str]:
    """What makes the window's figure rough: shortened, warm passes, unsteady sub-windows
    (too few batches is a failure: see _too_few). `remote`: an object store's dataset,
    which no page cache holds."""
    out = []
    if child.get("stop_reason") == "epoch_end":
        out.append(
            f"window shortened: cold, so the measurement stopped at the end of the first pass "
            f"over the dataset after {f.wall_s:.1f} s of the requested {cfg.seconds:g} s "
            f"({f.batches} batches); "
            + ("a cold window is one pass (an object store's second would be read from it "
               "again, with its objects' and connections' state warm)" if remote else
               "a second pass would be served from the page cache")
            + ". Use a larger dataset for a longer cold window.")
    if not cfg.cold and (child.get("epochs") or 1) > 1:
        out.append(f"WARM: the window spanned {child.get('epochs')} passes over the dataset.")
    if len(f.window_rates) > 1 and f.spread > UNSTEADY_SPREAD:
        out.append(f"unsteady: images/s varied {f.spread:.0%} between the "
                   f"{len(f.window_rates)} windows ({min(f.window_rates):,.0f}-"
                   f"{max(f.window_rates):,.0f}); a longer --seconds gives a steadier figure.")
    return out


def _check_cache(res: BenchResult, cfg: BenchConfig, child: dict[str, Any], root: Path,
                 win: list[Sample]) -> None:
    """Where the window's bytes came from, from the kernel's per-process I/O counters of
    the measurement's own processes (other processes' disk traffic cannot blur it).

    Cold: the dataset must come from storage; a low storage fraction means a cache the
    drop did not reach served it, and the cold figure is too good. Warm: a high one means
    the pages were evicted during the run (memory pressure, another process dropping
    caches), and the figure is not the warm one it claims to be. Only judged on a local
    block device (FUSE and network filesystems read through another process).
    """
    disk = [s.disk.to_dict() for s in win if s.disk is not None and hasattr(s.disk, "to_dict")]
    disk = [d for d in disk if d.get("available")]
    if disk:
        res.system["disk_reads_in_window"] = sum(d["reads_per_s"] * d["interval_s"] for d in disk)
    io = child.get("window_io")
    if not io or io["read_chars"] < 2**18:
        return
    res.window["read_mib"] = io["read_chars"] / 2**20
    if not isinstance(resolve_disk(root), BlockDevice):
        # FUSE / network reads are served by another process (or the network client) and
        # never show in these counters: no figure rather than a false "0 % from storage".
        res.window["storage_read_fraction"] = None
        return
    frac = min(1.0, io["read_bytes"] / io["read_chars"])
    res.window["storage_read_mib"] = io["read_bytes"] / 2**20
    res.window["storage_read_fraction"] = frac
    res.window["major_faults"] = io.get("major_faults")
    extra = io["read_bytes"] - io["read_chars"]
    if extra > max(4 * 2**20, 0.5 * io["read_chars"]):
        res.warnings.append(
            f"the measurement's processes read {extra / 2**20:,.0f} MiB from storage beyond the "
            f"dataset bytes they read ({io.get('major_faults', 0):,} major page faults): library "
            "code or memory paged out by the kernel (memory pressure, or proactive reclaim such "
            "as DAMON) was read back during the window, and the figure includes that stall.")
    if cfg.cold and frac < 0.5:
        res.warnings.append(
            f"cold run, but only {frac:.0%} of the {io['read_chars'] / 2**20:,.0f} MiB read in "
            "the window came from storage: the rest was cached where the drop did not reach, "
            "so this cold figure may be too good.")
    if not cfg.cold and frac > 0.5:
        res.warnings.append(
            f"WARM run, but {frac:.0%} of the {io['read_chars'] / 2**20:,.0f} MiB read in the "
            "window came from storage: the dataset's pages were evicted (memory pressure, or "
            "another process dropping caches); this is not a warm figure.")


def _phase_of(t: float, marks: dict[str, float]) -> str:
    if "go" in marks and t < marks["go"]:
        return "startup"
    if "loader_started" in marks and t < marks["loader_started"]:
        return "scan"
    if "window_start" in marks and t < marks["window_start"]:
        return "warmup"
    if "window_end" in marks and t <= marks["window_end"] + 1e-3:
        return "measure"
    if "window_end" in marks:
        return "shutdown"
    return "run"


def write_timeline(path: str | os.PathLike[str], samples: list[Sample],
                   child: dict[str, Any] | None, parent_marks: dict[str, float],
                   sections: dict[float, dict[str, Any]] | None = None) -> None:
    marks = dict((child or {}).get("marks", {}))
    marks.setdefault("go", parent_marks.get("go", float("inf")))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for s in samples:
            d = _record(s, sections)
            d["phase"] = _phase_of(s.monotonic - s.interval_s / 2, marks)
            f.write(json.dumps(d) + "\n")
