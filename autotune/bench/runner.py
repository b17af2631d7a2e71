"""run_bench: one configuration in a fresh process, cold, monitored from outside.

Sequence:
  1. spawn `python -m autotune.bench.child` in a new session (its process group holds the
     DataLoader workers too);
  2. watch its process tree with SystemMonitor from this process, so sampling costs the
     measured processes nothing;
  3. when the child has imported torch and says "ready", move it under the I/O cap if
     one is given, drop the page cache, then say "go";
  4. wait for it under a hard timeout; kill the whole group whatever happened, reap
     orphaned workers, check with /proc that nothing of the group is left;
  5. hand its per-batch timings and the monitor samples to `assemble.build_result`.
The library never prints; `progress` receives one-line status messages.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from autotune.bench import mpdir, procs
from autotune.bench.shmleft import recorded, remove_left
from autotune.bench.procs import StatusPipe
from autotune.bench.assemble import build_result, write_timeline
from autotune.bench.config import BenchConfig
from autotune.bench.residency import resident_fraction
from autotune.bench.result import BenchResult
from autotune.cache import make_cold, ram_backed
from autotune.errors import AutotuneError, NotPermitted, UsageError
from autotune.monitor import SystemMonitor
from autotune.monitor.quota import quota_section, started
from autotune.monitor.run import budget_section
from autotune.monitor.tasks import TaskSampler
from autotune.runqueue import RunQueueSampler
from autotune_converters import registry
from autotune_converters.objstore.url import is_s3
from autotune_converters.registry import open_source
from autotune_base.fsutil import PidLock
from autotune_converters.registry import resolve as resolve_format

Progress = Callable[[str], None]
Popen = Callable[..., subprocess.Popen]

_LOG_TAIL = 4000
_TMP_PREFIX = "autotune-bench-"
_TMP_LOCK = "lock"  # flock'ed by the run that owns the folder


def _remove_stale_tmp() -> None:
    """Remove the scratch folders of bench runs that are gone (killed before their `finally`
    could): only folders of this user whose run's lock is free. A live run holds a flock on
    its folder's lock for as long as it runs, and the kernel drops it however the run dies,
    so no pid is consulted (pids differ across pid namespaces). A folder without a lock
    (another program's, an older autotune's) is left alone."""
    me = os.geteuid()
    for d in Path(tempfile.gettempdir()).glob(f"{_TMP_PREFIX}*-*"):
        try:
            st, lk = d.lstat(), (d / _TMP_LOCK).lstat()
        except OSError:
            continue
        if not (stat.S_ISDIR(st.st_mode) and stat.S_ISREG(lk.st_mode)) or st.st_uid != me:
            continue
        lock = PidLock(d / _TMP_LOCK, AutotuneError)
        try:
            lock.acquire()
        except (AutotuneError, OSError):
            continue  # its run is alive (or the lock is not ours): not ours to remove
        try:
            # Its workers' /dev/shm names (a worker killed in a batch's allocation), made
            # since its lock was, and its multiprocessing folder where that was beside it.
            remove_left(recorded(d), lk.st_ctime - 1.0)
            mpdir.remove(d, mpdir.recorded(d))
            shutil.rmtree(d, ignore_errors=True)
        finally:
            lock.release()


def _scratch() -> tuple[Path, PidLock]:
    """This run's scratch folder and the lock held on it until the run ends. The folder
    gets its final name (the one _remove_stale_tmp looks at) only once the lock is held."""
    hidden = Path(tempfile.mkdtemp(prefix=f".{_TMP_PREFIX}{os.getpid()}-"))
    lock = PidLock(hidden / _TMP_LOCK, AutotuneError).acquire()
    tmp = hidden.with_name(hidden.name[1:])
    os.rename(hidden, tmp)
    lock.path = tmp / _TMP_LOCK
    return tmp, lock


def _has_class_dir(root: Path) -> bool:
    with os.scandir(root) as it:
        return any(e.is_dir() and not e.name.startswith(".") for e in it)


def _oom_kills() -> int:
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _log_tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - _LOG_TAIL))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def run_bench(dataset: str | os.PathLike[str], config: BenchConfig | None = None, *,
              popen: Popen | None = None, throttle: Any = None,
              monitor_path: str | os.PathLike[str] | None = None,
              timeline: str | os.PathLike[str] | None = None,
              progress: Progress | None = None,
              on_tick: Callable[[float, float], str | None] | None = None) -> BenchResult:
    """Measure one DataLoader configuration on `dataset` (see BenchConfig).

    popen: how to start the measurement process (default subprocess.Popen), e.g. a
        wrapper that runs it in another namespace.
    throttle: an active `autotune.emulate.IoThrottle` (anything with add_pid(pid)): the
        measurement process joins it once torch and the step are imported, just before the
        cache drop, and its DataLoader workers, forked later, inherit the cap. Library
        start-up stays off the capped disk, as a job's libraries live on local disk while
        its dataset sits on the slow storage. (popen=cap.popen caps start-up too.)
    monitor_path: the path whose disk the monitor watches (default: the dataset; give
        the source directory when the dataset is a FUSE mirror of it).
    timeline: write every monitor sample, labelled with its phase, as JSONL there.
    on_tick: called about once a second during the window with (seconds into the window,
        running images/s); a returned string stops the measurement there: the result is
        failed with failure_kind "pruned" and that string as its reason (a search's pruner).

    Raises UsageError for a bad configuration or dataset. A measurement that fails
    (crashed or hung worker, full /dev/shm, too many open files, OOM, timeout) returns a
    BenchResult with failed=True, a reason and a hint; no process of it is left running.
    """
    cfg = (config or BenchConfig.from_preset()).validate()
    say = progress or (lambda _msg: None)
    t_begin = time.monotonic()
    root, fmt = _resolve_dataset(dataset, cfg)
    m = _Measurement(root, fmt, cfg, throttle, say, on_tick)
    m.prepare_cache()
    _remove_stale_tmp()
    tmp, lock = _scratch()
    mp_dir = None
    try:
        mp_dir = mpdir.make(tmp)
        # An s3:// dataset has no local disk to watch (the monitor records why).
        m.run(tmp, popen or subprocess.Popen, monitor_path or root, mp_dir)
        res = m.result(tmp)
        if timeline is not None:
            write_timeline(timeline, m.samples, m.child, m.marks, m.sections)
            res.timeline_file = str(timeline)
        res.seconds_total = time.monotonic() - t_begin
        return res
    finally:
        mpdir.remove(tmp, mp_dir)
        shutil.rmtree(tmp, ignore_errors=True)
        lock.release()


def _resolve_dataset(dataset: str | os.PathLike[str], cfg: BenchConfig) -> tuple[Any, str]:
    """The dataset's root (an s3:// URL or an absolute path) and its format, checked."""
    s3 = is_s3(dataset)
    root: Any = str(dataset) if s3 else Path(dataset).absolute()
    if s3 and cfg.dataset_factory:
        raise UsageError(f"{root}: --dataset-factory takes a local path; an s3:// dataset is "
                         "read by autotune's own reader.", setting="dataset_factory")
    if s3:
        fmt = resolve_format(root, cfg.format)  # its listing: one LIST, kept for the scan
    elif cfg.dataset_factory:
        from autotune.bench import factory

        factory.check(cfg.dataset_factory)
        if not root.exists():
            raise UsageError(f"{root}: no such file or directory.")
        fmt = "factory"
    else:
        fmt = resolve_format(root, cfg.format)
        _check_folder(root, fmt)
    return root, fmt


def _check_folder(root: Path, fmt: str) -> None:
    if fmt == "folder" and not root.is_dir():
        raise UsageError(f"{root}: not a directory (an image folder is DATASET/CLASS/IMAGE.jpg).")
    if fmt == "folder" and not _has_class_dir(root):
        raise UsageError(f"{root}: no class subfolders; an image folder is "
                         "DATASET/CLASS/IMAGE.jpg (labels are the sorted CLASS names).")


class _Measurement:
    """One measurement process, from spawn to a cleaned-up process group (see run_bench)."""

    def __init__(self, root: Path, fmt: str, cfg: BenchConfig, throttle: Any, say: Progress,
                 on_tick: Callable[[float, float], str | None] | None) -> None:
        self.root, self.fmt, self.cfg = root, fmt, cfg
        self.throttle, self.say, self.on_tick = throttle, say, on_tick
        self.cache: dict[str, Any] = {"cold": cfg.cold, "method": None}
        self.files: Sequence[str] | None = None
        self.proc: subprocess.Popen | None = None
        self.mon: SystemMonitor | None = None
        self.timed_out = False
        self.stopped: str | None = None
        self.phase = "startup"
        self.marks: dict[str, float] = {}
        self.cleanup: procs.Cleanup | None = None
        self.samples: list[Any] = []
        self.child: dict[str, Any] | None = None
        self.go_w = -1
        # Per monitor sample (by its monotonic time): the sections read beside it, "budget",
        # "sched" and "cpu_quota", added to its record (assemble.record).
        self.sections: dict[float, dict[str, Any]] = {}
        self.tasks: TaskSampler | None = None
        self.spawned_at = time.time()
        self.shm_removed: list[str] = []
        self.tmp: Path | None = None

    def prepare_cache(self) -> None:
        """What the cold (or warm, or in-memory) measurement needs to know beforehand."""
        cfg, cache = self.cfg, self.cache
        if is_s3(self.root):
            self._prepare_s3()
            return
        ram = ram_backed(self.root)
        if ram is not None and not cfg.in_memory:
            cache["ram_backed"] = ram
        if cfg.in_memory:
            cache["in_memory"] = cfg.in_memory
            cache["note"] = ("from memory: the images are held in the measurement process; "
                             "storage and the page cache play no part")
        elif not cfg.cold or os.geteuid() != 0:
            self.say(f"scanning {self.root}")
            self.files = self._files()
        if not cfg.cold and not cfg.in_memory:
            cache["resident_fraction_at_start"] = resident_fraction(self.files or [])
            cache["note"] = "warm: the page cache was left as it was (labelled in every output)"

    def _prepare_s3(self) -> None:
        """An s3:// dataset has no page cache of its own here: its objects travel over the
        network each read. 'Cold' drops this machine's page cache (root), which is the
        server's cache too only where the server runs on this machine (a local SeaweedFS
        or MinIO); a remote bucket's caches are the provider's and cannot be dropped."""
        cfg, cache = self.cfg, self.cache
        self.files = []
        cache["storage"] = "object"
        if cfg.in_memory:
            cache["in_memory"] = cfg.in_memory
            cache["note"] = ("from memory: the images are held in the measurement process; "
                             "storage plays no part")
        elif cfg.cold:
            cache["note"] = ("cold (object storage): this machine's page cache is dropped "
                             "(root), which holds the server's files only where the server "
                             "runs here; a remote store's own caches cannot be dropped")
        else:
            cache["note"] = "warm: the page cache was left as it was (labelled in every output)"

    def _files(self) -> Sequence[str]:
        """What a cold run evicts: the format's files, or everything under a factory's
        dataset path (autotune cannot know which of them the factory reads). As str: at
        1.28 million files a Path each cost the searching process ~400 MB a trial."""
        if self.fmt != "factory":
            return open_source(self.root, self.fmt).file_paths()
        if self.root.is_file():
            return [str(self.root)]
        return [os.path.join(d, f) for d, _dirs, fs in os.walk(self.root) for f in fs]

    def run(self, tmp: Path, popen: Popen, watch_path: Path | str,
            mp_dir: str | None = None) -> None:
        """Spawn, watch under the hard timeout, and kill the whole group whatever happened."""
        self.tmp = tmp
        spec = {"config": self.cfg.to_dict(), "dataset": str(self.root),
                "parent_pid": os.getpid(), "formats": registry.exported(),
                "scratch": str(tmp), "mp_dir": mp_dir}
        (tmp / "spec.json").write_text(json.dumps(spec))
        env = dict(os.environ)
        if is_s3(self.root):  # the child reads the parent's LIST: one per dataset
            from autotune_converters.objstore.client import LISTINGS_ENV, S3Config, hand_down

            hand_down(str(tmp), S3Config.from_env().endpoint_url)
            env[LISTINGS_ENV] = str(tmp)
        env = procs.child_env(env)
        status_r, status_w = os.pipe()
        go_r, self.go_w = os.pipe()
        cmd = [sys.executable, "-m", "autotune.bench.child", str(tmp / "spec.json"),
               str(tmp / "result.json"), str(status_w), str(go_r)]
        self.oom0 = _oom_kills()
        procs.acquire_subreaper()
        log = open(tmp / "child.log", "wb")
        try:
            self.say("starting the measurement process (importing torch)")
            self.spawned_at = time.time()
            self.proc = popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True,
                              pass_fds=(status_w, go_r), env=env)
            self.marks["spawn"] = time.monotonic()
            os.close(status_w)
            os.close(go_r)
            status_w = go_r = -1
            try:
                self.mon = SystemMonitor(path=watch_path, pid=self.proc.pid, pss=True,
                                         interval=self.cfg.monitor_interval_s,
                                         callback=self._sched_of(self.proc.pid)).start()
            except AutotuneError:
                self.mon = None  # the child already exited: its result or status tells why
            self._watch(StatusPipe(status_r))
        finally:
            self._end()
            for fd in (status_r, status_w, go_r, self.go_w):
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            log.close()

    def _sched_of(self, pid: int) -> Callable[[Any], None]:
        """Monitor callback: the tree's run-queue wait per sample (CPU-starved, or waiting
        on I/O?), kept by the sample's time for the verdict's figures."""
        rq = RunQueueSampler(pid)
        rq.sample(time.monotonic())  # the baseline
        # Where each process class's time goes, per sample interval (autotune.monitor.tasks);
        # a thread in this (the parent) process, never in the measurement process.
        self.tasks = tasks = TaskSampler(pid).start()
        # The job's CPU quota (a container's --cpus) and how often it ran out, per sample
        # interval (autotune.monitor.quota); None where no quota can be read.
        quota = started(pid)

        def on_sample(sample: Any) -> None:
            got = self.sections[sample.monotonic] = {"budget": budget_section(tasks)}
            q = quota_section(quota) if quota is not None else None
            if q is not None:
                got["cpu_quota"] = q
            try:
                u = rq.sample(sample.monotonic)
            except Exception as e:  # noqa: BLE001 - a figure, never a reason to stop
                got["sched"] = {"available": False, "reason": f"{type(e).__name__}: {e}"}
            else:
                got["sched"] = u.to_dict() if u is not None else None

        return on_sample

    def _watch(self, reader: StatusPipe) -> None:
        assert self.proc is not None
        deadline = self.marks["spawn"] + self.cfg.effective_timeout
        while self.proc.poll() is None:
            now = time.monotonic()
            if now >= deadline:
                self.timed_out = True
                break
            for line in reader.read(min(0.2, deadline - now)):
                word, _, arg = line.partition(" ")
                self._on_status(word, arg)
                if self.stopped:
                    break
            if self.stopped:
                break
        if self.timed_out or self.stopped:
            _kill_group(self.proc.pid)
        self.proc.wait()

    def _on_status(self, word: str, arg: str) -> None:
        if word == "ready":
            self._go()
        elif word == "warmup":
            self.phase = "warm-up"
            self.say(f"warm-up: {arg} batches (excluded)")
        elif word == "measure":
            self.phase = "measurement"
            self.say(f"measuring for {arg} s")
        elif word == "tick" and self.on_tick is not None:
            secs, images = (float(x) for x in arg.split())
            self.stopped = self.on_tick(secs, images / secs if secs > 0 else 0.0)
        elif word == "done":
            self.phase = "shutdown"
            self.say("stopping the workers")

    def _go(self) -> None:
        """The child has its libraries in memory: cap it, drop the cache, let it start."""
        assert self.proc is not None
        self.phase = "dataset scan"
        if self.throttle is not None:
            self.throttle.add_pid(self.proc.pid)
        if self.cfg.cold and is_s3(self.root) and os.geteuid() != 0:
            self.cache["method"] = None  # nothing local to evict, no right to drop the rest
        elif self.cfg.cold:
            self.say("dropping the page cache")
            try:
                self.cache["method"] = make_cold(self.files)
            except NotPermitted:  # root, but /proc/sys is read-only here
                self.files = self._files()
                self.cache["method"] = make_cold(self.files)
            if self.cache["method"] == "fadvise":
                left = resident_fraction(self.files or [])
                self.cache["resident_fraction_after_evict"] = left
                if left is None and self.files:
                    self.cache["resident_unchecked"] = (
                        "the eviction was not checked: mincore reports every page of a file "
                        "this user neither owns nor may write as cached (Linux 5.2+)")
        self.marks["go"] = time.monotonic()
        try:
            os.write(self.go_w, b"g")
        except BrokenPipeError:
            pass  # the child died meanwhile: its exit status tells why
        self.say(f"scanning the dataset, starting {self.cfg.num_workers} worker(s)")

    def _end(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                _kill_group(self.proc.pid)
                self.proc.wait()
            self.cleanup = procs.end_group(self.proc.pid, leader=self.proc.pid)
            # A worker killed inside torch's allocation of a batch left its /dev/shm name.
            # (1 s: file times are read from a coarse clock.)
            self.shm_removed = remove_left(
                self.cleanup.seen | {self.proc.pid} | (recorded(self.tmp) if self.tmp else set()),
                self.spawned_at - 1.0)
        procs.release_subreaper()
        if self.mon is not None:
            self.mon.stop()
            self.samples = self.mon.records
        if self.tasks is not None:
            self.tasks.stop()

    def result(self, tmp: Path) -> BenchResult:
        path = tmp / "result.json"
        if path.exists():
            try:
                self.child = json.loads(path.read_text())
            except ValueError:
                self.child = None
        return build_result(self.cfg, self.root, self.fmt, self.child, self.samples, self.cache,
                            self.proc, self.timed_out, self.phase, _log_tail(tmp / "child.log"),
                            _oom_kills() - self.oom0, self.cleanup, self.mon, self.marks,
                            stopped=self.stopped, sections=self.sections)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


