"""The library side of `autotune monitor -- CMD`: run a training command under the monitor.

`run_monitored(cmd, out_dir)` starts the command, tees its stdout and stderr to
OUT/train.log (and, when asked, to the caller's streams), samples the system monitor
(disk behind `data`, CPU per core, the command's process tree, /dev/shm, GPU) to
OUT/metrics.jsonl as it goes, forwards SIGINT and SIGTERM to the command, and returns
its exit status with the run's figures. It never prints.

Files in OUT:
    train.log        the command's output, stdout and stderr, whole lines
    train.log.times  "BYTE_OFFSET EPOCH_SECONDS" per burst of output (<= 50 ms apart): the
                     time each line was printed, for logs that carry no timestamps
    metrics.jsonl    one monitor Sample per interval (Sample.to_dict(), `time` in epoch s),
                     plus "sched": the run-queue wait of the command's tasks (autotune.runqueue)
                     and "budget": where each process class's time went over the interval
                     (autotune.monitor.tasks: a TimeBudget.to_dict()), and "cpu_quota":
                     the job's cgroup CPU quota and how often it throttled the job over
                     the interval (autotune.monitor.quota), and "memcg": its memory
                     cgroup's limit, working set and OOM kills (autotune.monitor.memcg)
    steps.jsonl      written by the command itself when it wraps its loader with
                     autotune.instrument() (AUTOTUNE_STEPS_LOG points there)
    run.json         the command, data path, the path whose disk was watched (`watched`:
                     --data, else the current directory), times, exit status, and
                     `cpu_quota`: the quota's whole-run throttling (null: not seen), and
                     `memory`: the memory limit, the fullest working set sampled and the
                     OOM kills in the job's cgroup (null: no limit binds it)

The command runs in its own process group, so a Ctrl-C at the terminal reaches it once,
forwarded by the monitor (to the whole group, as the terminal would: DataLoader workers
included); SIGTERM goes to the command alone (it must stop its own workers). Python
commands get PYTHONUNBUFFERED=1 so that their lines arrive when printed.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from autotune.errors import AutotuneError, UsageError
from autotune.instrumentation import STEPS_LOG_ENV
from autotune.monitor.launchers import StepWriters
from autotune.monitor.memcg import MemcgSampler
from autotune.monitor.quota import QuotaSampler, quota_section
from autotune.monitor.tasks import TaskSampler
from autotune.runqueue import RunQueueSampler

# The command in a process group of its own (its signals are forwarded, the whole group
# stopped at the end): Popen's process_group= from Python 3.11; 3.10 has only preexec_fn.
_OWN_GROUP: dict[str, Any] = ({"process_group": 0} if sys.version_info >= (3, 11)
                              else {"preexec_fn": os.setpgrp})
PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> Callable[[], None]:
    """A preexec_fn: the command gets SIGTERM when the monitor dies (Linux's parent-death
    signal). In a group of its own, a kill of the monitor's group (a scheduler's SIGKILL
    after the grace period, `timeout -k`, Slurm's proctrack/pgid) never reached it: it ran
    on unobserved, beside the requeued job, to its end or to its next write to the dead
    pipe. SIGTERM, not SIGKILL: a launcher (torchrun) then stops its own ranks."""
    # prctl is found here, before the fork: between fork and exec the child runs only
    # what is async-signal-safe enough (no import, no dlopen: another thread of the
    # monitor may hold their locks at the fork).
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        prctl = None   # not Linux: as before

    def child() -> None:
        if sys.version_info < (3, 11):
            os.setpgrp()
        if prctl is None:
            return
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:   # the monitor died before the signal was armed
            os.kill(os.getpid(), signal.SIGTERM)
    return child


LOG, TIMES, METRICS, STEPS, RUN = ("train.log", "train.log.times", "metrics.jsonl",
                                   "steps.jsonl", "run.json")
TIME_RESOLUTION_S = 0.05
PARTIAL_FLUSH_S = 1.0          # a line without newline (a \r progress bar) after this long
PARTIAL_MAX = 64 * 1024
DRAIN_AFTER_EXIT_S = 5.0       # an orphan holding the pipe must not hang the monitor


def signal_name(num: int) -> str:
    """SIGINT for 2; "signal 99" for a number the platform does not name."""
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


@dataclass
class MonitorRun:
    """What a monitored run did; `returncode` is the command's exit status (128+N when it
    was killed by signal N, as a shell reports it)."""

    command: list[str]
    out_dir: str
    pid: int
    returncode: int
    signal: int | None
    started: float
    ended: float
    data: str | None
    log: str
    metrics: str
    steps: str | None
    samples: int
    log_bytes: int
    forwarded: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    watched: str | None = None    # the path whose disk was sampled (data, else the cwd)
    cpu_quota: dict[str, Any] | None = None   # the quota's whole-run throttling, if seen
    memory: dict[str, Any] | None = None      # the memory cgroup's limit, peak, OOM kills

    @property
    def seconds(self) -> float:
        return self.ended - self.started

    def to_dict(self) -> dict[str, Any]:
        return {"command": self.command, "out_dir": self.out_dir, "pid": self.pid,
                "returncode": self.returncode, "signal": self.signal,
                "started": self.started, "ended": self.ended, "seconds": self.seconds,
                "data": self.data, "watched": self.watched, "log": self.log,
                "metrics": self.metrics,
                "steps": self.steps, "samples": self.samples, "log_bytes": self.log_bytes,
                "forwarded_signals": self.forwarded, "summary": self.summary,
                "errors": self.errors, "cpu_quota": self.cpu_quota, "memory": self.memory}


class _Tee:
    """Whole lines of two streams into one log, with a time index; echo as they come."""

    def __init__(self, log: IO[bytes], times: IO[str],
                 echo: dict[int, IO[bytes] | None]) -> None:
        self.log, self.times, self.echo = log, times, echo
        self.offset = 0
        self.partial: dict[int, bytearray] = {}
        self.partial_since: dict[int, float] = {}
        self.pending: tuple[int, float, float] | None = None  # offset, time, first time

    def feed(self, key: int, data: bytes, now: float) -> None:
        out = self.echo.get(key)
        if out is not None:
            try:
                out.write(data)
                out.flush()
            except (OSError, ValueError):
                self.echo[key] = None   # a closed terminal must not stop the log
        buf = self.partial.setdefault(key, bytearray())
        if not buf:
            self.partial_since[key] = now
        buf += data
        cut = buf.rfind(b"\n") + 1
        if cut:
            self._write(bytes(buf[:cut]), now)
            del buf[:cut]
            self.partial_since[key] = now
        if len(buf) > PARTIAL_MAX:
            self.flush_partial(key, now)

    def tick(self, now: float) -> None:
        for key, buf in self.partial.items():
            if buf and now - self.partial_since.get(key, now) >= PARTIAL_FLUSH_S:
                self.flush_partial(key, now)

    def flush_partial(self, key: int, now: float) -> None:
        buf = self.partial.get(key)
        if buf:
            self._write(bytes(buf) + (b"\n" if not buf.endswith(b"\n") else b""), now)
            buf.clear()

    def _write(self, data: bytes, now: float) -> None:
        self.log.write(data)
        self.log.flush()   # readable as it grows: `tail -f`, `autotune analyze` meanwhile
        self.offset += len(data)
        if self.pending is not None and now - self.pending[2] < TIME_RESOLUTION_S:
            self.pending = (self.offset, now, self.pending[2])
        else:
            self._flush_time()
            self.pending = (self.offset, now, now)

    def _flush_time(self) -> None:
        if self.pending is not None:
            self.times.write(f"{self.pending[0]} {self.pending[1]:.3f}\n")
            self.times.flush()
            self.pending = None

    def close(self, now: float) -> None:
        for key in list(self.partial):
            self.flush_partial(key, now)
        self._flush_time()
        self.log.flush()
        self.times.flush()


def ignores(pid: int, sig: int) -> bool:
    """Whether process `pid` ignores signal `sig` (SigIgn of /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigIgn:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


class _Forwarder:
    """SIGINT/SIGTERM handlers that pass the signal on to the command (main thread only)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.forwarded: list[str] = []
        self.old: dict[int, Any] = {}

    def __enter__(self) -> _Forwarder:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self.old.items():
            signal.signal(sig, old)

    def _handle(self, signum: int, frame: object) -> None:
        if self.proc.poll() is not None:
            return
        try:
            if signum == signal.SIGINT and ignores(self.proc.pid, signal.SIGINT):
                # Started with SIGINT ignored (a shell's background job passes that on, and
                # Python keeps it), no Ctrl-C could ever stop it: the user's stop, as SIGTERM.
                signum = signal.SIGTERM
                os.killpg(self.proc.pid, signum)
            elif signum == signal.SIGINT:
                os.killpg(self.proc.pid, signum)   # as a terminal's Ctrl-C would
            else:
                self.proc.send_signal(signum)
            self.forwarded.append(signal.Signals(signum).name)
        except (ProcessLookupError, PermissionError):
            pass


def budget_section(tasks: TaskSampler | None) -> dict[str, Any] | None:
    """The "budget" section of a monitor record: the task sampler's window since the last
    call (None for no window yet; "available": false with the reason when it failed)."""
    if tasks is None:
        return None
    try:
        b = tasks.take()
    except Exception as e:  # noqa: BLE001  (a figure, never a reason to stop)
        return {"available": False, "reason": f"{type(e).__name__}: {e}"}
    return b.to_dict() if b is not None else None


def _sample_writer(path: Path, rq: RunQueueSampler | None, tasks: TaskSampler | None = None,
                   quota: QuotaSampler | None = None, memcg: MemcgSampler | None = None
                   ) -> tuple[Callable[[Any], None], IO[str], list[int]]:
    fh = path.open("w", encoding="utf-8")
    count = [0]

    def write(sample: Any) -> None:
        d = sample.to_dict()
        if tasks is not None:
            d["budget"] = budget_section(tasks)
        if quota is not None:
            d["cpu_quota"] = quota_section(quota)
        if memcg is not None:
            d["memcg"] = memcg.section()
        if rq is not None:
            # Run-queue wait of the job's tasks: CPU-starved or waiting on I/O?
            try:
                u = rq.sample(sample.monotonic)
            except Exception as e:  # noqa: BLE001  (a figure, never a reason to stop)
                d["sched"] = {"available": False, "reason": f"{type(e).__name__}: {e}"}
            else:
                d["sched"] = u.to_dict() if u is not None else None
        fh.write(json.dumps(d) + "\n")
        fh.flush()   # a killed monitor leaves every sample so far
        count[0] += 1
    return write, fh, count


def run_monitored(cmd: Sequence[str], out_dir: str | os.PathLike[str], *,
                  interval: float = 0.5, data: str | os.PathLike[str] | None = None,
                  gpu: bool = True, env: dict[str, str] | None = None,
                  echo_stdout: IO[bytes] | None = None, echo_stderr: IO[bytes] | None = None,
                  popen: Callable[..., subprocess.Popen[bytes]] | None = None,
                  forward_signals: bool = True, delayacct: bool = False) -> MonitorRun:
    """Run `cmd` to completion under the system monitor; see the module docstring.

    Args:
        cmd: the command and its arguments (no shell).
        out_dir: where the files go (created; files of an earlier run are replaced).
        interval: seconds between monitor samples.
        data: the dataset directory: the disk behind it is watched (default: the current
            directory's disk) and it is recorded in run.json for the analysis.
        gpu: sample NVML.
        env: extra environment variables for the command.
        echo_stdout, echo_stderr: binary streams to copy the command's output to as it
            comes (the CLI passes its own stdout/stderr); None: the log only.
        popen: how to start the command (subprocess.Popen by default; e.g.
            IoThrottle(...).popen to run it under an I/O cap).
        forward_signals: install SIGINT/SIGTERM handlers that forward to the command.
        delayacct: switch kernel.task_delayacct on for the run (root; restored after,
            shared with other autotune runs: autotune.monitor.delayacct), so that the
            budget's I/O is counted exactly rather than sampled.

    Raises UsageError when the command cannot be started, `out_dir` not created, or
    `delayacct` asked without root.
    """
    cmd = [os.fspath(c) for c in cmd]
    out = _prepare_out(cmd, out_dir, data)
    steps = out / STEPS
    steps.unlink(missing_ok=True)   # a stale step log would be analysed as this run's
    full_env = dict(os.environ)
    full_env.update({"PYTHONUNBUFFERED": "1", STEPS_LOG_ENV: str(steps.resolve()),
                     "AUTOTUNE_MONITOR_DIR": str(out.resolve())})
    full_env.update(env or {})
    hold = _hold_delayacct(delayacct)   # before the spawn: the command is counted from birth
    try:
        return _run(cmd, out, steps, full_env, popen, hold, interval=interval, data=data,
                    gpu=gpu, echo=(echo_stdout, echo_stderr), forward_signals=forward_signals)
    finally:
        if hold is not None:
            hold.release()


def _hold_delayacct(on: bool) -> Any:
    if not on:
        return None
    from autotune.monitor.delayacct import DelayacctHold

    hold = DelayacctHold()
    hold.acquire()
    return hold


def _run(cmd: list[str], out: Path, steps: Path, full_env: dict[str, str],
         popen: Callable[..., subprocess.Popen[bytes]] | None, hold: Any, *, interval: float,
         data: str | os.PathLike[str] | None, gpu: bool,
         echo: tuple[IO[bytes] | None, IO[bytes] | None], forward_signals: bool) -> MonitorRun:
    echo_stdout, echo_stderr = echo
    started = time.time()
    proc = _start(popen or subprocess.Popen, cmd, full_env)
    errors: list[str] = []
    rq = RunQueueSampler(proc.pid)
    rq.sample(time.monotonic())   # the baseline
    tasks = TaskSampler(proc.pid, delayacct_since=hold.since if hold is not None else None,
                        trainers=StepWriters(steps))
    tasks.start()
    quota, memcg = QuotaSampler(proc.pid), MemcgSampler(proc.pid)
    quota_section(quota), memcg.section()          # the baselines
    write_sample, metrics_fh, count = _sample_writer(out / METRICS, rq, tasks, quota, memcg)
    watched = os.path.abspath(data) if data is not None else os.getcwd()
    # run.json from the start, without an exit status: a monitor killed before the end
    # (SIGKILL, its node lost) leaves one that says so, which `analyze` reads as "how the
    # job ended is unknown" instead of finding no run.json and saying nothing.
    _write_run(out, {"command": cmd, "out_dir": str(out), "pid": proc.pid,
                     "returncode": None, "signal": None, "started": started, "ended": None,
                     "data": os.path.abspath(data) if data is not None else None,
                     "watched": watched, "log": str(out / LOG), "metrics": str(out / METRICS),
                     "steps": str(steps)}, errors)
    mon = _monitor(watched, proc.pid, interval, gpu, write_sample, errors)
    log_fh = (out / LOG).open("wb")
    times_fh = (out / TIMES).open("w", encoding="utf-8")
    tee = _Tee(log_fh, times_fh, {1: echo_stdout, 2: echo_stderr})
    forwarder = _Forwarder(proc)
    try:
        mon.start()
        with forwarder if forward_signals else _NoForward():
            _pump(proc, tee)
            proc.wait()
    finally:
        if proc.poll() is None:   # the monitor itself failed: do not leave the job behind
            proc.kill()
            proc.wait()
        mon.stop()
        tasks.stop()
        tee.close(time.time())
        log_fh.close()
        times_fh.close()
        metrics_fh.close()
    rc = proc.returncode
    sig = -rc if rc < 0 else None
    errors.extend(mon.errors)
    run = MonitorRun(command=cmd, out_dir=str(out), pid=proc.pid,
                     returncode=128 + sig if sig else rc, signal=sig, started=started,
                     ended=time.time(), data=os.path.abspath(data) if data is not None else None,
                     log=str(out / LOG), metrics=str(out / METRICS),
                     steps=str(steps) if steps.exists() else None, samples=count[0],
                     log_bytes=tee.offset, forwarded=forwarder.forwarded,
                     summary=mon.summary(), errors=errors, watched=watched,
                     cpu_quota=quota.totals(), memory=memcg.totals())
    _write_run(out, {k: v for k, v in run.to_dict().items() if k != "summary"}, errors)
    return run


def _write_run(out: Path, d: dict[str, Any], errors: list[str]) -> None:
    """run.json, atomically: a monitor killed while writing it leaves the old one whole."""
    from autotune_base.fsutil import write_text_atomic

    try:
        write_text_atomic(out / RUN, json.dumps(d, indent=2) + "\n", durable=False)
    except OSError as e:
        errors.append(f"cannot write {out / RUN}: {e.strerror}")


def _prepare_out(cmd: list[str], out_dir: str | os.PathLike[str],
                 data: str | os.PathLike[str] | None) -> Path:
    if not cmd:
        raise UsageError("no command to run: put it after `--`, e.g. "
                         "`autotune monitor -- python train.py`")
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"output directory {out}: {e.strerror}", setting="out_dir") from e
    if data is not None and not Path(data).exists():
        raise UsageError(f"dataset {data}: no such file or directory (give the dataset "
                         "directory, whose disk the monitor watches)", setting="data")
    return out


def _start(start: Callable[..., subprocess.Popen[bytes]], cmd: list[str],
           env: dict[str, str]) -> subprocess.Popen[bytes]:
    try:
        return start(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, env=env,
                     **{**_OWN_GROUP, "preexec_fn": _die_with(os.getpid())})
    except FileNotFoundError:
        raise UsageError(f"{cmd[0]}: command not found (check the PATH, or give the full "
                         "path)") from None
    except PermissionError:
        raise UsageError(f"{cmd[0]}: permission denied (not executable?)") from None


def _monitor(watch: str, pid: int, interval: float, gpu: bool, callback: Any,
             errors: list[str]) -> Any:
    from autotune.monitor import SystemMonitor

    try:
        return SystemMonitor(path=watch, pid=pid, interval=interval, gpu=gpu, callback=callback,
                             keep=False)
    except AutotuneError as e:   # the command is already gone: sample the system alone
        errors.append(str(e))
        return SystemMonitor(path=watch, pid=None, interval=interval, gpu=gpu,
                             callback=callback, keep=False)


class _NoForward:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _pump(proc: subprocess.Popen[bytes], tee: _Tee) -> None:
    """Copy both pipes into the tee until EOF, or a while after the command exited (an
    orphaned grandchild may keep a pipe open for ever)."""
    sel = selectors.DefaultSelector()
    for key, pipe in ((1, proc.stdout), (2, proc.stderr)):
        assert pipe is not None
        os.set_blocking(pipe.fileno(), False)
        sel.register(pipe, selectors.EVENT_READ, key)
    exit_seen: float | None = None
    try:
        while sel.get_map():
            events = sel.select(timeout=0.2)
            now = time.time()
            for skey, _ in events:
                try:
                    chunk = os.read(skey.fileobj.fileno(), 65536)  # type: ignore[union-attr]
                except BlockingIOError:
                    continue
                except InterruptedError:
                    continue
                if not chunk:
                    sel.unregister(skey.fileobj)
                    continue
                tee.feed(skey.data, chunk, now)
            tee.tick(now)
            if proc.poll() is not None:
                exit_seen = exit_seen or time.monotonic()
                if time.monotonic() - exit_seen > DRAIN_AFTER_EXIT_S:
                    break
    finally:
        sel.close()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
