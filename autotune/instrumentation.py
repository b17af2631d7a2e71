"""`autotune.instrument(loader)`: one line that records how long a training loop waits.

    for images, labels in autotune.instrument(loader, log="steps.jsonl"):
        train_step(images, labels)

For every step it appends one JSON line: when the batch was asked for (`t`, epoch
seconds), the time blocked in `next()` (`wait_s`, the data wait of DESIGN.md), the time
until the loop asked for the next batch (`step_s`: the training step, and whatever else
the loop body does), the batch size and the epoch and step numbers. `autotune analyze`
reads it (format `own`).

The first line of each writer is a header with the DataLoader's settings (workers,
prefetch, batch size, dataset root), the usable cores and the rank, so that the analysis
can say "2 workers on 16 cores" without being told.

Cost: two `perf_counter()` calls, one f-string and a list append per step; lines are
written in whole-line chunks with one `os.write` per second (or per 64 steps) on an
O_APPEND descriptor, so ranks sharing a file do not cut each other's lines. Measured by
scripts/bench_instrument.py.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import threading
import time
import warnings
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from autotune.errors import UsageError

T = TypeVar("T")

STEPS_LOG_ENV = "AUTOTUNE_STEPS_LOG"   # set by `autotune monitor`: DIR/steps.jsonl
DEFAULT_LOG = "steps.jsonl"
FORMAT_VERSION = 1
_FLUSH_LINES = 64
_FLUSH_S = 1.0


@dataclass(frozen=True)
class InstrumentSummary:
    """What an instrumented loop measured so far (all epochs, warm-up included)."""

    steps: int
    epochs: int
    wait_s: float
    step_s: float
    samples: int | None
    lost_lines: int = 0   # step lines that could not be written (full disk, I/O error)

    @property
    def data_wait_fraction(self) -> float | None:
        wall = self.wait_s + self.step_s
        return self.wait_s / wall if wall > 0 else None

    @property
    def au(self) -> float | None:
        """Accelerator utilization: time in the step / wall time."""
        wall = self.wait_s + self.step_s
        return self.step_s / wall if wall > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "epochs": self.epochs, "wait_s": self.wait_s,
                "step_s": self.step_s, "samples": self.samples,
                "data_wait_fraction": self.data_wait_fraction, "au": self.au,
                "lost_lines": self.lost_lines}


@dataclass
class StepTotals:
    """The running totals a recorder keeps; `line` counts one step and returns its line."""

    steps: int = 0
    epochs: int = 0
    wait_s: float = 0.0
    step_s: float = 0.0
    samples: int | None = 0      # None once a batch's size is not known

    def line(self, t: float, epoch: int, step: int, wait_s: float, step_s: float,
             batch_size: int | None, rank: str) -> str:
        self.steps += 1
        self.wait_s += wait_s
        self.step_s += step_s
        if batch_size is None:
            self.samples = None
            b = ""
        else:
            self.samples = None if self.samples is None else self.samples + batch_size
            b = f',"batch":{batch_size}'
        return step_line(t, epoch, step, wait_s, step_s, b, rank)

    def summary(self, lost: int) -> InstrumentSummary:
        return InstrumentSummary(self.steps, self.epochs, self.wait_s, self.step_s,
                                 self.samples, lost)


def _env_int(*names: str) -> int | None:
    for n in names:
        v = os.environ.get(n)
        if v is not None:
            try:
                return int(v)
            except ValueError:
                continue
    return None


def _dist_rank() -> tuple[int, int] | None:
    """(rank, world size) of an initialized torch.distributed process group, else None:
    ranks started by torch.multiprocessing.spawn have no RANK variable, only this."""
    import sys

    if "torch.distributed" not in sys.modules:   # never import torch for it
        return None
    dist = sys.modules["torch.distributed"]
    try:
        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # noqa: BLE001  (a backend torn down, a half-made group: no rank)
        return None
    return None


def rank_and_world() -> tuple[int | None, int | None]:
    """This process's rank and world size: $RANK/$WORLD_SIZE (torchrun), else
    $SLURM_PROCID/$SLURM_NTASKS, else an initialized torch.distributed group's."""
    rank, world = _env_int("RANK", "SLURM_PROCID"), _env_int("WORLD_SIZE", "SLURM_NTASKS")
    if rank is None and (got := _dist_rank()) is not None:
        rank, world = got
    return rank, world


