"""What the monitor's run.json says about the run a log comes from, beside the verdict:

* how the job ended: a job that failed (an exit status other than 0, or a signal the user
  did not send) is said, with its status, since the verdict then describes only the steps
  logged before it; a stop the user asked for (Ctrl-C: status 130 or SIGINT, or a signal
  the monitor forwarded) is not a failure and is not said;
* for a failed job, whether /dev/shm was the likely cause: its log's last lines name a
  /dev/shm failure, or the monitor saw /dev/shm nearly full; or the open-files limit: its
  log's last lines name it (EMFILE, "received 0 items of ancdata"), or the monitor saw one
  of its processes near its limit; for one that ended well, that either was seen nearly
  full, with little room left for more workers or larger batches;
* which disk the monitor watched and why: without --data it watched the disk of the
  directory it ran in, which may not hold the dataset.

`run_facts` returns the JSON's `run` section and the warnings; the CLI prints them.
"""

from __future__ import annotations

import re
import shlex
import signal
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError
from autotune.bench.failures import SHM_HINT, files_failure_line, files_hint, shm_failure_line
from autotune.monitor.figures import SystemFigures, whole_number
from autotune.monitor.run import signal_name
from autotune.verdict.rules._case import failed_in_start_up

# /dev/shm this full at a sample counts as nearly full: samples are --interval apart and a
# batch handed over between two (tens of MiB) fills the rest, so a job that died of a full
# /dev/shm is seldom sampled at 100 %.
SHM_NEARLY_FULL = 0.75
# As near the open-files limit, for the same reason: one batch's tensors (a hundred files
# or more) arrive between two samples, and a process at the limit drops or fails at once.
FILES_NEARLY_FULL = 0.75
# The memory cgroup's working set this near its limit at a sample: the OOM killer acts at
# the limit itself, and a sample every --interval misses the last allocations before it.
MEMORY_NEARLY_FULL = 0.90
MEMORY_HINT = ("use less memory: fewer DataLoader workers or a lower prefetch_factor (each "
               "worker holds its own copy of what it touches of the dataset), a smaller batch, "
               "or a higher memory limit (docker run --memory, a Kubernetes pod's "
               "resources.limits.memory); autotune.DataLoader counts each worker's own memory "
               "against half of what the job has left, and where the limit is reached it is "
               "a worker that goes and the loader carries on with fewer")
# torch's line for a worker the OOM killer (or anyone) ended with SIGKILL.
_WORKER_KILLED = re.compile(r"DataLoader worker \(pid \d+\) is killed by signal: Killed\.?")
LOG_TAIL_BYTES = 256 * 1024    # the job's last output, where a failure is printed
USER_STOPS = ("SIGINT", "SIGTERM")


def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def outcome(run: dict[str, Any]) -> tuple[str, str]:
    """("ok" | "stopped" | "failed" | "unknown", the status in words) of a run.json."""
    rc, sig = _int(run.get("returncode")), _int(run.get("signal"))
    forwarded = [f for f in run.get("forwarded_signals") or [] if f in USER_STOPS]
    if rc is None:
        return "unknown", "no exit status in run.json"
    status = (f"killed by {signal_name(sig)} (status {rc})" if sig is not None
              else f"exit status {rc}")
    if rc == 0:
        return "ok", status
    # A SIGTERM the job got straight (a scheduler signals the job's processes, not only
    # the monitor) is a stop as much as one the monitor forwarded.
    if rc in (128 + signal.SIGINT, 128 + signal.SIGTERM) or sig in (signal.SIGINT,
                                                                    signal.SIGTERM) or forwarded:
        return "stopped", status + (f" after {', '.join(forwarded)} was forwarded"
                                    if forwarded else "")
    return "failed", status


def _after(secs: Any) -> str:
    """" after N s" for run.json's seconds (a stranger's file: a figure a float can hold)."""
    ok = isinstance(secs, (int, float)) and not isinstance(secs, bool) and 0 <= secs < 1e12
    return f" after {secs:,.1f} s" if ok else ""


