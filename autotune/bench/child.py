"""The measurement process: one DataLoader configuration, timed, then a JSON result.

    python -m autotune.bench.child SPEC.json RESULT.json STATUS_FD GO_FD

Started by `autotune.bench.runner` in a new session (so its whole process group,
DataLoader workers included, can be killed). The handshake keeps library start-up out of
the cold measurement: the child imports torch, Pillow and the user's step, says "ready"
on STATUS_FD, and waits for one byte on GO_FD; meanwhile the parent drops the page cache.
Only then does the child scan the dataset and start the loader, as a fresh training job
with its libraries in memory would.

The result goes to RESULT.json (never stdout: a user's step may print), written by
rename so the parent never reads half a file. The child prints nothing itself.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import resource
import signal
import sys
import time
import traceback
import warnings
from typing import Any, Callable

from autotune.bench.procs import oom_first
from autotune.bench.procs import write_status as _status

_PR_SET_PDEATHSIG = 1


class StepFailed(Exception):
    """The user's --step raised; carries the original exception."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original


class EpochEnd(Exception):
    """A cold measurement reached the end of its first pass over the dataset."""


def _die_with_parent(parent: int) -> None:
    # If the bench parent is killed outright, do not measure on for nobody.
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(3)


def _worker_init(_worker_id: int) -> None:
    """DataLoader worker_init_fn: die with the measurement process. PyTorch's own watchdog
    only notices a dead parent every few seconds, and never in a stopped worker."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    _record_pid()


_PIDS_FILE: str | None = None  # the run's record of its processes (set by main)


def _start_record(spec: dict[str, Any]) -> None:
    """Record this process's pid, and its workers' as they start, in the run's scratch."""
    global _PIDS_FILE
    if spec.get("scratch"):
        from autotune.bench.shmleft import PIDS_NAME

        _PIDS_FILE = os.path.join(spec["scratch"], PIDS_NAME)
        _record_pid()


def _record_pid() -> None:
    """This process's pid, appended to the run's record in its scratch folder: a worker
    killed inside torch's allocation of a batch leaves /dev/shm/torch_<PID>_*, which the
    parent removes by these pids when the run ends (or, the parent killed too, the next
    run as it removes this run's folder: autotune.bench.shmleft)."""
    if _PIDS_FILE is None:
        return
    try:
        fd = os.open(_PIDS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{os.getpid()}\n".encode())
        finally:
            os.close(fd)
    except OSError:
        pass


TICK_S = 1.0  # how often the measurement reports its running images/s to the parent


def load_step(spec: str) -> Callable[[Any], Any]:
    """'module:function' or 'path/to/file.py:function' -> the function."""
    from autotune.bench.factory import load_user_code

    fn = load_user_code(spec)
    if not callable(fn):
        raise ImportError(f"{spec} is not a function")
    return fn


def _error(e: BaseException, phase: str) -> dict[str, Any]:
    orig = e.original if isinstance(e, StepFailed) else e
    tb = "".join(traceback.format_exception(type(orig), orig, orig.__traceback__))
    out = {"type": type(orig).__name__, "module": type(orig).__module__,
           "message": str(orig), "phase": phase, "traceback": tb[-6000:],
           "errno": getattr(orig, "errno", None)}
    try:  # /dev/shm as this process sees it (a container may have its own)
        st = os.statvfs("/dev/shm")
        out["shm_used_bytes"] = (st.f_blocks - st.f_bfree) * st.f_frsize
        out["shm_total_bytes"] = st.f_blocks * st.f_frsize
    except OSError:
        pass
    return out


class _PrimeData:
    """A few synthetic JPEGs held in memory: a dataset that reads no file."""

    def __init__(self, transform: Any, n: int) -> None:
        from autotune.synth import render_jpeg

        # Photo-like images (texture, varied sizes): the decoder's real code paths.
        self.data = [render_jpeg(12345, i)[0] for i in range(n)]
        self.transform, self.n = transform, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return self.transform(self.data[i]), i


def _prime_pipeline(transform: Any, cfg: Any) -> Any:
    """Run the whole loader path once on an in-memory JPEG, before the cache drop.

    Decoding, resizing, collating in a worker and passing the batch through shared
    memory touch code in libtorch and libjpeg that a fresh process has not paged in yet.
    Kept alive (one persistent worker) across the drop, those pages stay mapped, and a
    cache drop keeps mapped pages: the first cold batch then waits on the dataset, not
    on paging in libraries from what may be the same throttled disk. Returns the live
    iterator (the caller deletes it after the drop), or None without workers.
    """
    import numpy.random  # noqa: F401  (workers seed it at start)
    import torch.utils.data

    ds = _PrimeData(transform, 4)
    if cfg.num_workers == 0:
        torch.utils.data.default_collate([ds[0], ds[1]])
        return None
    loader = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=1, shuffle=True,
                                         drop_last=True, persistent_workers=True,
                                         worker_init_fn=_worker_init)
    it = iter(loader)
    next(it)
    next(it)
    return it


