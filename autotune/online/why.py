"""Why AU stays under 0.90 after tuning: the verdict engine (autotune.verdict), fed the
loader's own figures.

One engine serves search, analyze and this loader. The loader gives it what it measured
itself (AU and the wait share over the windows, the step time, images/s, its settings,
the usable cores) and two budgets taken cheaply:

- the time budget of its own process tree (autotune.monitor.tasks.TaskSampler: where each
  worker's time went, on a CPU, runnable, blocked on storage, asleep), sampled for a few
  seconds by a separate process (`python -m autotune.monitor.burst PID SECONDS`), started
  only once tuning has settled under AU 0.90 (or at the worker bound, to see whether the
  workers are blocked on I/O: when tuning then settles there storage-bound, that budget is
  the verdict's, said at once), so that no sampling thread ever competes with the training
  loop for the GIL;
- for autotune's own ImageDataset, the stage budget (autotune.data.stages): a StageClock
  attached to the dataset, read at the burst's start and end;
- behind a read cap of its own cgroup on the dataset's disk (autotune.readcap), the cap and
  the reads the cgroup charged over the burst;
- under a CPU quota on its cgroup (autotune.monitor.quota), the share of the quota's periods
  in which it ran out over the burst: the verdict then names the quota (a container's
  --cpus), not the cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.online.measure import WindowStats
from autotune.thresholds import AU_HEALTHY

INPUT_BOUND_AU = AU_HEALTHY
BURST_S = 3.0             # the time budget's window: ~170 sweeps at 58 Hz
BURST_TIMEOUT_S = 30.0    # a sampler not done by then is given up (the verdict without it)


def attach_stage_clock(dataset: Any) -> Any:
    """A StageClock on autotune's own ImageDataset (one that has none), else None; the
    caller removes its file with `detach_stage_clock`. No import when the dataset cannot be
    one: an ImageDataset's module is loaded before one exists."""
    mod = sys.modules.get("autotune.data.torchds")
    if mod is None or not isinstance(dataset, mod.ImageDataset) \
            or getattr(dataset, "stage_clock", None) is not None:
        return None
    from autotune.data.stages import StageClock
    from autotune.verdict.bounds import MAX_WORKERS

    fd, path = tempfile.mkstemp(prefix="autotune-stages-", suffix=".bin")
    os.close(fd)
    os.unlink(path)  # StageClock.create makes it anew, O_EXCL
    clock = StageClock.create(path, MAX_WORKERS)
    dataset.stage_clock = clock
    return clock


def detach_stage_clock(dataset: Any, clock: Any) -> None:
    """Take the clock off the dataset and remove its file."""
    if clock is None:
        return
    if getattr(dataset, "stage_clock", None) is clock:
        dataset.stage_clock = None
    clock.close()
    try:
        os.unlink(clock.path)
    except OSError:
        pass


def _read_cap(path: str | None) -> tuple[Any, tuple[int, int] | None, str | None]:
    """(the ReadCap of this process's cgroup on `path`'s disk, its charged reads now, the
    disk's name); Nones without a cap."""
    if not path:
        return None, None, None
    try:
        from autotune.monitor.diskstats import resolve_disk
        from autotune.readcap import read_cap

        dev = resolve_disk(path)
        cap = read_cap(dev) if hasattr(dev, "majmin") else None
        return cap, (cap.charged() if cap is not None else None), getattr(dev, "name", None)
    except Exception:  # noqa: BLE001  (a figure, never a reason to fail the training loop)
        return None, None, None


def sampler_command(pid: int, seconds: float, workers: list[int] | None = None) -> list[str]:
    """The sampler's command line (autotune.monitor.burst): a light process, no torch."""
    return [sys.executable, "-m", "autotune.monitor.burst", str(pid), str(seconds),
            *([] if workers is None else [",".join(map(str, workers)) or "none"])]