def batch_len(item: Any) -> int | None:
    """Samples in a batch: the first dimension of the first tensor/array found in it."""
    x = item
    for _ in range(4):
        shape = getattr(x, "shape", None)
        if shape is not None:
            try:
                return int(shape[0]) if len(shape) else None
            except (TypeError, ValueError, IndexError):
                return None
        if isinstance(x, (list, tuple)) and x:
            x = x[0]
        elif isinstance(x, dict) and x:
            x = next(iter(x.values()))
        else:
            return None
    return None


def loader_info(iterable: Any) -> dict[str, Any]:
    """The DataLoader settings that matter to the analysis, read without importing torch."""
    info: dict[str, Any] = {"type": type(iterable).__name__}
    # autotune.DataLoader: the settings it runs or is starting, not the first batch's, made
    # in the training process before any worker starts (a Lightning callback's header is
    # written then, and said num_workers 0 of a loader that ran a worker throughout).
    planned = getattr(iterable, "planned_kwargs", None)
    planned = planned if isinstance(planned, dict) else {}
    for key in ("num_workers", "prefetch_factor", "batch_size", "pin_memory",
                "persistent_workers"):
        v = planned[key] if key in planned else getattr(iterable, key, None)
        if isinstance(v, (int, float, bool)) or v is None:
            if v is not None:
                info[key] = v
    if "batch_size" not in info:
        # Accelerate's prepared loader (DataLoaderShard) keeps its batch size in its
        # batch sampler (BatchSamplerShard), per process; its own batch_size is None.
        v = getattr(getattr(iterable, "batch_sampler", None), "batch_size", None)
        if isinstance(v, int) and not isinstance(v, bool):
            info["batch_size"] = v
    sampler = getattr(iterable, "sampler", None)
    if sampler is not None:   # RandomSampler under DDP: each rank reads the whole dataset
        info["sampler"] = type(sampler).__name__
    ds = getattr(iterable, "dataset", None)
    if ds is not None:
        info["dataset"] = _dataset_info(ds)
    return info


def _dataset_info(ds: Any) -> dict[str, Any]:
    """The Dataset's class, length, transform and root, as far as they can be read: a
    user's Dataset whose attributes raise (a __getattr__ over a config dict: KeyError)
    leaves them out, never stops the job's loop."""
    d: dict[str, Any] = {"type": type(ds).__name__}
    try:
        d["len"] = len(ds)
    except Exception:  # noqa: BLE001  (an IterableDataset has no length)
        pass
    try:
        transform = getattr(ds, "transform", None)
        if transform is not None:
            d["transform"] = _callable_name(transform)
        root = getattr(ds, "root", None) or getattr(getattr(ds, "source", None), "root", None)
        if root is not None:
            d["root"] = os.path.abspath(os.fspath(root))
    except Exception:  # noqa: BLE001
        pass
    return d


def _callable_name(fn: Any) -> str:
    """module.qualname of a function, or of an object's class (a transform pipeline)."""
    try:
        named = fn if isinstance(getattr(fn, "__qualname__", None), str) else type(fn)
        return f"{getattr(named, '__module__', None) or '?'}.{named.__qualname__}"[:200]
    except Exception:  # noqa: BLE001  (a user's object whose attributes raise)
        return "?"


def _usable_cores() -> int | float:
    """Affinity mask and cgroup CPU quotas of this process (autotune.cpus): the fractional
    figure under a quota (0.5), as the kernel enforces it."""
    from autotune.cpus import job_cores

    return job_cores()


