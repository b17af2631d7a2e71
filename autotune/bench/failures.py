"""Why a measurement failed, in words a user can act on: (kind, reason, hint).

Inputs are what the parent can know: the error the child reported (type, message,
traceback, phase), or, when the child left no result, how it ended (exit status or
signal, our timeout) and the tail of its log. The patterns are PyTorch's own messages
(torch/utils/data/dataloader.py, _utils/signal_handling.py, libshm).
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import Any

from autotune import openfiles

SHM_HINT = ("DataLoader workers pass batches through /dev/shm: enlarge it (the container's: "
            "docker run --shm-size, or a Kubernetes emptyDir with medium: Memory; a host's, "
            "as root: `mount -o remount,size=8G /dev/shm`; `autotune search` in the same "
            "place names the size its batches need), or lower num_workers, prefetch_factor "
            "or the batch size")
# A line of a job's output that names a /dev/shm failure: PyTorch's own messages (libshm's
# "unable to allocate shared memory(shm)", "unable to write to file </torch_...>: No space
# left on device", a worker "killed by signal: Bus error", "insufficient shared memory").
_SHM_LINE = re.compile(
    r"unable to (write to|open|allocate)[^\n]*(shared memory|torch_|shm)"
    r"|no space left on device[^\n]*(shm|torch_|shared memory)"
    r"|(shm|torch_|shared memory)[^\n]*no space left on device"
    r"|bus error|out of shared memory|insufficient shared memory", re.IGNORECASE)


# A line of a job's output that names the open-files limit (EMFILE): the message itself,
# or torch's when the training process could not take a batch's file descriptors.
_FILES_LINE = re.compile(r"Too many open files|received 0 items of ancdata|\[Errno 24\]",
                         re.IGNORECASE)


def shm_failure_line(text: str) -> str | None:
    """The last line of `text` that names a /dev/shm failure (stripped), or None. Not
    torch's "unable to open shared memory object <...>: Too many open files (24)": that is
    the open-files limit (files_failure_line)."""
    return _last_line(_SHM_LINE, text, unless=_FILES_LINE)


def files_failure_line(text: str) -> str | None:
    """The last line of `text` that names the open-files limit (stripped), or None."""
    return _last_line(_FILES_LINE, text)


def _last_line(pattern: re.Pattern[str], text: str,
               unless: re.Pattern[str] | None = None) -> str | None:
    found = None
    for m in pattern.finditer(text):
        start = text.rfind("\n", 0, m.start()) + 1
        end = text.find("\n", m.end())
        line = text[start:end if end >= 0 else len(text)].strip()
        if unless is None or not unless.search(line):
            found = line
    return found


OOM_HINT = ("use fewer workers, a lower prefetch_factor or a smaller batch (each worker "
            "holds prefetch_factor batches); `dmesg | grep -i oom` shows the kernel's record")


@dataclass(frozen=True)
class Failure:
    kind: str      # worker_error, worker_killed, worker_crashed, shm, open_files, oom,
                   # unsendable, timeout, hung, step_error, startup, no_batches, crashed
    reason: str
    hint: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "reason": self.reason, "hint": self.hint}


def _signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _worker_original(text: str) -> str:
    """The last line of a worker's 'Original Traceback' (the real exception), if any."""
    if "Original Traceback" not in text:
        return ""
    lines = [ln.strip() for ln in text.split("Original Traceback", 1)[1].splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _fmt_mib(n: float | None) -> str:
    return "?" if n is None else f"{n / 2**20:,.0f} MiB"


@dataclass
class _Seen:
    """What the child reported, read once for every rule."""

    etype: str
    msg: str
    phase: str
    text: str
    original: str     # the worker's own exception line, when a worker raised
    in_worker: bool
    shm_note: str
    err: dict[str, Any]
    ctx: dict[str, Any]

    @property
    def first(self) -> str:
        return (self.original or self.msg).splitlines()[0][:300] if (self.original or self.msg) else ""


def classify_error(err: dict[str, Any], ctx: dict[str, Any]) -> Failure:
    """The failure for an exception the child caught and reported: the first rule that
    names it (the user's code, a resource, a worker), else a crash.

    ctx: nofile_limit, max_open_files, shm_used_bytes, shm_total_bytes, step, batch_timeout_s, workers.
    """
    msg, tb = err.get("message", ""), err.get("traceback", "")
    text = f"{msg}\n{tb}"
    in_worker = "in DataLoader worker process" in text
    # The child's own view of /dev/shm when it reported one (a container may have its own).
    own = err.get("shm_total_bytes") is not None
    shm_used = err.get("shm_used_bytes") if own else ctx.get("shm_used_bytes")
    shm_total = err.get("shm_total_bytes") if own else ctx.get("shm_total_bytes")
    seen = _Seen(err.get("type", ""), msg, err.get("phase", ""), text,
                 _worker_original(text) if in_worker else "", in_worker,
                 (f" (/dev/shm {'at the failure' if own else 'peak'}: {_fmt_mib(shm_used)} "
                  f"used of {_fmt_mib(shm_total)})" if shm_total else ""), err, ctx)
    for rule in (_users_code, _resources, _workers):
        f = rule(seen)
        if f is not None:
            return f
    return _otherwise(seen)


def _users_code(s: _Seen) -> Failure | None:
    """A rank, the dataset factory, its samples, the step."""
    if s.etype == "RankFailed":
        return Failure("rank", s.msg, "rerun with --procs-per-node 1 to see that rank's error "
                                      "in one process")
    if s.phase == "factory":
        return Failure("factory", s.msg, "fix the dataset factory; run it once in Python with "
                                         "the dataset path to see the full traceback")
    if re.search(r"default_collate|batch must contain tensors|collate", s.text) and \
            s.etype in ("TypeError", "RuntimeError") and s.ctx.get("factory"):
        return Failure("collate", f"the samples of the dataset factory {s.ctx['factory']} cannot "
                                  f"be batched: {s.first}",
                       "return samples of tensors, numbers, dicts or lists of them, or a dict "
                       "with 'dataset' and a 'collate_fn' from the factory")
    if s.phase == "step":
        return Failure("step_error",
                       f"the training step {s.ctx.get('step')} raised {s.etype}: {s.msg}",
                       "fix the step function (it is called with one argument, the batch: "
                       "(images float32 [B,3,H,W], labels [B]) from the default pipeline, "
                       "your collate's output with --dataset-factory); rerun with the emulated step (--compute-ms) to measure "
                       "the loader alone")
    if s.phase == "step-import":
        # Its own kind: a step that cannot be imported is the user's input, not a measurement
        # that failed (`autotune bench` exits 2 for it, as for a factory that cannot).
        missing = s.etype in ("ModuleNotFoundError", "ImportError", "FileNotFoundError")
        return Failure("step_import",
                       f"cannot load the step {s.ctx.get('step')}: {s.etype}: {s.msg}",
                       "give --step as module:function importable from the current directory, "
                       "or as path/to/file.py:function" if missing else
                       "fix its module (running the file with python shows the traceback)")
    return None


def _resources(s: _Seen) -> Failure | None:
    """/dev/shm, open files, the DataLoader's timeout."""
    text = s.text
    # The open-files limit first: torch's worker-side EMFILE reads "unable to open shared
    # memory object <...>: Too many open files (24)", which the /dev/shm test would take.
    # An EOFError receiving a tensor's file (torch's rebuild_storage_fd): the worker, past
    # its own open-files limit, dropped the connection it hands the file over on.
    if "Too many open files" in text or "received 0 items of ancdata" in text \
            or s.err.get("errno") == 24 or "[Errno 24]" in text \
            or (s.etype == "EOFError" and "rebuild_storage_fd" in text):
        return _open_files(s.ctx, s.first)
    if (re.search(r"No space left on device", text) and re.search(r"shm|torch_|shared memory", text)) \
            or re.search(r"unable to (write to|open|allocate)[^\n]*(shared memory|torch_|shm)", text) \
            or "killed by signal: Bus error" in text or "out of shared memory" in text:
        return Failure("shm", f"shared memory (/dev/shm) ran out{s.shm_note}: {s.first}", SHM_HINT)
    m = re.search(r"DataLoader timed out after (\S+) seconds", text)
    if m and (why := unsendable_line(s.ctx.get("log_tail") or "")):
        return _unsendable(f"no batch arrived for {m.group(1)} s (DataLoader timeout) "
                           f"during {s.phase}", why)
    if m and _workers_out_of_files(s.ctx.get("log_tail") or ""):
        return _open_files(s.ctx, f"no batch arrived for {m.group(1)} s (DataLoader timeout) "
                                  f"during {s.phase}: a worker's queue thread ran out of open "
                                  "files and dropped its batch")
    if m:
        return Failure("timeout",
                       f"no batch arrived for {m.group(1)} s (DataLoader timeout) during "
                       f"{s.phase}: a worker is hung or the storage stalled",
                       "check the storage (a hung network mount? `cat /proc/diskstats`), and "
                       "the dataset code for a deadlock; raise --batch-timeout if a first cold "
                       "batch is legitimately that slow")
    return None


def _workers_out_of_files(log_tail: str) -> bool:
    """Whether a worker printed EMFILE from its queue thread (multiprocessing's _feed): the
    batch is dropped, and the training side waits for it until a timeout."""
    return "Too many open files" in log_tail and "_feed" in log_tail


def files_hint(here: bool = True, job: tuple[int | None, int | None] | None = None) -> str:
    """The fix for a run past its open-files limit: openfiles.fix's (the hard limit's
    figure where the soft one may rise to it), or a smaller pool. `here` False: the limit
    was --max-open-files or another job's, not this process's; `job`: that job's (soft,
    hard), where known."""
    return f"{openfiles.fix(here, job)}; or lower num_workers / prefetch_factor"


# A frame of multiprocessing's queue feeder thread, where a worker's batch is pickled.
_FEED_FRAME = re.compile(r'^\s*File "[^"\n]*queues\.py", line \d+, in _feed$', re.MULTILINE)


def unsendable_line(log_tail: str) -> str | None:
    """The error a worker's queue thread (multiprocessing's _feed) met pickling a batch,
    which it then dropped: the exception line that ends that traceback, whatever its type
    (TypeError for a generator, RuntimeError for a non-leaf tensor that requires grad,
    ValueError for a ctypes pointer...). None when there is none, or when it is the
    open-files limit (EMFILE while torch shares a tensor) or a failure to send, not to
    pickle (the training process gone)."""
    for m in _FEED_FRAME.finditer(log_tail):
        frames, end = [], None
        for line in log_tail[m.end():].splitlines()[1:40]:
            if not line.strip() or line.startswith((" ", "\t", "Traceback")):
                frames.append(line)   # the traceback's frames, or another's interleaved
                continue
            end = line.strip()
            break
        if (end is None or not any("dumps(" in f for f in frames)
                or _FILES_LINE.search(end)):
            continue
        return end[:300]
    return None


UNSENDABLE_HINT = ("the dataset's samples (or collate_fn's batch) hold something that "
                   "cannot be pickled (a generator, a lock, a lambda, an open handle): return "
                   "tensors, arrays, numbers or strings to load in workers; num_workers=0 "
                   "(bench: --workers 0) loads in the training process, where nothing is "
                   "pickled (autotune.DataLoader stays there for such a dataset by itself)")


def _unsendable(what: str, why: str) -> Failure:
    return Failure("unsendable", f"{what}: a worker could not send its batch back ({why}), "
                   "so it dropped it", UNSENDABLE_HINT)


def _open_files(ctx: dict[str, Any], what: str) -> Failure:
    lim = ctx.get("nofile_limit")
    return Failure("open_files", f"too many open files (limit {lim if lim else '?'}, "
                                 f"`ulimit -n`): {what}",
                   files_hint(here=ctx.get("max_open_files") is None))


def _workers(s: _Seen) -> Failure | None:
    """A worker killed, crashed, gone, or raising while it loaded a sample."""
    m = re.search(r"DataLoader worker \(pid (\d+)\) is killed by signal: ([^.\n]+)", s.text)
    if m:
        pid, sig = m.group(1), m.group(2).strip()
        if sig.lower() == "killed":
            return Failure("worker_killed",
                           f"DataLoader worker pid {pid} was killed by SIGKILL, most likely "
                           "by the kernel OOM killer", OOM_HINT)
        if "segmentation" in sig.lower():
            return Failure("worker_crashed",
                           f"DataLoader worker pid {pid} crashed (segmentation fault) in "
                           "native code (an image decoder or an extension)",
                           "rerun with --workers 0 to see which sample; check the file and "
                           "the Pillow/libjpeg build")
        return Failure("worker_crashed", f"DataLoader worker pid {pid} was killed by signal: {sig}",
                       "rerun with --workers 0 to see the error in the main process")
    m = re.search(r"DataLoader worker \(pid\(s\) ([\d, ]+)\) exited unexpectedly", s.text)
    if m:
        return Failure("worker_crashed",
                       f"DataLoader worker(s) pid {m.group(1)} exited unexpectedly (no Python "
                       "error: os._exit, a native crash, or a kill)",
                       "rerun with --workers 0 to see the error in the main process; if memory "
                       "is short, " + OOM_HINT)
    if s.in_worker:
        where = s.original or f"{s.etype}: {s.msg.splitlines()[0]}"
        sample_hint = ("fix or remove the file named above and rerun"
                       if "SampleError" in where or "cannot decode" in where or "cannot read" in where
                       else "rerun with --workers 0 to get the full traceback in the main process")
        return Failure("worker_error", f"a DataLoader worker raised while loading a sample: {where}",
                       sample_hint)
    return None


def _otherwise(s: _Seen) -> Failure:
    if s.etype == "SampleError":
        return Failure("worker_error", f"loading a sample failed: {s.msg}",
                       "fix or remove the file named above and rerun")
    if s.phase in ("startup", "scan", "ready"):
        return Failure("startup", f"the measurement could not start ({s.phase}): {s.etype}: "
                                  f"{s.msg}", "check the dataset path and format (an image "
                                              "folder is DATASET/CLASS/IMAGE.jpg)")
    if s.etype == "MemoryError":
        return Failure("oom", f"out of memory in the measurement process: {s.msg}", OOM_HINT)
    return Failure("crashed", f"the measurement failed during {s.phase}: {s.etype}: {s.msg}",
                   "see process.log_tail in the JSON result; rerun with --workers 0 for the full traceback")


def classify_exit(returncode: int | None, *, timed_out: bool, timeout_s: float, phase: str,
                  log_tail: str, oom_kills: int, ctx: dict[str, Any]) -> Failure:
    """The failure for a child that ended without a result file."""
    if timed_out and (why := unsendable_line(log_tail)):
        return _unsendable(f"no result after {timeout_s:g} s (hard timeout) during {phase}", why)
    if timed_out and _workers_out_of_files(log_tail):
        return _open_files(ctx, "no result after {:g} s (hard timeout) during {}: a worker's "
                           "queue thread ran out of open files and dropped its batch".format(
                               timeout_s, phase))
    if timed_out:
        return Failure("hung",
                       f"no result after {timeout_s:g} s (hard timeout) during {phase}; the "
                       "whole process group was killed",
                       "a step or worker that never returns, or storage that stalls: check the "
                       "step and the mount; raise --timeout if startup is legitimately that slow")
    if returncode is not None and returncode < 0:
        sig = -returncode
        if sig == signal.SIGKILL:
            if oom_kills > 0:
                return Failure("oom", "the measurement process was killed by the kernel OOM "
                                      f"killer ({oom_kills} OOM kill(s) recorded in /proc/vmstat "
                                      "during the run)", OOM_HINT)
            return Failure("oom", "the measurement process was killed by SIGKILL (not by "
                                  "autotune): most likely the OOM killer or a cgroup memory limit",
                           OOM_HINT)
        if sig == signal.SIGBUS:
            return Failure("shm", "the measurement process died of SIGBUS: shared memory "
                                  "(/dev/shm) ran out", SHM_HINT)
        if sig == signal.SIGSEGV:
            return Failure("crashed", "the measurement process crashed (segmentation fault) "
                                      "in native code", "rerun with --workers 0; check the "
                                      "Pillow/torch build")
        return Failure("crashed", f"the measurement process was killed by {_signame(sig)}",
                       "something outside autotune sent the signal (a job scheduler?)")
    last = next((ln for ln in reversed(log_tail.splitlines()) if ln.strip()), "")
    fake = {"type": "", "message": last, "traceback": log_tail, "phase": phase}
    f = classify_error(fake, ctx)
    if f.kind not in ("crashed", "startup"):
        return f
    return Failure("crashed", f"the measurement process exited with status {returncode} "
                              f"during {phase} without a result" + (f": {last[:300]}" if last else ""),
                   "see the log lines in the JSON result (process.log_tail)")