def _log_tail(path: Path) -> str:
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - LOG_TAIL_BYTES))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f}"


def shm_cause(log: Path | None, system: SystemFigures | None,
              tail: str) -> dict[str, Any] | None:
    """Why /dev/shm is the likely cause of a failed job (its log's line in `tail`, the log's
    last output; its peak), or None."""
    line = shm_failure_line(tail) if log is not None else None
    peak = system.shm_peak if system is not None else None
    share = peak["used_bytes"] / peak["total_bytes"] if peak else None
    full = share is not None and share >= SHM_NEARLY_FULL
    if line is None and not full:
        return None
    said = []
    if line is not None:
        said.append(f"{log.name if log else 'the log'} says {line[:200]!r}")
    if peak is not None and share is not None:
        said.append(f"{Path(system.source).name if system else 'the metrics'}: /dev/shm at "
                    f"{_mib(peak['used_bytes'])} of {_mib(peak['total_bytes'])} MiB "
                    f"({share:.0%}) at its fullest")
    return {"log_line": line, "peak_used_bytes": peak["used_bytes"] if peak else None,
            "total_bytes": peak["total_bytes"] if peak else None, "peak_share": share,
            "nearly_full": full, "evidence": "; ".join(said), "fix": SHM_HINT,
            # Little but a loader's batches fills /dev/shm: seen full, it is the likely one.
            "seen_is_likely": True}


def _files_share(system: SystemFigures | None) -> tuple[dict[str, Any] | None, float | None]:
    peak = system.files_peak if system is not None else None
    return peak, (peak["open"] / peak["limit"] if peak and peak.get("limit") else None)


def _files_seen(peak: dict[str, Any], share: float, system: SystemFigures | None) -> str:
    who = "the command's process" if peak.get("root") else "one of the job's processes"
    pid = f" (pid {peak['pid']})" if peak.get("pid") is not None else ""
    return (f"{Path(system.source).name if system else 'the metrics'}: {who}{pid} held "
            f"{peak['open']:,} open files of its limit of "
            f"{peak['limit']:,} ({share:.0%}) at the sample nearest it")


def _job_fix(peak: dict[str, Any] | None) -> str:
    """The fix, with the job's own soft and hard limits where the monitor read them."""
    known = peak is not None and "hard" in peak
    return files_hint(here=False, job=(peak["limit"], peak["hard"]) if known else None)


def files_cause(log: Path | None, system: SystemFigures | None,
                tail: str) -> dict[str, Any] | None:
    """Why the open-files limit is the likely cause of a failed job (its log's line in
    `tail`; the monitor's sample nearest the limit), or None."""
    line = files_failure_line(tail) if log is not None else None
    peak, share = _files_share(system)
    near = share is not None and share >= FILES_NEARLY_FULL
    if line is None and not near:
        return None
    said = [f"{log.name if log else 'the log'} says {line[:200]!r}"] if line else []
    if peak is not None and share is not None:
        said.append(_files_seen(peak, share, system))
    return {"log_line": line, "peak_open": peak["open"] if peak else None,
            "limit": peak["limit"] if peak else None, "peak_share": share,
            "nearly_full": near, "evidence": "; ".join(said), "fix": _job_fix(peak)}


def _memory_share(system: SystemFigures | None) -> tuple[dict[str, Any] | None, float | None]:
    peak = system.memory_peak if system is not None else None
    return peak, (peak["working_set_bytes"] / peak["limit_bytes"] if peak else None)


