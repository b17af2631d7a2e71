"""Joining the steps with what the system did meanwhile (the monitor's metrics.jsonl).

The metrics file is read as a stream; only the samples inside the window of the measured
steps are kept (a sample covers [time - interval_s, time]). When the log has no times,
the whole run's samples are used and the figures say so.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from autotune.analyze.reader import bounded_lines
from autotune.errors import UsageError
from autotune.monitor.figures import (FIGURES, SystemFigures, collect, finish,  # noqa: F401
                                      finite_number, whole_number)


def join_metrics(path: str | os.PathLike[str],
                 window: tuple[float, float] | None) -> SystemFigures:
    """Figures of the samples in `window` (epoch seconds), or of all when window is None.

    Raises UsageError when the file cannot be read; bad lines are counted.
    """
    p = Path(path)
    series: dict[str, list[float]] = {k: [] for k in FIGURES}
    unavailable: dict[str, str] = {}
    info: dict[str, Any] = {}
    total = kept = bad = 0
    interval_max = 0.0
    peaks: dict[str, Any] = {"shm": None, "files": None, "memory": None}   # every sample's
    # Every sample's figures until one falls in the window: used when none does (summed
    # as they come, as the window's are: a day's records held whole took a gigabyte).
    early: tuple[dict[str, list[float]], dict[str, str], dict[str, Any]] = (
        {k: [] for k in FIGURES}, {}, {})
    n_early = 0
    try:
        f = p.open("rb")
    except OSError as e:
        raise UsageError(f"metrics file {p}: {e.strerror}; give the metrics.jsonl that "
                         "`autotune monitor` wrote", setting="metrics") from e
    with f:
        for raw in bounded_lines(f):
            try:
                if raw is None:   # over MAX_LINE: never held whole, never parsed
                    raise ValueError("line too long")
                rec = json.loads(raw)
                t = float(rec["time"])
                dt = float(rec.get("interval_s") or 0.0)
            except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
                bad += 1
                continue
            total += 1
            interval_max = max(interval_max, dt)
            _peaks(peaks, rec, t)
            if window is not None:
                lo, hi = window
                overlap = min(hi, t) - max(lo, t - dt)
                if overlap < 0.5 * dt or overlap <= 0:
                    if not kept:
                        n_early += 1
                        collect(rec, *early)
                    continue
            kept += 1
            collect(rec, series, unavailable, info)
    if total == 0:
        raise UsageError(f"metrics file {p}: no monitor sample in it ({bad} unreadable line(s)); "
                         "give the metrics.jsonl that `autotune monitor` wrote", setting="metrics")
    joined_by = "time"
    if window is None:
        joined_by = "whole run (the log has no times)"
    elif kept == 0:
        joined_by = "whole run (no sample falls within the steps' times: clocks differ?)"
        (series, unavailable, info), kept = early, n_early
    return finish(series, unavailable, info, source=str(p), joined_by=joined_by,
                  samples=kept, samples_total=total, bad_lines=bad, window=window,
                  shm_peak=peaks["shm"], files_peak=peaks["files"],
                  memory_peak=peaks["memory"])


def _peaks(peaks: dict[str, Any], rec: dict[str, Any], t: float) -> None:
    """/dev/shm at its fullest, the open-files limit at its nearest and the memory
    cgroup's working set at its fullest, `rec` counted."""
    peaks["shm"] = _fuller(peaks["shm"], rec.get("shm"), t)
    peaks["files"] = _nearer_limit(peaks["files"], rec.get("proc"), t)
    peaks["memory"] = _fuller_memory(peaks["memory"], rec.get("memcg"), t)


def _fuller_memory(peak: dict[str, Any] | None, mem: Any, t: float) -> dict[str, Any] | None:
    """The fuller of `peak` and a sample's memory-cgroup section (by its working set's
    share of the limit), with the most OOM kills any sample counted."""
    if not isinstance(mem, dict):
        return peak
    ws, lim = finite_number(mem.get("working_set_bytes")), finite_number(mem.get("limit_bytes"))
    if ws is None or lim is None or lim <= 0 or ws < 0:
        return peak
    kills = max(whole_number(mem.get("oom_kills")) or 0, (peak or {}).get("oom_kills") or 0)
    if peak is None or ws / lim > peak["working_set_bytes"] / peak["limit_bytes"]:
        file = mem.get("limit_file")
        return {"working_set_bytes": ws, "limit_bytes": lim, "time": t,
                "limit_file": file[:300] if isinstance(file, str) else None,
                "oom_kills": kills}
    # A new dict only where the count grew: a day's samples each copied it before.
    return peak if kills == peak["oom_kills"] else {**peak, "oom_kills": kills}


def _nearer_limit(peak: dict[str, Any] | None, proc: Any, t: float) -> dict[str, Any] | None:
    """The nearer to its open-files limit of `peak` and a sample's process-tree section
    (by the share of the soft limit its busiest process held). "hard" is there only where
    the sample gave it: null, unlimited; a number; absent, not known."""
    if not isinstance(proc, dict):
        return peak
    n, lim = whole_number(proc.get("open_files")), whole_number(proc.get("open_files_limit"))
    if n is None or not lim:
        return peak
    if peak is None or n / lim > peak["open"] / peak["limit"]:
        pid = whole_number(proc.get("open_files_pid"))
        out = {"open": n, "limit": lim, "pid": pid,
               "root": pid is not None and pid == proc.get("root_pid"), "time": t}
        hard = proc.get("open_files_hard", False)
        if hard is None or whole_number(hard):
            out["hard"] = hard
        return out
    return peak


def _fuller(peak: dict[str, float] | None, shm: Any, t: float) -> dict[str, float] | None:
    """The fuller of `peak` and a sample's /dev/shm section (by the share used)."""
    if not isinstance(shm, dict):
        return peak
    used, total = finite_number(shm.get("used_bytes")), finite_number(shm.get("total_bytes"))
    if used is None or total is None or total <= 0 or used < 0:
        return peak
    if peak is None or used / total > peak["used_bytes"] / peak["total_bytes"]:
        return {"used_bytes": used, "total_bytes": total, "time": t}
    return peak
