"""A pool that failed for a reason autotune caused, told apart from the user's own errors.

autotune's settings (workers, prefetch) fail in two ways torch reports as errors of the
training loop:

* **/dev/shm refused**: a worker's collate allocates the batch in shared memory and torch's
  allocator raises "unable to allocate shared memory(shm) for file </torch_…>: No space
  left on device" (or "unable to write to file </torch_…>", "unable to resize file
  </torch_…>"); it comes back as the worker's exception.
* **the open-files limit** (`ulimit -n`): too many batches' tensors in flight for it shows
  as "received 0 items of ancdata" or "Too many open files" in the training process
  (autotune.openfiles keeps a pool within it from the first batch on).
* **a worker killed**: by the OOM killer or anyone (SIGKILL), by a Bus error writing a batch
  into a full /dev/shm (SIGBUS), or SIGTERM. torch's SIGCHLD handler raises "DataLoader worker
  (pid X) is killed by signal" in the training thread wherever it is, mid-step too; the pools
  autotune may recover are therefore taken out of torch's registry of worker pids
  (`unregister`), and a worker's death is noticed where the loop waits for a batch: before
  the fetch, or by `watching` (this module's SIGCHLD handler interrupts a fetch blocked on
  the dead worker's batch; torch's own check would notice only after 5 s).

Anything else (an exception from the user's Dataset or collate_fn, a worker that died of a
segmentation fault) is the user's and raises as torch's would.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

# The signals that end a worker for a reason of ours (memory, a full /dev/shm) or from the
# outside; SIGSEGV, SIGABRT, SIGFPE and SIGILL come from the code a worker runs: the user's.
RECOVERABLE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGBUS, signal.SIGTERM})
_SHM_MARKERS = ("unable to allocate shared memory", "unable to write to file </torch_",
                "unable to resize file </torch_")
# The open-files limit (EMFILE): the training process could not take a batch's tensors.
_FILES_MARKERS = ("Too many open files", "received 0 items of ancdata", "[Errno 24]")


@dataclass(frozen=True)
class PoolFailure:
    """Why a pool failed: `kind` "shm", "files" (the open-files limit) or "killed",
    `detail` one line for the log."""

    kind: str
    detail: str


class WorkerGone(Exception):
    """Raised by the SIGCHLD handler into a fetch that waits on a pool whose worker died
    (torch's wait turns it into its own "exited unexpectedly" RuntimeError)."""


def dead_workers(procs: Iterable[Any]) -> list[tuple[int, int]]:
    """(pid, exitcode) of the worker processes that have ended (a negative code: the signal)."""
    out = []
    for p in procs:
        code = p.exitcode  # reaps it (waitpid WNOHANG)
        if code is not None:
            out.append((p.pid, code))
    return out


def ending(procs: Iterable[Any], wait_s: float) -> list[tuple[int, int]]:
    """dead_workers(procs), after waiting up to `wait_s` in all for them to end."""
    procs = list(procs)
    deadline = time.monotonic() + wait_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    return dead_workers(procs)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def killed(dead: list[tuple[int, int]]) -> PoolFailure | None:
    """A PoolFailure when every ended worker was killed by a signal of RECOVERABLE_SIGNALS."""
    if not dead or any(code >= 0 or -code not in RECOVERABLE_SIGNALS for _, code in dead):
        return None
    what = ", ".join(f"pid {pid} by {_signal_name(code)}" for pid, code in dead)
    hint = " (the OOM killer sends SIGKILL)" if any(-c == signal.SIGKILL for _, c in dead) else (
        " (a Bus error: /dev/shm full)" if any(-c == signal.SIGBUS for _, c in dead) else "")
    return PoolFailure("killed", f"worker killed: {what}{hint}")


def killed_error(dead: list[tuple[int, int]]) -> RuntimeError:
    """torch's own error for a worker that ended for a reason that is not ours."""
    pid, code = dead[0]
    if code < 0:
        return RuntimeError(f"DataLoader worker (pid {pid}) is killed by signal: "
                            f"{signal.strsignal(-code)}. ")
    return RuntimeError(f"DataLoader worker (pid {pid}) exited unexpectedly with exit code "
                        f"{code}. Details are lost due to multiprocessing. Rerunning with "
                        "num_workers=0 may give better error trace.")


def classify(exc: BaseException, procs: Iterable[Any]) -> PoolFailure | None:
    """The failure of ours that `exc` (raised while fetching from a pool with these worker
    processes) reports, or None: the user's error, to raise as it is."""
    msg = str(exc)
    if isinstance(exc, (EOFError, ConnectionError)) and _in_fd_handover(exc):
        # A worker killed (the OOM killer) while it handed a batch's tensors over: its
        # end of the connection closed under us (ConnectionResetError, or EOFError). Seen
        # in 2 runs of 21 of a worker SIGKILLed mid-run; it raised into the user's loop.
        procs = list(procs)
        # One that is still dying is waited for, up to a second, on this error path only.
        gone = killed(dead_workers(procs)) or killed(ending(procs, 1.0))
        if gone is not None:
            return gone
    handover = isinstance(exc, EOFError) and _in_fd_handover(exc)
    if handover:
        msg = "a worker could not hand a batch's tensors over (EOFError receiving them)"
    if handover or (isinstance(exc, (RuntimeError, OSError))
                    and any(m in msg for m in _FILES_MARKERS)):
        import resource

        lines = [ln.strip() for ln in msg.strip().splitlines() if ln.strip()]
        lim = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return PoolFailure("files", f"the open-files limit ({lim}, ulimit -n) refused a "
                           f"batch: {lines[-1] if lines else msg}")
    if isinstance(exc, (RuntimeError, OSError)) and (
            any(m in msg for m in _SHM_MARKERS)
            or ("No space left on device" in msg and "/torch_" in msg)):
        lines = [ln.strip() for ln in msg.strip().splitlines() if ln.strip()]
        return PoolFailure("shm", f"/dev/shm refused a batch: {lines[-1] if lines else msg}")
    if isinstance(exc, WorkerGone) or (isinstance(exc, RuntimeError)
                                       and "DataLoader worker (pid" in msg):
        return killed(dead_workers(procs))
    return None


def _in_fd_handover(exc: BaseException) -> bool:
    """Whether `exc` was raised receiving a tensor's file from a worker (torch's
    rebuild_storage_fd): the worker, past its open-files limit, closed the connection."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name in ("rebuild_storage_fd", "recvfds"):
            return True
        tb = tb.tb_next
    return False


def unregister(it: Any) -> None:
    """Take a multi-process iterator's workers out of torch's SIGCHLD check (its handler
    would raise in the training thread wherever it is when one dies)."""
    if getattr(it, "_worker_pids_set", False):
        from torch.utils.data._utils.signal_handling import _remove_worker_pids

        with contextlib.suppress(RuntimeError):
            _remove_worker_pids(id(it))
        it._worker_pids_set = False


# ---- noticing a death while the loop waits for a batch

_watched: tuple[Any, ...] = ()
_installed = False


def _install() -> None:
    """Chain this module's SIGCHLD handler before the one installed (torch's); main thread only."""
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGCHLD)

    def handler(signum: int, frame: Any) -> None:
        if callable(previous):
            previous(signum, frame)
        # A SIGCHLD comes from any child (a retired pool's worker, a sampler process): raise
        # only when a worker of the pool being waited on has ended.
        if _watched and any(p.exitcode is not None for p in _watched):
            raise WorkerGone("a worker of the serving pool ended")

    signal.signal(signal.SIGCHLD, handler)
    _installed = True


@contextlib.contextmanager
def watching(procs: list[Any]) -> Iterator[None]:
    """While the loop waits for a batch: a worker process of `procs` that ends interrupts the
    wait (forked and spawned workers; a forkserver's are its children, not ours, and are
    noticed by torch's own check every 5 s)."""
    global _watched
    if not procs:
        yield
        return
    _install()
    _watched = tuple(procs)
    try:
        yield
    finally:
        _watched = ()