def memory_cause(run: dict[str, Any], system: SystemFigures | None,
                 tail: str) -> dict[str, Any] | None:
    """Why the memory limit is the cause of a failed job, or None: the kernel counted OOM
    kills in its cgroup while it ran (run.json's `memory`, else the samples'), or it was
    killed by SIGKILL (torch's line for a worker, or its own status) with its working set
    seen near the limit. Kills count as the likely cause ("counted") only where a kill
    ended the job or a worker its log names: autotune.DataLoader carries on past a worker
    the OOM killer took, and another process of a shared cgroup may be the one killed, so
    a job that failed later of another error only may have failed of it."""
    mem = run.get("memory") if isinstance(run.get("memory"), dict) else {}
    peak, share = _memory_share(system)
    kills = whole_number(mem.get("oom_kills"))
    kills = max(kills or 0, (peak or {}).get("oom_kills") or 0)
    line = m.group(0) if (m := _WORKER_KILLED.search(tail)) else None
    near = share is not None and share >= MEMORY_NEARLY_FULL
    killed = (_int(run.get("signal")) == signal.SIGKILL
              or _int(run.get("returncode")) == 128 + signal.SIGKILL)
    if not kills and not (near and (line or killed)):
        return None
    limit = whole_number(mem.get("limit_bytes"), 2**62) or (peak or {}).get("limit_bytes")
    said = []
    if kills:
        said.append(f"the kernel's OOM killer ended {kills} process(es) in the job's memory "
                    f"cgroup" + (f" (limit {_mib(limit)} MiB)" if limit else ""))
    if line:
        said.append(f"the log says {line!r}")
    if peak is not None and share is not None:
        said.append(f"{Path(system.source).name if system else 'the metrics'}: its working "
                    f"set at {_mib(peak['working_set_bytes'])} of {_mib(peak['limit_bytes'])} "
                    f"MiB ({share:.0%}) at its fullest sample")
    return {"log_line": line, "oom_kills": kills, "counted": bool(kills) and bool(line or killed),
            "job_killed": killed, "limit_bytes": limit,
            "limit_file": mem.get("limit_file") or (peak or {}).get("limit_file"),
            "peak_working_set_bytes": peak["working_set_bytes"] if peak else None,
            "peak_share": share, "nearly_full": near, "evidence": "; ".join(said),
            "fix": MEMORY_HINT}


def memory_room(system: SystemFigures | None) -> str | None:
    """A job that did not fail but whose memory cgroup was seen near its limit (None when
    it had room)."""
    peak, share = _memory_share(system)
    if peak is None or share is None or share < MEMORY_NEARLY_FULL:
        return None
    return (f"the job's memory cgroup was {share:.0%} full at its fullest sample "
            f"({_mib(peak['working_set_bytes'])} of {_mib(peak['limit_bytes'])} MiB, its "
            "working set): the job fits with little room; more workers, a deeper prefetch or "
            "a larger batch may bring the OOM killer. To make room: " + MEMORY_HINT)


def files_room(system: SystemFigures | None) -> str | None:
    """A job that did not fail but was seen near its open-files limit: more workers, a
    deeper prefetch or a batch of more tensors may hang it (None when it had room)."""
    peak, share = _files_share(system)
    if peak is None or share is None or share < FILES_NEARLY_FULL:
        return None
    return (f"{_files_seen(peak, share, system)}: the job fits with little room; more "
            "workers, a deeper prefetch or a batch of more tensors may stop an epoch (a "
            "worker's batch dropped on 'Too many open files') or fail with 'received 0 "
            f"items of ancdata'. Fix: {_job_fix(peak)}")


def _one_cause(causes: dict[str, dict[str, Any] | None], tail: str
               ) -> dict[str, dict[str, Any] | None]:
    """A failure has one likely cause: OOM kills the kernel counted over anything else, a
    limit its log names over one only seen nearly full (batches in flight fill /dev/shm,
    open files and memory alike), of two lines in the log the later, the one that ended
    the job, and of those only seen nearly full, the fuller."""
    named = {k: c for k, c in causes.items() if c is not None}
    if len(named) < 2:
        return causes

    def rank(c: dict[str, Any]) -> tuple[bool, bool, int, float]:
        line = c.get("log_line")
        return (bool(c.get("counted")), bool(line), tail.rfind(line) if line else -1,
                c.get("peak_share") or 0.0)
    best = max(named, key=lambda k: rank(named[k]))
    return {k: (c if k == best else None) for k, c in causes.items()}