def _majflt(pid: int) -> int:
    """Major page faults of a process (/proc/PID/stat field 12): pages read from storage
    because a mapped file (library code, or memory the kernel paged out) was touched."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return int(data[data.rfind(b")") + 2:].split()[9])
    except (OSError, ValueError, IndexError):
        return 0


def _tree_io() -> dict[int, tuple[int, int, int]]:
    """pid -> (bytes read by read() calls, bytes fetched from storage, major faults) for
    this process and its workers (/proc/PID/io rchar and read_bytes, /proc/PID/stat)."""
    import psutil

    me = psutil.Process()
    out = {}
    for p in [me, *me.children(recursive=True)]:
        try:
            io = p.io_counters()
            out[p.pid] = (io.read_chars, io.read_bytes, _majflt(p.pid))
        except (psutil.Error, AttributeError):
            continue
    return out


def _io_delta(a: dict[int, tuple[int, int, int]], b: dict[int, tuple[int, int, int]]) -> dict[str, int]:
    rchar = rbytes = faults = 0
    for pid, (c, r, m) in b.items():
        c0, r0, m0 = a.get(pid, (0, 0, 0))  # a worker born in the window counts from zero
        rchar += max(0, c - c0)
        rbytes += max(0, r - r0)
        faults += max(0, m - m0)
    return {"read_chars": rchar, "read_bytes": rbytes, "major_faults": faults}


def _write_result(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def run(spec: dict[str, Any], status_fd: int, go_fd: int, out: dict[str, Any]) -> Any:
    """Measure; fills `out`; returns the live loader iterator (shut down by the caller)."""
    from autotune.bench.config import BenchConfig

    cfg = BenchConfig.from_dict(spec["config"])
    step_fn, primer = _prepare(spec, cfg, out)
    out["marks"]["ready"] = time.monotonic()
    out["phase"] = "ready"
    _status(status_fd, "ready")
    if not os.read(go_fd, 1):
        os._exit(3)  # the parent is gone
    out["marks"]["go"] = time.monotonic()
    del primer  # its worker exits; the pages it touched stay cached for ours
    loader = _build_loader(spec, cfg, out)
    return _measure(loader, cfg, _step(cfg, step_fn), status_fd, out,
                    getattr(loader.dataset, "stage_clock", None))


def _prepare(spec: dict[str, Any], cfg: Any, out: dict[str, Any]) -> tuple[Any, Any]:
    """Limits, libraries, the primed pipeline and the user's step, before the cache drop."""
    if cfg.max_open_files is not None:
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        lim = cfg.max_open_files if hard == resource.RLIM_INFINITY else min(cfg.max_open_files, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lim, hard))
    out["nofile_limit"] = resource.getrlimit(resource.RLIMIT_NOFILE)[0]

    # Everything a worker will need, imported now: after the cache drop these files
    # would be read from (possibly throttled) storage inside the measurement.
    import numpy  # noqa: F401
    import torch
    import torch.utils.data
    from PIL import Image, ImageEnhance  # noqa: F401

    from autotune.data.torchds import ImageDataset  # noqa: F401
    from autotune.data.transforms import build_transform
    from autotune_converters.registry import register_all

    register_all(spec.get("formats", []))  # formats the caller registered at run time
    Image.preinit()
    out["torch"] = torch.__version__
    out["cuda"] = bool(torch.cuda.is_available())
    primer = _prime_pipeline(build_transform(cfg.transform), cfg)
    out["phase"] = "step-import"
    step_fn = load_step(cfg.step) if cfg.step else None
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    return step_fn, primer


