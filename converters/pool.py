"""Worker processes for a conversion: one pipe each, killable at any moment.

Not concurrent.futures: a ProcessPoolExecutor whose worker is killed mid-send (by us on
an error or Ctrl-C, or by the OOM killer) can leave its manager thread blocked on a half
message, and shutdown (even at interpreter exit) then hangs. Here each worker has its own
pipe; the parent waits on the pipes and the process sentinels together, so a dead worker
is an error naming the unit, and stopping is kill + join, never a hang.

Workers come from a forkserver (a clean process: nothing the parent opened, an LMDB
environment included, crosses a fork) and die with the parent: a watcher thread holds a
pidfd of the parent and kills its worker when the parent exits, kill -9 included.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection, wait
from typing import Any

from autotune_base.errors import ConvertError
from autotune_converters.records import set_progress_counter


def _watch_parent(pid: int) -> None:
    """Kill this worker as soon as process `pid` is gone.

    A forkserver worker's parent is the fork server, which outlives a killed converter
    (the workers hold its liveness pipe), so PR_SET_PDEATHSIG cannot do this.
    """
    import select

    try:
        fd = os.pidfd_open(pid)
        select.select([fd], [], [])
    except (OSError, AttributeError):  # no pidfd (old kernel, or pid gone): poll
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGKILL)


# The environment a worker must read as the converter's, not the fork server's: the fork
# server keeps the environment of the moment it started (in a long-lived process, an
# earlier conversion), so credentials or an endpoint set since would be missing.
_ENV_PREFIXES = ("AWS_",)


def _parents_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)}


def _worker_main(conn: Connection, work: Callable[[int], Any], slots: Any, slot: int,
                 parent: int, env: dict[str, str] | None = None) -> None:
    for k in [k for k in os.environ if k.startswith(_ENV_PREFIXES)]:
        del os.environ[k]
    os.environ.update(env or {})
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the parent decides
    set_progress_counter(slots, slot)
    while True:
        try:
            unit = conn.recv()
        except EOFError:
            return
        if unit is None:
            return
        try:
            out = work(unit)
        except BaseException as e:  # noqa: BLE001 (sent to the parent, which re-raises)
            try:
                conn.send(("err", unit, e))
            except Exception:  # noqa: BLE001 (an unpicklable exception: send its text)
                conn.send(("err", unit, ConvertError(f"{type(e).__name__}: {e}")))
            continue
        conn.send(("ok", unit, out))


_FIRST_UNIT_HINT = (
    ", its first. When convert() runs from a script, the call must be under "
    "`if __name__ == \"__main__\":`: workers import the script, which converts again "
    "(its error is printed above).")


class Progress:
    """What the workers report done, summed: `progress[0]` samples, `progress[1]` bytes.

    One pair of slots per worker, each written by its worker alone and read here without
    a lock, so a worker killed mid-update cannot block the parent (see records.py)."""

    def __init__(self, ctx: Any, n: int) -> None:
        self.slots = ctx.RawArray("q", 2 * n)

    def __getitem__(self, k: int) -> int:
        return int(sum(self.slots[k::2]))


class WorkerPool:
    """`n` processes running `work(unit)`; results come back in unit order; what they
    report done while they work sums up in `self.progress`."""

    def __init__(self, n: int, work: Callable[[int], Any], ctx: Any) -> None:
        self.progress = Progress(ctx, n)
        self._workers: list[tuple[Any, Connection]] = []
        for i in range(n):
            parent_end, child_end = ctx.Pipe()
            p = ctx.Process(target=_worker_main,
                            args=(child_end, work, self.progress.slots, i, os.getpid(),
                                  _parents_env()),
                            daemon=True, name="autotune-convert-worker")
            p.start()
            child_end.close()
            self._workers.append((p, parent_end))

    def run(self, units: list[int], window: int,
            tick: Callable[[], None] | None = None) -> Iterator[tuple[int, Any]]:
        """Yield (unit, result) in the order of `units`, with at most `window` units
        finished-but-not-yet-yielded or in flight (bounds the parent's memory)."""
        todo = list(reversed(units))
        idle = list(range(len(self._workers)))
        busy: dict[int, int] = {}  # worker index -> unit
        ready: dict[int, Any] = {}
        answered: set[int] = set()  # workers that returned a unit: they did start
        broken: set[int] = set()    # workers whose pipe ended: nothing more to read
        order = iter(units)
        nxt = next(order, None)
        while nxt is not None:
            while todo and idle and len(busy) + len(ready) < window:
                w = idle.pop()
                u = todo.pop()
                self._workers[w][1].send(u)
                busy[w] = u
            if nxt in ready:
                yield nxt, ready.pop(nxt)
                nxt = next(order, None)
                continue
            conns = {self._workers[w][1]: w for w in busy}
            sentinels = {self._workers[w][0].sentinel: w for w in busy}
            for obj in wait(list(conns) + list(sentinels), timeout=0.25):
                if obj in conns:
                    w = conns[obj]
                    try:
                        status, u, out = obj.recv()
                    except (EOFError, ConnectionError):
                        broken.add(w)
                        continue  # its sentinel says how it died
                    if status == "err":
                        raise out
                    ready[u] = out
                    answered.add(w)
                    del busy[w]
                    idle.append(w)
                elif obj in sentinels and sentinels[obj] in busy:
                    w = sentinels[obj]
                    if w not in broken and self._workers[w][1].poll():
                        continue  # its last message is still to be read
                    p = self._workers[w][0]
                    p.join(1)
                    code = p.exitcode
                    how = f"signal {-code}" if code is not None and code < 0 else f"status {code}"
                    raise ConvertError(
                        f"a worker process died ({how}) while converting unit {busy[w]}"
                        + (" (SIGKILL: out of memory?)" if code == -signal.SIGKILL else "")
                        + ("; rerun the same command to resume (with fewer --workers if memory "
                           "is short)." if w in answered or code != 1 else _FIRST_UNIT_HINT))
            if tick:
                tick()

    def close(self, kill: bool = False) -> None:
        """Stop the workers: ask them to finish, or kill them (on an error or Ctrl-C)."""
        for p, conn in self._workers:
            if kill:
                p.kill()
            else:
                try:
                    conn.send(None)
                except OSError:
                    p.kill()
        for p, conn in self._workers:
            p.join(5 if not kill else None)
            if p.is_alive():
                p.kill()
                p.join()
            conn.close()
        self._workers = []