class _Writer:
    """Whole lines to an O_APPEND file, in chunks; thread-safe; flushed at exit."""

    def __init__(self, path: str, append: bool) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if append else os.O_TRUNC)
        try:
            self.fd: int | None = os.open(path, flags, 0o644)
        except OSError as e:
            raise UsageError(f"autotune.instrument: cannot open the step log {path}: "
                             f"{e.strerror}; pass log= a writable path") from e
        self.path = path
        self.buf: list[str] = []
        self.last_flush = time.monotonic()
        self.lock = threading.Lock()
        self.lost = 0

    def add(self, line: str, now: float) -> None:
        self.buf.append(line)
        if len(self.buf) >= _FLUSH_LINES or now - self.last_flush >= _FLUSH_S:
            self.flush(now)

    def flush(self, now: float | None = None) -> None:
        with self.lock:
            if self.fd is None or not self.buf:
                return
            data = "".join(self.buf).encode()
            lines = len(self.buf)
            self.buf.clear()
            self.last_flush = time.monotonic() if now is None else now
            try:
                # One write() of whole lines: O_APPEND places it at the end atomically on
                # local filesystems, so another rank's lines never land inside ours.
                while data:
                    n = os.write(self.fd, data)
                    data = data[n:]
            except OSError as e:
                # A full disk must not kill the training job: the lines are lost, counted,
                # and said once (the analysis of this log would be missing steps).
                lost = data.count(b"\n") or lines
                if self.lost == 0:
                    warnings.warn(f"autotune.instrument: cannot write the step log {self.path} "
                                  f"({e.strerror or e}); step lines are lost and counted "
                                  "(InstrumentSummary.lost_lines); free space or pass log= "
                                  "another path", RuntimeWarning, stacklevel=2)
                self.lost += lost

    def close(self) -> None:
        self.flush()
        with self.lock:
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001  (interpreter shutdown)
            pass


class Instrumented(Generic[T]):
    """An iterable that yields what `iterable` yields and times every step.

    Iterate it as the original (each `iter()` is an epoch); other attributes (`dataset`,
    `sampler`, `batch_size`, ...) and `len()` pass through to the wrapped object.
    """

    def __init__(self, iterable: Iterable[T], log: str | os.PathLike[str] | None = None, *,
                 batch_size: int | None = None, append: bool = False,
                 rank: int | None = None) -> None:
        self.iterable = iterable
        self._log, self._given_rank, self._given_append = log, rank, append
        self._locate()
        self._fixed_batch = batch_size
        self._writer: _Writer | None = None
        self._lost = 0
        self._totals = StepTotals()
        # perf_counter for durations; one time.time() at start maps it to epoch seconds.
        self._pc0 = time.perf_counter()
        self._wall0 = time.time()

    # -- passthrough ---------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "iterable":  # not yet set (during unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.iterable, name)

    # -- results -------------------------------------------------------------------------
    def summary(self) -> InstrumentSummary:
        """Steps, wait and step time recorded so far by this object."""
        return self._totals.summary(self._writer.lost if self._writer is not None
                                    else self._lost)

    def flush(self) -> None:
        """Write buffered lines now (they are also written every second and at exit)."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flush and close the log file (iterating again reopens it in append mode)."""
        if self._writer is not None:
            self._writer.close()
            self._lost = self._writer.lost
            self._writer = None
            self._append = True

    # -- recording -----------------------------------------------------------------------
    def _locate(self) -> None:
        """The rank, world size, path and append mode, as far as they are known now."""
        env_rank, self._world = rank_and_world()
        self.rank = self._given_rank if self._given_rank is not None else env_rank
        self.path, shared = log_path(self._log, self.rank)
        self._append = self._given_append or shared

    def _open(self) -> _Writer:
        if self.rank is None and self._writer is None and not self._totals.epochs:
            # Made before init_process_group (a spawned rank knows its rank only then):
            # a rank that truncated the shared file would erase another's steps.
            self._locate()
        return open_log(self.path, self._append, rank=self.rank, world_size=self._world,
                        started=self._wall0, loader=loader_info(self.iterable),
                        batch_size=self._fixed_batch)

    def __iter__(self) -> Iterator[T]:
        if self._writer is None:
            self._writer = self._open()
        return self._steps_of(iter(self.iterable), self._totals.epochs, self._writer)

    def _steps_of(self, it: Iterator[T], epoch: int, w: _Writer) -> Iterator[T]:
        self._totals.epochs += 1
        pc = time.perf_counter
        mono = time.monotonic
        off = self._wall0 - self._pc0
        rank = "" if self.rank is None else f',"rank":{self.rank}'
        fixed_bs = self._fixed_batch
        i = 0
        # The step before the current one: (index, t_req as epoch s, t_got, wait, batch).
        prev: tuple[int, float, float, float, int | None] | None = None
        t_req = pc()
        try:
            while True:
                try:
                    item = next(it)
                except StopIteration:
                    return
                t_got = pc()
                if prev is not None:
                    self._record(w, epoch, prev, t_req - prev[2], rank, mono)
                bs = fixed_bs if fixed_bs is not None else batch_len(item)
                prev = (i, t_req + off, t_got, t_got - t_req, bs)
                yield item
                t_req = pc()
                i += 1
        finally:
            # The last step ends when the loop asks again (StopIteration) or leaves it
            # (break, exception: the generator is closed).
            if prev is not None:
                end = t_req if t_req > prev[2] else pc()
                self._record(w, epoch, prev, end - prev[2], rank, mono)
            w.flush()

    def _record(self, w: _Writer, epoch: int, prev: tuple[int, float, float, float, int | None],
                step_s: float, rank: str, mono: Any) -> None:
        step, t, _, wait, bs = prev
        w.add(self._totals.line(t, epoch, step, wait, step_s, bs, rank), mono())