class Burst:
    """A time-budget sample of process `pid`'s tree over `seconds`, by a separate process;
    `workers`: the only other processes to count (the loader's own workers, not the
    training process's other children: a FUSE server, a tool it runs)."""

    def __init__(self, pid: int, seconds: float = BURST_S,
                 workers: list[int] | None = None, path: str | None = None) -> None:
        self.started = time.perf_counter()
        self.seconds = seconds
        self.error: str | None = None
        # The read cap this process's cgroup puts on the dataset's disk (its workers share
        # the cgroup): read here, two small kernel files a burst.
        self._cap, self._charged0, self._device = _read_cap(path)
        # The CPU quota on this process's cgroup (its workers share it), its baseline taken.
        from autotune.monitor.quota import started

        self._quota = started(os.getpid())
        self._out = tempfile.TemporaryFile(mode="w+")
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (root, os.environ.get("PYTHONPATH")) if p))
        try:
            self._proc: subprocess.Popen[Any] | None = subprocess.Popen(
                sampler_command(pid, seconds, workers),
                stdout=self._out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, close_fds=True)
        except OSError as e:
            self._proc, self.error = None, f"the sampler could not start ({e})"
        # A burst dropped without cancel() (a loader collected without close(), the
        # interpreter exiting mid-burst) ends its sampler too, rather than leave it running
        # seconds past the loader (and Popen's "still running" ResourceWarning).
        self._end = weakref.finalize(self, _end_sampler, self._proc, self._out)

    def done(self) -> bool:
        """Whether the result is in (or the sampler failed or was given up)."""
        if self._proc is None:
            return True
        if self._proc.poll() is not None:
            return True
        if time.perf_counter() - self.started > BURST_TIMEOUT_S:
            self._proc.kill()
            self._proc.wait()
            self.error = f"the sampler did not finish in {BURST_TIMEOUT_S:.0f} s"
            return True
        return False

    def result(self) -> dict[str, Any]:
        """The monitor's "budget" section ({"available": False, "reason"} when it failed)."""
        if self._proc is None or self.error:
            return {"available": False, "reason": self.error or "no sampler"}
        self._out.seek(0)
        text = self._out.read()
        self._out.close()
        try:
            d = json.loads(text.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {"available": False, "reason": f"the sampler failed: {text.strip()[-300:]}"}
        if not isinstance(d, dict):
            return {"available": False, "reason": "no budget"}
        cap = self.cap_figures()
        if cap is not None:
            d["read_cap"] = cap
        quota = _quota_over(self._quota)
        if quota is not None:
            d["cpu_quota"] = quota
        return d

    def cap_figures(self) -> dict[str, Any] | None:
        """The cap's limits and what its cgroup charged a second since the burst began."""
        cap, c0 = self._cap, self._charged0
        c1 = cap.charged() if cap is not None else None
        wall = time.perf_counter() - self.started
        if cap is None or c0 is None or c1 is None or wall <= 0:
            return None
        return {"device": self._device, **cap.limits(),
                "reads_per_s": max(0, c1[0] - c0[0]) / wall,
                "read_mib_s": max(0, c1[1] - c0[1]) / 2**20 / wall}

    def cancel(self) -> None:
        self._end()


def _quota_over(q: Any) -> dict[str, Any] | None:
    """The quota's throttling over the burst (periods, throttled share), where one binds."""
    from autotune.monitor.quota import quota_section

    if q is None or not (quota_section(q) or {}).get("available"):
        return None
    t = q.totals()
    return t if t is not None and t.get("cores") is not None else None


def _end_sampler(proc: subprocess.Popen[Any] | None, out: Any) -> None:
    """Kill and reap a burst's sampler if it still runs; close its output file."""
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()
    out.close()


def merge(windows: list[WindowStats]) -> WindowStats | None:
    """Several windows as one (the figures over the burst)."""
    if not windows:
        return None
    return WindowStats(sum(w.batches for w in windows), sum(w.wait_s for w in windows),
                       sum(w.step_s for w in windows), max(w.noise for w in windows))


@dataclass
class Figures:
    """What the loader hands the engine."""

    stats: WindowStats
    loader: dict[str, Any]
    batch_size: int | None
    cores: int
    budget: dict[str, Any] | None
    stages: dict[str, Any] | None = None
    dataset: str | None = None
    worker_bound: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    ranks: int = 1        # this node's ranks: a next search measures as many at once


def explain(fig: Figures) -> Any:
    """The verdict (autotune.verdict.Verdict) from the loader's figures."""
    from autotune.monitor.figures import SystemFigures, stat_of
    from autotune.verdict.rules import RuleInputs, decide

    s = fig.stats
    ips = s.batches_per_s * fig.batch_size if fig.batch_size else None
    budget = dict(fig.budget) if fig.budget is not None else None
    cap = budget.pop("read_cap", None) if budget is not None else None
    quota = budget.pop("cpu_quota", None) if budget is not None else None
    system = SystemFigures(source="autotune.DataLoader", joined_by="time", samples=1,
                           samples_total=1, cores=fig.cores, budget=budget, cpu_quota=quota)
    if cap:
        # Over the burst as a whole: one figure, the figures' one-sample statistics.
        system.disk_device = cap.get("device")
        system.disk_read_cap = {"iops": cap.get("iops"), "mib_s": cap.get("mib_s")}
        system.disk_cap_reads_per_s = stat_of([cap["reads_per_s"]])
        system.disk_cap_read_mib_s = stat_of([cap["read_mib_s"]])
    # Under DDP the time budget is this rank's processes: it is judged against this rank's
    # share of the node's cores, not all of them (the other ranks' loaders fill the rest:
    # two ranks of one worker each on 2 cores read "the job wants 1.1 of 2 cores: raise
    # num_workers (up to about 1)", with 1 already running).
    cores = fig.cores
    if cores and fig.ranks > 1:
        cores = max(1, cores // fig.ranks)
    inp = RuleInputs(au=s.au, data_share=s.wait_share,
                     step_time_s=s.step_s / s.batches if s.batches else None,
                     images_per_s=ips, batch_size=fig.batch_size, steps=s.batches,
                     loader=fig.loader, job_cores=cores, system=system,
                     dataset=fig.dataset, worker_bound=fig.worker_bound, stages=fig.stages,
                     job_args=f"--procs-per-node {fig.ranks}" if fig.ranks > 1 else "")
    v = decide(inp)
    if cores != fig.cores:
        v.evidence.append(f"cores: this rank's share, {cores} of the node's {fig.cores} usable "
                          f"({fig.ranks} ranks on the node, each with its own loader)")
    return v