def _build_loader(spec: dict[str, Any], cfg: Any, out: dict[str, Any]) -> Any:
    """Scan the dataset (cold) and build the DataLoader the configuration describes."""
    import torch.utils.data

    from autotune.data.torchds import ImageDataset
    from autotune.data.transforms import build_transform
    from autotune_converters.registry import open_source
    from autotune_converters.source import MemorySource

    out["phase"] = "scan"
    if cfg.dataset_factory:
        return _factory_loader(spec, cfg, out)
    source = open_source(spec["dataset"], cfg.format)
    if cfg.in_memory:
        source = MemorySource(source, cfg.in_memory, seed=cfg.seed)
    out["dataset"] = source.info()
    out["marks"]["scanned"] = time.monotonic()
    kwargs = _loader_kwargs(cfg, _worker_init)
    transform = build_transform(cfg.transform)
    rank, world = int(spec.get("rank", 0)), int(spec.get("world", 1))
    if source.iterable:
        # Streamed shards: the dataset shuffles shards and a sample buffer itself and
        # splits shards by rank and worker; DataLoader must not add a sampler.
        # num_workers: ranks are equalized per worker index, so len(loader) needs it.
        dataset = source.dataset(transform, shuffle=cfg.shuffle, seed=cfg.seed,
                                 num_workers=cfg.num_workers,
                                 **({"rank": rank, "world_size": world} if world > 1 else {}))
        note = source.readers_note(cfg.num_workers, world)
        if note:
            out.setdefault("warnings", []).append(note)
    else:
        dataset = ImageDataset(source, transform)
    # autotune's own pipeline times its stages in each worker (autotune.data.stages).
    dataset.stage_clock = clock = _stage_clock(spec, cfg)
    if clock is not None:
        kwargs["collate_fn"] = clock.timed_collate(kwargs.get("collate_fn")
                                                   or torch.utils.data.default_collate)
    if source.iterable:
        loader = torch.utils.data.DataLoader(dataset, drop_last=True, **kwargs)
    else:
        loader = _map_loader(dataset, cfg, rank, world, kwargs)
    out["epoch_batches"] = len(loader)
    out["images"] = len(source)
    if out["epoch_batches"] == 0:
        raise ValueError(f"{spec['dataset']}: {len(source)} images is less than one batch of "
                         f"{cfg.batch_size}; use a smaller batch size or a larger dataset")
    return loader


def _stage_clock(spec: dict[str, Any], cfg: Any) -> Any:
    """A stage clock in the run's scratch folder, or None without one (a caller of
    run() that gave none)."""
    from autotune.data.stages import StageClock, clock_path

    if not spec.get("scratch"):
        return None
    return StageClock.create(clock_path(spec["scratch"]), cfg.num_workers)


def _loader_kwargs(cfg: Any, worker_init: Callable[[int], None]) -> dict[str, Any]:
    """Built-in settings as the registry applies them (worker-only ones with workers);
    loader_extra as it is (the caller registered and checked those)."""
    from autotune.params import loader_kwargs

    kwargs = {**loader_kwargs(cfg.loader_settings()), **cfg.loader_extra}
    if cfg.num_workers > 0:
        kwargs.update(timeout=cfg.batch_timeout_s, worker_init_fn=worker_init)
    return kwargs


def _factory_loader(spec: dict[str, Any], cfg: Any, out: dict[str, Any]) -> Any:
    """The DataLoader over the user's own dataset (autotune.bench.factory)."""
    import torch.utils.data

    from autotune.bench import factory

    out["phase"] = "factory"
    ud = factory.build(cfg.dataset_factory, spec["dataset"])
    out["dataset"] = ud.info(cfg.dataset_factory, spec["dataset"])
    out["marks"]["scanned"] = time.monotonic()
    kwargs = _loader_kwargs(cfg, _chain(ud.worker_init_fn, _worker_init))
    if ud.collate_fn is not None:
        kwargs["collate_fn"] = ud.collate_fn
    if ud.iterable:
        loader = torch.utils.data.DataLoader(ud.dataset, drop_last=True, **kwargs)
    elif ud.sampler is not None:
        loader = torch.utils.data.DataLoader(ud.dataset, sampler=ud.sampler, drop_last=True,
                                             **kwargs)
    else:
        loader = _map_loader(ud.dataset, cfg, int(spec.get("rank", 0)),
                             int(spec.get("world", 1)), kwargs)
    try:
        out["epoch_batches"] = len(loader)
    except TypeError:  # an IterableDataset without a length: the pass ends when it ends
        out["epoch_batches"] = None
    out["images"] = out["dataset"]["images"]
    if out["epoch_batches"] == 0:
        raise ValueError(f"{spec['dataset']}: the factory's dataset has {out['images']} samples, "
                         f"less than one batch of {cfg.batch_size}; use a smaller batch size")
    return loader