def failed_unlogged(run: dict[str, Any] | None, run_dir: Path | None,
                    metrics: Path | None) -> str | None:
    """A monitored job that failed before it logged a step (nothing for the verdict to
    read, as a job that dies on its first batch does): how it ended and its likely cause,
    in a line; None where it did not fail."""
    kind, status = outcome(run) if run is not None else ("", "")
    if run is None or kind != "failed":
        return None
    system = None
    if metrics is not None:
        from autotune.analyze.join import join_metrics

        try:
            system = join_metrics(metrics, None)
        except AutotuneError:
            pass   # no sample: the log alone
    log, causes = _causes(run, run_dir, system)
    said = [f"the job failed ({status}{_after(run.get('seconds'))})"]
    for what, cause in causes.items():
        if cause is not None:
            said.append(f"{what} {_was(cause)} ({cause['evidence']}); fix: {cause['fix']}")
    if log is not None:
        said.append(f"its output{_with_error(causes['the memory limit'])} is in {log}")
    return "; ".join(said)


def _causes(run: dict[str, Any], run_dir: Path | None, system: SystemFigures | None
            ) -> tuple[Path | None, dict[str, dict[str, Any] | None]]:
    """A failed job's train.log (None where there is none) and its one likely cause, by
    name (the memory limit, the open-files limit, /dev/shm; the others None), the log's
    tail read once for all."""
    log = run_dir / "train.log" if run_dir is not None else None
    log = log if log is not None and log.is_file() else None
    tail = _log_tail(log) if log is not None else ""
    return log, _one_cause({"the memory limit": memory_cause(run, system, tail),
                            "the open-files limit": files_cause(log, system, tail),
                            "/dev/shm": shm_cause(log, system, tail)}, tail)


def _with_error(memory: dict[str, Any] | None) -> str:
    """What the job's output holds: no error where the OOM killer ended the job itself."""
    if memory is not None and memory.get("counted") and memory.get("job_killed"):
        return " (the OOM killer's SIGKILL prints nothing there)"
    return ", with the error,"


def _was(cause: dict[str, Any]) -> str:
    """A cause its log names, or OOM kills the kernel counted, was the likely one, as is a
    /dev/shm seen nearly full; another only seen by the monitor may have been (the log may
    name another error it cannot see)."""
    return ("was the likely cause" if cause.get("log_line") or cause.get("counted")
            or cause.get("seen_is_likely") else "may have been the cause")


def shm_room(system: SystemFigures | None) -> str | None:
    """A job that did not fail but was seen with /dev/shm nearly full: more workers, a
    deeper prefetch or a larger batch may fail for it (None when it had room)."""
    peak = system.shm_peak if system is not None else None
    if not peak or not peak.get("total_bytes"):
        return None
    share = peak["used_bytes"] / peak["total_bytes"]
    if share < SHM_NEARLY_FULL:
        return None
    return (f"/dev/shm was {share:.0%} full at its fullest sample ({_mib(peak['used_bytes'])} "
            f"of {_mib(peak['total_bytes'])} MiB, every process's files): the job fits with "
            "little room; more workers, a deeper prefetch or a larger batch may fail with "
            f"'unable to allocate shared memory'. {SHM_HINT[0].upper()}{SHM_HINT[1:]}")


def watched_disk(run: dict[str, Any], system: SystemFigures | None) -> dict[str, Any] | None:
    """The disk the monitor sampled, the path it belongs to and why that path."""
    if system is None:
        return None
    data = run.get("data") if isinstance(run.get("data"), str) else None
    path = data or (run.get("watched") if isinstance(run.get("watched"), str) else None)
    return {"device": system.disk_device, "path": path,
            "from": "--data" if data else "the current directory (no --data)",
            "measured": system.disk_util_pct is not None}


