"""The sampler thread: one `Sample` per interval of disk, CPU, process tree, /dev/shm, GPU."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from typing import IO, Any, Callable

from autotune.errors import AutotuneError
from autotune.monitor.cpu import CpuSnapshot, CpuUsage, cpu_usage, read_cpu_times
from autotune.monitor.diskstats import (DiskRates, DiskSnapshot, DiskStatsReader, disk_rates,
                                        resolve_disk)
from autotune.monitor.gpu import GpuReader, GpuUsage
from autotune.monitor.proctree import ProcessTree, TreeUsage
from autotune.monitor.records import Unavailable, to_jsonable
from autotune.monitor.shm import ShmUsage, shm_usage
from autotune.monitor.summary import RunningSummary
from autotune.readcap import read_cap


@dataclass(frozen=True)
class Sample:
    """Everything measured over one interval, stamped at its end.

    `disk` is None when no path was given, `proc` when no pid, `gpu` when gpu=False.
    """

    time: float            # time.time() at the end of the interval: joins with log timestamps
    monotonic: float       # time.monotonic() at the end: for deltas, immune to clock steps
    interval_s: float
    disk: DiskRates | Unavailable | None
    cpu: CpuUsage | Unavailable
    proc: TreeUsage | Unavailable | None
    shm: ShmUsage | Unavailable
    gpu: GpuUsage | Unavailable | None

    def to_dict(self) -> dict[str, Any]:
        return {"time": self.time, "monotonic": self.monotonic, "interval_s": self.interval_s,
                "disk": to_jsonable(self.disk), "cpu": to_jsonable(self.cpu),
                "proc": to_jsonable(self.proc), "shm": to_jsonable(self.shm),
                "gpu": to_jsonable(self.gpu)}


@dataclass
class _State:
    mono: float
    wall: float
    disk: DiskSnapshot | Unavailable | None
    cpu: CpuSnapshot | Unavailable


def _guard(fn: Callable[[], Any]) -> Any:
    # One failing reader must not stop the others or kill the thread.
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        return Unavailable(f"{type(e).__name__}: {e}")


def _rates(prev: Any, cur: Any, kind: type, rates: Callable[[Any, Any], Any]) -> Any:
    """The interval's rates of two snapshots; else why not (never a raw snapshot: a read
    that failed once, e.g. out of file descriptors, leaves the next interval without a
    start)."""
    if isinstance(prev, kind) and isinstance(cur, kind):
        return _guard(lambda: rates(prev, cur))
    if isinstance(cur, kind):
        return prev if isinstance(prev, Unavailable) else Unavailable(
            "no snapshot at the interval's start")
    return cur   # Unavailable, or None when not watched


class SystemMonitor:
    """Samples the system every `interval` seconds in a background thread.

    path:     a file or directory whose disk to watch (its partition is mapped to the disk);
              tmpfs, overlay, FUSE and network filesystems give `disk` Unavailable.
    pid:      root of a process tree (e.g. the training process; DataLoader workers and
              other descendants are included as they appear).
    gpu:      read NVML (lazily imported; Unavailable without driver or pynvml).
    callback: called in the sampler thread with each Sample; exceptions it raises are kept
              in `errors`, sampling goes on.
    pss:      also sum the tree's PSS (smaps_rollup; bench's own measurement tree): off for
              a user's job, whose page tables it would walk twice a second.
    keep:     keep every Sample for `records` and `write_jsonl`; False for a run of hours
              or days (`autotune monitor`: its callback writes each sample), which would
              otherwise hold some 300 MB a day. The summary is kept as samples arrive
              either way.

    Use as a context manager or with start()/stop(). The first sample arrives one interval
    after start(); stop() records a final, shorter sample covering the time since the last.
    Raises AutotuneError if `pid` does not exist or the interval is not positive.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, pid: int | None = None,
                 interval: float = 0.5, gpu: bool = True,
                 callback: Callable[[Sample], None] | None = None, pss: bool = False,
                 keep: bool = True) -> None:
        if not interval > 0:
            raise AutotuneError(f"monitor interval must be positive, got {interval!r} s")
        self.interval = float(interval)
        self.path = path
        self.pid = pid
        self.callback = callback
        self.errors: list[str] = []
        self._device = resolve_disk(path) if path is not None else None
        # The job's own cgroup's read cap on the disk, if any: where its reads are charged.
        self._disk = (None if self._device is None or isinstance(self._device, Unavailable)
                      else DiskStatsReader(self._device,
                                           cap=read_cap(self._device, pid or "self")))
        try:
            self._tree = ProcessTree(pid, pss=pss) if pid is not None else None
        except ProcessLookupError as e:
            raise AutotuneError(f"cannot monitor pid {pid}: {e}") from e
        self._gpu = GpuReader() if gpu else None
        self._records: list[Sample] = []
        self._keep = keep
        self._count = 0
        self._summary = RunningSummary(min_interval_s=self.interval / 2)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._first: _State | None = None
        self._last: _State | None = None
        self._cpu_s = 0.0      # sampler-thread CPU time spent measuring (time.thread_time)
        self._startup_cpu_s = 0.0
        self._mono_start = self._mono_end = 0.0

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> SystemMonitor:
        """Take the baseline and start the thread. A monitor runs once."""
        if self._thread is not None:
            raise RuntimeError("SystemMonitor.start() called twice")
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,),
                                        name="autotune-monitor", daemon=True)
        self._thread.start()
        ready.wait()   # the baseline is taken before start() returns
        return self

    def stop(self) -> None:
        """Stop the thread (after its final sample) and release NVML. Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._gpu is not None:
            self._gpu.close()

    def __enter__(self) -> SystemMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- results -------------------------------------------------------------------------
    @property
    def records(self) -> list[Sample]:
        """A copy of the samples so far (safe while the thread runs)."""
        if not self._keep:
            raise RuntimeError("SystemMonitor.records: this monitor keeps no samples "
                               "(keep=False); its callback was given each one as it came.")
        with self._lock:
            return list(self._records)

    @property
    def device(self) -> Any:
        """The BlockDevice watched, Unavailable (with the reason), or None (no path)."""
        return self._device

    def summary(self) -> dict[str, Any]:
        """median / p95 / max of the main figures, plus whole-window disk and CPU rates."""
        window: dict[str, Any] = {}
        f, l = self._first, self._last
        if f is not None and l is not None and l.mono > f.mono:
            if isinstance(f.disk, DiskSnapshot) and isinstance(l.disk, DiskSnapshot):
                window["disk"] = to_jsonable(_guard(lambda: disk_rates(f.disk, l.disk)))
            if isinstance(f.cpu, CpuSnapshot) and isinstance(l.cpu, CpuSnapshot):
                window["cpu"] = to_jsonable(_guard(lambda: cpu_usage(f.cpu, l.cpu)))
        with self._lock:
            out = self._summary.result()
        out["window"] = window
        out["overhead"] = self.overhead()
        return out

    def overhead(self) -> dict[str, float]:
        """CPU time the sampler thread spent measuring (the callback excluded).

        pct_of_core counts everything over the monitor's lifetime; steady_pct_of_core
        leaves out the one-time start (importing pynvml alone is ~45 ms of CPU).
        """
        end = self._mono_end or time.monotonic()
        wall = end - self._mono_start if self._mono_start else 0.0
        steady = self._cpu_s - self._startup_cpu_s
        return {"cpu_s": self._cpu_s, "startup_cpu_s": self._startup_cpu_s, "wall_s": wall,
                "samples": float(self._count),
                "pct_of_core": self._cpu_s / wall * 100.0 if wall > 0 else 0.0,
                "steady_pct_of_core": steady / wall * 100.0 if wall > 0 else 0.0,
                "per_sample_ms": steady / self._count * 1000.0 if self._count else 0.0}

    def write_jsonl(self, file: str | os.PathLike[str] | IO[str]) -> None:
        """Write every sample as one JSON object per line (to a path or an open text file)."""
        if hasattr(file, "write"):
            for r in self.records:
                file.write(json.dumps(r.to_dict()) + "\n")  # type: ignore[union-attr]
            return
        with open(file, "w", encoding="utf-8") as fh:
            self.write_jsonl(fh)

    # -- the thread ----------------------------------------------------------------------
    def _snapshot(self) -> _State:
        disk: DiskSnapshot | Unavailable | None
        if self._disk is not None:
            disk = _guard(self._disk.snapshot)
        else:
            disk = self._device  # Unavailable or None
        cpu = _guard(read_cpu_times)
        return _State(time.monotonic(), time.time(), disk, cpu)

    def _measure(self, prev: _State, cur: _State) -> Sample:
        dt = cur.mono - prev.mono
        disk: Any = _rates(prev.disk, cur.disk, DiskSnapshot, disk_rates)
        cpu: Any = _rates(prev.cpu, cur.cpu, CpuSnapshot, cpu_usage)
        proc = _guard(lambda: self._tree.sample(cur.mono)) if self._tree is not None else None
        gpu = _guard(self._gpu.read) if self._gpu is not None else None
        return Sample(time=cur.wall, monotonic=cur.mono, interval_s=dt, disk=disk, cpu=cpu,
                      proc=proc, shm=_guard(shm_usage), gpu=gpu)

    def _run(self, ready: threading.Event) -> None:
        t0 = time.thread_time()
        try:
            if self._gpu is not None:
                _guard(self._gpu.open)
            prev = self._snapshot()
            if self._tree is not None:
                _guard(lambda: self._tree.sample(prev.mono))  # baseline of the tree
            self._first = self._last = prev
            self._mono_start = prev.mono
        finally:
            self._startup_cpu_s = time.thread_time() - t0
            self._cpu_s += self._startup_cpu_s
            ready.set()
        deadline = prev.mono + self.interval
        while True:
            stopping = self._stop.wait(max(0.0, deadline - time.monotonic()))
            if stopping and time.monotonic() - prev.mono < 0.01:
                break   # nothing worth a sample since the last one
            t0 = time.thread_time()
            cur = self._snapshot()
            sample = self._measure(prev, cur)
            with self._lock:
                self._count += 1
                self._summary.add(sample)
                if self._keep:
                    self._records.append(sample)
            self._last = prev = cur
            self._cpu_s += time.thread_time() - t0
            if self.callback is not None:
                try:
                    self.callback(sample)
                except Exception as e:  # noqa: BLE001  (the caller's bug must not stop sampling)
                    self.errors.append(f"callback: {type(e).__name__}: {e}")
            if stopping:
                break
            # Stay on the fixed grid; if we fell behind (suspended, overloaded), skip ahead.
            deadline += self.interval
            now = time.monotonic()
            if deadline <= now:
                deadline = now + self.interval
        self._mono_end = time.monotonic()