def _map_loader(dataset: Any, cfg: Any, rank: int, world: int, kwargs: dict[str, Any]) -> Any:
    """A map-style dataset's loader: shuffled (seeded); with ranks, this rank's share as
    DistributedSampler gives it (equal shares, the remainder dropped, as DDP does)."""
    import torch.utils.data

    if world > 1:
        sampler = torch.utils.data.distributed.DistributedSampler(
            dataset, num_replicas=world, rank=rank, shuffle=cfg.shuffle, seed=cfg.seed,
            drop_last=True)
        return torch.utils.data.DataLoader(dataset, sampler=sampler, drop_last=True, **kwargs)
    gen = torch.Generator()
    gen.manual_seed(cfg.seed)
    return torch.utils.data.DataLoader(dataset, shuffle=cfg.shuffle, drop_last=True,
                                       generator=gen, **kwargs)


def _chain(first: Any, then: Callable[[int], None]) -> Callable[[int], None]:
    if first is None:
        return then

    def both(worker_id: int) -> None:
        then(worker_id)
        first(worker_id)

    return both


def _step(cfg: Any, step_fn: Any) -> Callable[[Any], None]:
    """The training step: the user's function, or an emulated one that sleeps (the
    accelerator is busy; the CPU stays free for the workers)."""
    sleep_s = cfg.compute_ms / 1000.0

    def step(batch: Any) -> None:
        if step_fn is not None:
            try:
                step_fn(batch)
            except Exception as e:  # noqa: BLE001
                raise StepFailed(e) from e
        elif sleep_s > 0:
            time.sleep(sleep_s)

    return step


class _Batches:
    """The loader's batches, pass after pass; a cold run ends at its first pass's end (a
    second would be served from the page cache: not a cold figure)."""

    def __init__(self, loader: Any, cold: bool) -> None:
        self.loader, self.cold = loader, cold
        self.epochs = 1
        self.it = iter(loader)

    def next(self) -> Any:
        try:
            return next(self.it)
        except StopIteration:
            if self.cold:
                raise EpochEnd() from None
            self.epochs += 1
            self.it = iter(self.loader)  # part of the wait: the loop is blocked on input
            return next(self.it)


def _open_window(out: dict[str, Any], cfg: Any, status_fd: int,
                 clock: Any) -> tuple[dict[int, Any], dict[str, Any]]:
    """The window opens: the tree's read counters and the stage clock at its start."""
    # Storage reads of the window, from the kernel's per-process counters:
    # proof of where the bytes came from (page cache or disk).
    io0 = _tree_io()
    st0 = clock.totals() if clock is not None else {}
    out["phase"] = "measure"
    _status(status_fd, f"measure {cfg.seconds:g}")
    return io0, st0


def _close_window(out: dict[str, Any], cfg: Any, clock: Any, batches: list[list[float]],
                  opened: tuple[dict[int, Any], dict[str, Any]], start: float,
                  deadline: float | None) -> None:
    """The window's reads, stage budget, bounds and extension into `out`."""
    marks = out["marks"]
    io0, st0 = opened
    if batches:
        out["window_io"] = _io_delta(io0, _tree_io())
        if clock is not None:
            from autotune.data.stages import stage_budget

            out["stages"] = stage_budget(st0, clock.totals(), workers=cfg.num_workers,
                                         wall_s=batches[-1][3] - start)
    marks["window_start"] = start
    if deadline is not None and batches and batches[-1][3] > deadline:
        out["extended_s"] = batches[-1][3] - deadline
    marks["window_end"] = batches[-1][3] if batches else time.monotonic()


