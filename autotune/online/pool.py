"""One inner torch DataLoader (a pool of workers, or none) with one configuration.

Workers are always started with torch's persistent_workers machinery: a pool can then be
started idle (its lease yields nothing), come up while the old pool serves, and be handed
its first index batches only once every worker has run worker_init_fn (the flag each one
raises in shared memory). Whether a pool outlives an epoch is the configuration's
`persistent_workers`, decided by the loader.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import multiprocessing.util
import os
import shutil
import tempfile
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader as TorchLoader

from autotune.bench import mpdir
from autotune.bench.procs import oom_first
from autotune.bench.shmleft import remove_left
from autotune.monitor.proctree import pid_alive
from autotune.online import failure
from autotune.online.config import Config
from autotune.online.stream import IndexStream, Lease

log = logging.getLogger("autotune.online")


class ReadyInit:
    """worker_init_fn wrapper: this worker's multiprocessing folder, the user's function,
    then this worker's ready flag (None: no flag). `oom_first`: a worker of a pool
    autotune chose is the OOM killer's first choice (autotune.bench.procs.oom_first), so
    that where memory runs out it is a worker that goes, and the loader falls back to
    fewer (autotune.online.fallback), not the training process, the largest.

    Module-level so that spawn and forkserver workers can unpickle it."""

    def __init__(self, user_fn: Callable[[int], None] | None, flags: Any,
                 mp_dir: str | None = None, oom_first: bool = False) -> None:
        self.user_fn, self.flags, self.mp_dir = user_fn, flags, mp_dir
        self.oom_first = oom_first
        # The training process, made here, in it: its workers check it is still there.
        self.main_pid = os.getpid()

    def __call__(self, worker_id: int) -> None:
        # multiprocessing's internals, which another Python may lay out otherwise: a
        # release that fails must not fail the worker.
        with contextlib.suppress(Exception):
            release_forkserver()
        if self.oom_first:
            oom_first()
        if self.mp_dir is not None:
            use_temp_dir(self.mp_dir)
        if self.user_fn is not None:
            self.user_fn(worker_id)
        # torch's watchdog takes the worker's parent as it is when its loop begins, just
        # after this: a worker still starting (a spawn worker's second, a pool started
        # beside the serving one) when the training process is killed would take its
        # adopter (init) for it and wait for indices for ever. SystemExit passes torch's
        # `except Exception` and ends the worker as its watchdog would.
        if not pid_alive(self.main_pid):
            raise SystemExit(0)
        if self.flags is not None:
            self.flags[worker_id] = 1


def release_forkserver() -> None:
    """In a worker the forkserver started: close its copy of the pipe whose end tells the
    forkserver that the training process is gone. The forkserver hands every child one
    (Python uses it for nothing there: a child that starts processes of its own starts a
    forkserver of its own), so it outlived a training process killed by SIGTERM, its
    workers with it: torch's watchdog watches a worker's parent, here the forkserver,
    which waited for its children's copies to close. Released, the forkserver exits with
    the training process, and the watchdog then ends the workers within 5 s."""
    from multiprocessing import forkserver

    fs = forkserver._forkserver  # multiprocessing's own record: no public accessor
    fd = getattr(fs, "_forkserver_alive_fd", None)
    if fd is None or fs.get_inherited_fds() is None or fs._forkserver_pid is not None:
        return  # not a forkserver's child, or the fd is this process's own forkserver's
    with contextlib.suppress(OSError):
        os.close(fd)
    fs._forkserver_alive_fd = None


def use_temp_dir(folder: str) -> None:
    """In a worker: put its sockets in `folder`, the main process's multiprocessing folder.
    A forked worker has it already (it copies the process's config); a spawn or forkserver
    one starts a new interpreter whose config has no folder, and made its own under TMPDIR:
    under a long TMPDIR its socket's bind failed and torch waited for its batch for ever,
    and one killed outright left its folder behind. Set here, through worker_init_fn, rather
    than by the environment the workers start with: spawn passes the parent's os.environ,
    which the main process would have to change (TMPDIR for the user's threads too, and for
    the user's code in the workers); torch's worker loop runs worker_init_fn before it sends
    any batch, and nothing before it needs the folder. One a worker already made (its
    dataset's unpickling) is kept where its sockets fit: its own exit removes it."""
    cfg = multiprocessing.current_process()._config  # multiprocessing's own record of it
    here = cfg.get("tempdir")
    if here is None or not mpdir.fits(here):
        cfg["tempdir"] = folder


def index_kwargs(source: Any, *, iterable: bool, auto_collation: bool) -> dict[str, Any]:
    """How an inner DataLoader draws its indices from `source`: as its batch_sampler (auto
    collation), or as a sampler of whole batches; nothing for an IterableDataset (its
    batch_size and drop_last are in the common keywords; torch refuses a sampler there)."""
    if iterable:
        return {}
    if auto_collation:
        return {"batch_sampler": source}
    return {"batch_size": None, "sampler": source}


class Pool:
    """An inner DataLoader over a lease of the epoch's index batches (map-style) or over the
    dataset itself (IterableDataset)."""

    def __init__(self, dataset: Any, config: Config, common: dict[str, Any], *,
                 auto_collation: bool, iterable: bool, generator: torch.Generator,
                 mp_context: Any, worker_init_fn: Callable[[int], None] | None,
                 recoverable: bool = False) -> None:
        self.config = config
        # Workers autotune chose: out of torch's SIGCHLD check (autotune.online.failure).
        self.recoverable = recoverable
        self.lease = Lease()
        self.delivered = 0
        self.started_at: float | None = None
        # Wall time before any worker exists: its /dev/shm leftovers are made after it.
        self.made_at = time.time()
        self.ready_at: float | None = None
        self.it: Any = None
        self._starter: threading.Thread | None = None
        self._start_error: BaseException | None = None
        w = config.num_workers
        # What its workers hold of the dataset, where a kept pool is checked against it
        # (set by Epoch.new_pool).
        self.dataset_state: tuple[Any, ...] | None = None
        self._forks = w > 0 and start_method(mp_context) == "fork"
        # A RawArray is lock-free to read: the main process polls it once per batch.
        self._flags = multiprocessing.RawArray("b", w) if w else None
        mp_dir = None
        if w:
            _stopped_at_exit(self)
            # Every start method: a forkserver's own socket is in this process's folder too.
            mp_dir = share_temp_dir()
        kw = dict(common, **index_kwargs(self.lease, iterable=iterable,
                                         auto_collation=auto_collation))
        if w:
            kw.update(num_workers=w, prefetch_factor=config.prefetch_factor,
                      persistent_workers=True, multiprocessing_context=mp_context,
                      worker_init_fn=ReadyInit(worker_init_fn, self._flags, mp_dir,
                                               oom_first=recoverable))
        else:
            # timeout= is the workers' (torch asserts it is 0 without them).
            kw.update(worker_init_fn=worker_init_fn, timeout=0)
        with _quiet():
            self.loader = TorchLoader(dataset, pin_memory=config.pin_memory,
                                      generator=generator, **kw)

    def open(self, stream: IndexStream | None, start: int = 0) -> float:
        """Point the lease at `stream` from `start` (None: idle) and (re)start the inner
        iterator; the first call starts the workers. Returns the seconds it took here.

        A pool started idle on a thread of its own (start_idle) is opened only once that
        thread is done: its inner iterator is then the one reset here. Opened while it is
        still starting (an epoch ending before the new workers are up hands the pool to the
        next epoch), torch would make a second inner iterator beside the first, and the
        index batches the first took from the stream would be lost."""
        t = time.perf_counter()
        if self._starter is not None and self._starter is not threading.current_thread():
            self._starter.join()
        self.lease.assign(stream, start)
        self.delivered = 0
        if self.started_at is None:
            self.started_at = t
        with _quiet():
            self.it = iter(self.loader)
        if self.recoverable:
            failure.unregister(self.it)
        return time.perf_counter() - t

    def start_idle(self) -> float:
        """Start the workers with an idle lease while another pool serves; the seconds it
        took here. Forked workers start in this thread (a fork takes milliseconds, and
        forking while the training thread runs would copy whatever locks it holds). Spawn
        and forkserver workers start on a thread of their own: each `Process.start` waits
        until the new interpreter has imported the script and read the pickled dataset,
        about a second a worker, which would stall the training loop at every switch.
        That thread is not a daemon: the interpreter waits for it at exit (a daemon thread
        still starting workers then aborted the process, "terminate called without an
        active exception", and leaked the semaphores of the workers' queues)."""
        if self._forks or not self.config.num_workers:
            return self.open(None)
        self.started_at = time.perf_counter()
        self._starter = threading.Thread(target=self._start, name="autotune-pool-start",
                                         daemon=False)
        self._starter.start()
        return time.perf_counter() - self.started_at

    def _start(self) -> None:
        try:
            self.open(None)
        except BaseException as e:  # noqa: BLE001 (told as a pool that could not start)
            self._start_error = e

    def _started(self) -> bool:
        """The inner iterator exists (its workers were started)."""
        if self._starter is None:
            return True
        if self._starter.is_alive():
            return False
        self._starter.join()
        return self._start_error is None

    def ready(self) -> bool:
        """Every worker has run worker_init_fn (always, without workers)."""
        if self._flags is None:
            return True
        if not self._started():
            return False
        if self.ready_at is None and all(self._flags):
            self.ready_at = time.perf_counter()
        return self.ready_at is not None

    def died(self) -> bool:
        """A worker exited while the pool was coming up (or they could not be started)."""
        if self._starter is not None and not self._starter.is_alive() and \
                self._start_error is not None:
            return True
        return any(p.exitcode is not None for p in self._procs())

    def next(self) -> Any:
        batch = next(self.it)
        self.lease.delivered(self.lease.start + self.delivered)
        self.delivered += 1
        return batch

    @property
    def done(self) -> bool:
        """Every batch of a closed lease has been delivered."""
        le = self.lease
        return le.stop is not None and self.delivered >= le.stop - le.start

    def procs(self) -> list[Any]:
        """The worker processes (none before they are started, or without workers)."""
        return self._procs()

    def _procs(self) -> list[Any]:
        # torch keeps the worker processes on its iterator; there is no public accessor.
        return list(getattr(self.it, "_workers", None) or [])

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs() if p.pid is not None]

    def drop_held(self) -> None:
        """Drop the batches received ahead of their turn: each tensor an open file (torch's
        default sharing) and a /dev/shm file. A failed pool's iterator outlives its pool
        (the error's traceback holds it) while the next pool forks, and every new worker
        inherited ~900 such files under ulimit -n 1024: the next pool hung on EMFILE. Only
        for a pool that is done: its iterator cannot deliver them any more."""
        info = getattr(self.it, "_task_info", None)
        if isinstance(info, dict):
            info.clear()

    def shutdown(self) -> list[int]:
        """Stop the workers and return the pids still present afterwards (should be none)."""
        if self._starter is not None:
            self._starter.join()  # a pool retired while starting: stop what it started
        pids = self.pids()
        stop = getattr(self.it, "_shutdown_workers", None)
        if stop is not None:
            stop()
        self.drop_held()
        self.it = None
        # A worker whose batch /dev/shm refused (ENOSPC), or that was killed between torch's
        # shm_open and its unlink, leaves the batch's file there for good: in a container's
        # 64 MiB /dev/shm, one per fallback, run after run.
        remove_left(pids, self.made_at)
        return [p for p in pids if pid_alive(p)]


_LIVE: weakref.WeakSet[Pool] = weakref.WeakSet()
_EXIT_PID: int | None = None


def _stopped_at_exit(pool: Pool) -> None:
    """Stop `pool` when the interpreter exits, if it is still running then."""
    global _EXIT_PID
    if _EXIT_PID != os.getpid():
        _EXIT_PID = os.getpid()
        atexit.register(_at_exit)   # after multiprocessing's own handler: runs before it
    _LIVE.add(pool)


def _at_exit() -> None:
    """Stop the pools still running (the kept workers of a finished loop) in order, before
    multiprocessing's exit handler terminates their workers: a worker that SIGTERM ends
    never removes its /tmp/pymp-* folder, and kept workers left one each, every run, where
    torch's default (new workers every epoch) leaves none."""
    if _EXIT_PID != os.getpid():
        return
    for pool in list(_LIVE):
        try:
            pool.shutdown()
        except Exception:  # noqa: BLE001 (the interpreter is exiting: nothing to tell)
            pass


def share_temp_dir() -> str | None:
    """Make this process's multiprocessing folder (/tmp/pymp-*) before starting workers, so
    that they put their sockets in it rather than each making its own (forked ones copy it,
    spawned ones are told, use_temp_dir): a worker handing a batch's descriptor over listens
    on a socket there, and one killed (the OOM killer, a fallback's SIGKILL) never removes
    its own folder; this process removes its folder at exit. Under a TMPDIR too long for a
    socket's path (about 75 bytes: a pytest tmp_path, a deep job folder) every worker's bind
    failed and torch waited for its batch for ever, in a loop that ran without workers
    before autotune chose some: the folder is then a short one (mpdir.short_folder), said
    once. Returns the folder; None where none could be made (the workers make their own)."""
    cfg = multiprocessing.current_process()._config  # multiprocessing's own record of it
    if cfg.get("tempdir") is None and not mpdir.fits(
            os.path.join(tempfile.gettempdir(), "pymp-12345678")):
        short = mpdir.short_folder()
        log.log(logging.INFO if short else logging.WARNING,
                "TMPDIR %s is too long for the DataLoader workers' sockets (107 bytes a "
                "path): %s", tempfile.gettempdir(), f"their folder is {short}" if short else
                "no shorter folder could be made; set TMPDIR to a shorter path",
                extra={"autotune_event": "tmpdir", "autotune": {"folder": short}})
        if short is not None:
            cfg["tempdir"] = short
            multiprocessing.util.Finalize(None, shutil.rmtree, args=(short, True),
                                          exitpriority=-100)
    with contextlib.suppress(OSError):
        return multiprocessing.util.get_temp_dir()
    return None


def start_method(ctx: Any) -> str:
    """The start method of a DataLoader's multiprocessing_context (None: the default)."""
    if ctx is None:
        return multiprocessing.get_start_method()
    if isinstance(ctx, str):
        return ctx
    return ctx.get_start_method()


# torch's, at each new iterator of a loader with pin_memory=True and no accelerator. A
# pool per configuration, each made inside catch_warnings() (which resets Python's
# once-per-location record), repeated it at every pool; warn_unpinned says it once instead.
UNPINNED = "'pin_memory' argument is set as true but no accelerator"


def warn_unpinned(fixed: dict[str, Any]) -> None:
    """Once per loader, at the user's line (the caller's caller): pin_memory=True given on
    a machine without an accelerator pins nothing, as torch's own DataLoader would say."""
    if not fixed.get("pin_memory"):
        return
    available = getattr(getattr(torch, "accelerator", None), "is_available", None)
    if (available or torch.cuda.is_available)():
        return
    warnings.warn(f"pin_memory=True has no effect here: no accelerator for torch "
                  f"{torch.__version__}, so batches are not pinned.", stacklevel=3)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """torch warns when workers outnumber the CPUs; the worker bound decides that here (more
    than the cores only while workers wait on I/O). Its pin_memory warning is the loader's
    (warn_unpinned)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        warnings.filterwarnings("ignore", message=UNPINNED)
        yield


__all__ = ["Pool", "ReadyInit", "share_temp_dir", "use_temp_dir"]