def _on_disk(path: str | None, device: str | None) -> bool:
    """Whether `path` (the dataset, from the step log) exists here on disk `device`."""
    if not path or not device or "://" in path or not Path(path).exists():
        return False
    from autotune.monitor.diskstats import resolve_disk

    return getattr(resolve_disk(path), "name", None) == device


def run_facts(run: dict[str, Any] | None, run_dir: Path | None, system: SystemFigures | None,
              steps: int, dataset: str | None, *, warmup_only: bool = False,
              loader: dict[str, Any] | None = None) -> tuple[dict[str, Any] | None, list[str]]:
    """The `run` section of the analysis (None without a run.json) and its warnings
    (`warmup_only`, `loader`: whether a /dev/shm or an open-files failure is the verdict,
    as autotune.verdict.rules.failed_on_shm and failed_on_files decide: failed_in_start_up)."""
    if run is None:
        return None, []
    warnings: list[str] = []
    where = f"{run_dir / 'run.json'}" if run_dir is not None else "run.json"
    kind, status = outcome(run)
    after = _after(run.get("seconds"))
    shm = files = memory = None
    decided = False
    if kind == "unknown":
        warnings.append(f"how the job ended is unknown: {where} has no exit status, so the "
                        "monitor itself ended before the job did (killed, e.g. by SIGKILL, or "
                        f"its machine lost); the verdict describes only the {steps:,} step(s) "
                        "logged, and the job may have run on, or failed, after them")
        if (mem := memory_cause(run, system, "")) is not None:   # the monitor killed too?
            warnings.append(f"the memory limit may have ended the monitor with the job "
                            f"({mem['evidence']}); fix: {mem['fix']}")
    if kind == "failed":
        _, causes = _causes(run, run_dir, system)
        shm, files = causes["/dev/shm"], causes["the open-files limit"]
        memory = causes["the memory limit"]
        why = (f"; its output{_with_error(memory)} is in {run_dir / 'train.log'}"
               if run_dir is not None else "")
        decided = (failed_in_start_up(shm, warmup_only, loader)
                   or failed_in_start_up(files, warmup_only, loader))
        what = ("" if decided else f"; the verdict describes only "
                f"the {steps:,} step(s) measured before it, not why it failed")
        warnings.append(f"the job failed: {status}{after} ({where}){what}{why}")
        warnings += [f"{what} {_was(c)} of the failure ({c['evidence']}); fix: {c['fix']}"
                     for what, c in causes.items() if c is not None]
    elif kind == "ok":
        warnings += [room for room in (shm_room(system), files_room(system),
                                       memory_room(system)) if room]
    disk = watched_disk(run, system)
    if (disk is not None and disk["measured"] and disk["from"] != "--data"
            and not _on_disk(dataset, disk["device"])):
        at = f"of {disk['path']}, " if disk["path"] else ""
        warnings.append(
            f"disk {disk['device'] or '?'}: the monitor watched the disk {at}the directory "
            "it ran in, because it was given no --data; it may not hold the dataset (and it "
            "carries every other process's reads), so the disk figures may not be the "
            f"dataset's; rerun with `autotune monitor --data "
            f"{shlex.quote(dataset) if dataset else 'DATASET'} -- ...`")
    return {"returncode": _int(run.get("returncode")), "signal": _int(run.get("signal")),
            "seconds": run.get("seconds") if _after(run.get("seconds")) else None,
            "forwarded_signals": run.get("forwarded_signals") or [], "outcome": kind,
            "status": status, "shm": shm, "files": files, "memory": memory, "disk": disk,
            "verdict_is_failure": kind == "failed" and decided}, warnings


__all__ = ["MEMORY_NEARLY_FULL", "SHM_NEARLY_FULL", "files_cause", "memory_cause", "memory_room",
           "outcome", "run_facts", "shm_cause", "shm_room",
           "watched_disk"]