# -- shared with other recorders (autotune.integrations.lightning) ------------------------

def log_path(log: str | os.PathLike[str] | None, rank: int | None) -> tuple[str, bool]:
    """The step log's path for this rank, and whether ranks share it (then appended to).

    `log` None: $AUTOTUNE_STEPS_LOG (set by `autotune monitor`), else steps.jsonl;
    "{rank}" in it becomes the rank. Ranks that share one file must not truncate each
    other's lines, so a known rank without "{rank}" in the path means append.
    """
    raw = os.fspath(log) if log is not None else os.environ.get(STEPS_LOG_ENV, DEFAULT_LOG)
    path = raw.replace("{rank}", str(rank if rank is not None else 0))
    return path, rank is not None and "{rank}" not in raw


def step_line(t: float, epoch: int, step: int, wait_s: float, step_s: float, batch: str,
              rank: str) -> str:
    """One step's JSON line; `batch` and `rank` are ready fragments (',"batch":64' or '')."""
    return (f'{{"t":{t:.6f},"epoch":{epoch},"step":{step},"wait_s":{wait_s:.6f},'
            f'"step_s":{step_s:.6f}{batch}{rank}}}\n')


def open_log(path: str, append: bool, *, rank: int | None, world_size: int | None,
             started: float, loader: dict[str, Any], batch_size: int | None = None,
             extra: dict[str, Any] | None = None) -> _Writer:
    """Open a step log and write its header line (format `own`); closed at exit.
    `extra`: more header keys (what recorded the log, where its wait comes from)."""
    w = _Writer(path, append)
    header = {"autotune": "steps", "version": FORMAT_VERSION, "pid": os.getpid(),
              "host": socket.gethostname(), "rank": rank, "world_size": world_size,
              "started": started, "cores": _usable_cores(), "loader": loader, **(extra or {})}
    if batch_size is not None:
        header["batch_size"] = batch_size
    w.add(json.dumps(header) + "\n", time.monotonic())
    w.flush()
    ref = weakref.ref(w)
    atexit.register(lambda: (lambda x: x.close() if x is not None else None)(ref()))
    return w


def instrument(iterable: Iterable[T], log: str | os.PathLike[str] | None = None, *,
               batch_size: int | None = None, append: bool = False,
               rank: int | None = None) -> Instrumented[T]:
    """Wrap a DataLoader (any iterable) so that every step's data wait is recorded.

    Args:
        iterable: what the training loop iterates (a DataLoader, usually).
        log: JSONL file to write; "{rank}" in it is replaced by the rank. Default: the
            AUTOTUNE_STEPS_LOG environment variable (set by `autotune monitor` to
            DIR/steps.jsonl), else "steps.jsonl" in the current directory.
        batch_size: samples per batch, when the batches are not tensors/arrays whose first
            dimension says it.
        append: keep what the file holds (default: truncate it at the first iteration,
            unless a distributed rank is known and the path has no "{rank}": ranks then
            share the file in append mode).
        rank: the process's rank (default: $RANK, else $SLURM_PROCID, else the rank of an
            initialized torch.distributed group, as ranks started by
            torch.multiprocessing.spawn have: read at the first iteration if it is not
            known when the wrapper is made; else none).

    Returns an `Instrumented` that iterates like `iterable`; its `summary()` gives the
    totals. Nothing is printed; the file is flushed every second and at exit.
    """
    return Instrumented(iterable, log, batch_size=batch_size, append=append, rank=rank)