def _measure(loader: Any, cfg: Any, step: Callable[[Any], None], status_fd: int,
             out: dict[str, Any], clock: Any = None) -> Any:
    """Warm-up (excluded), then the window: each batch's wait and step, timed; with a
    stage clock, the pipeline's stage budget of the window."""
    from autotune.instrumentation import batch_len

    marks = out["marks"]
    src = _Batches(loader, cfg.cold)
    marks["loader_started"] = start = time.monotonic()
    warmup = cfg.effective_warmup
    out["phase"] = "warmup"
    _status(status_fd, f"warmup {warmup}")
    batches: list[list[float]] = []
    out["batches"] = batches
    warm_wait, done_warm = 0.0, 0
    deadline = start + cfg.seconds if warmup == 0 else None
    opened = _open_window(out, cfg, status_fd, clock) if warmup == 0 else ({}, {})
    stop_reason, window_images, last_tick = "time", 0, start
    try:
        while True:
            t0 = time.monotonic()
            batch = src.next()
            t1 = time.monotonic()
            marks.setdefault("first_batch", t1)
            step(batch)
            t2 = time.monotonic()
            if done_warm < warmup:
                done_warm += 1
                warm_wait += t1 - t0
                if done_warm == warmup:
                    # The window opens where the warm-up ended, as a plain loop's clock
                    # does: batches the workers finish while the counters below are read
                    # (psutil over the tree; slow on a busy machine) count in it, so must
                    # that time. (Opened after the read, it counted them for free.)
                    start = last_tick = t2
                    deadline = t2 + cfg.seconds
                    opened = _open_window(out, cfg, status_fd, clock)
                continue
            # drop_last: a batch whose size cannot be read holds batch_size samples.
            n = batch_len(batch) or cfg.batch_size
            batches.append([t1 - t0, t2 - t1, n, t2])
            window_images += n
            if t2 - last_tick >= TICK_S:
                # The running figure, so that a search can stop a clearly worse trial early.
                last_tick = t2
                _status(status_fd, f"tick {t2 - start:.3f} {window_images}")
            if deadline is not None and t2 >= deadline and (
                    len(batches) >= cfg.min_batches or t2 >= deadline + cfg.window_extension_s):
                # --seconds is the window's least length: one that holds fewer batches
                # than a figure needs stays open for them (a busy machine or a slow disk
                # makes each batch slower, not the figure wrong), up to its extension.
                break
    except EpochEnd:
        stop_reason = "epoch_end"
    _close_window(out, cfg, clock, batches, opened, start, deadline)
    out.update(stop_reason=stop_reason, epochs=src.epochs, warmup_done=done_warm,
               warmup_wait_s=warm_wait, phase="done")
    return src.it


def _mp_tempdir(spec: dict[str, Any]) -> None:
    """multiprocessing's folder for this process and its forked workers: the one the
    parent named (autotune.bench.mpdir), which it removes however the run ends. A worker
    that hands a batch over by file descriptor makes it (/tmp/pymp-*, holding its socket),
    and removes it only at a clean exit: the workers a Ctrl-C or a pruned trial's SIGKILL
    ended left theirs in /tmp, every run."""
    import multiprocessing

    folder = spec.get("mp_dir")
    if not folder:
        return
    # get_temp_dir() makes a folder only while this is unset (3.8-3.14); forked workers
    # copy the parent's process config.
    multiprocessing.current_process()._config["tempdir"] = folder


def main(argv: list[str]) -> int:
    spec_path, result_path, status_fd, go_fd = argv[1], argv[2], int(argv[3]), int(argv[4])
    with open(spec_path) as f:
        spec = json.load(f)
    _die_with_parent(int(spec["parent_pid"]))
    oom_first()
    _mp_tempdir(spec)
    _start_record(spec)
    out: dict[str, Any] = {"ok": False, "pid": os.getpid(), "marks": {}, "phase": "startup",
                           "warnings": []}
    it = None
    world = int(spec["config"].get("procs_per_node") or 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # Started by a search's warm interpreter: the libraries' import warnings were
        # raised there; raise them here, where a plain start would have (bench.warm).
        warm = sys.modules.get("autotune.bench.warm")
        for category, message in getattr(warm, "import_warnings", ()):
            warnings.warn(message, category)
        try:
            if world > 1 and "rank" not in spec:
                from autotune.bench.ranks import launch

                launch(spec, world, status_fd, go_fd, out)  # the ranks measure
            else:
                it = run(spec, status_fd, go_fd, out)
            out["ok"] = True
        except BaseException as e:  # noqa: BLE001  (everything becomes a result)
            phase = ("step" if isinstance(e, StepFailed) else getattr(e, "phase", None)
                     or out["phase"])
            out["error"] = _error(e, phase)
        seen: set[str] = set()
        for w in caught:
            msg = f"{w.category.__name__}: {w.message}"
            if msg not in seen:
                seen.add(msg)
                out["warnings"].append(msg)
    out["marks"]["result"] = time.monotonic()
    _write_result(result_path, out)
    _status(status_fd, "done")
    if not out["ok"]:
        # Workers may be hung or dead: do not wait on them; the parent kills the group.
        os._exit(1)
    del it  # orderly worker shutdown (joins the workers)
    # Skip interpreter finalization: libtorch's static destructors touch code pages never
    # used before, and on a throttled disk paging them in took seconds. The result is
    # written and the workers are joined; nothing is left to finalize.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
