"""The task sampler: where each thread of a job's process tree spends its wall time.

A thread of its own in the monitoring process (never in the training process) sweeps
every thread of the job's tree (`/proc/PID/task/TID/*`) at ~55 Hz on jittered intervals
(uniform 11-23 ms: a fixed 50 Hz would phase-lock with a 100 ms step and see the same
moment of every step) and yields one `TimeBudget` per monitor interval (`take()`):

    on_cpu, runnable   exact: the deltas of schedstat's run and run-queue-wait ns
    io                 exact where delay accounting is on (stat field 42,
                       delayacct_blkio_ticks), else the sampled share of state D x time
    storage_wait       the sampled share of state S with a storage wchan x time
    asleep             the thread's wall time in the window less the four above (>= 0);
                       of it, `timer_s`: the sampled share asleep in a timer (nanosleep)

Cost (the monitor must stay under 1 % of a core): the files are opened once per thread and
re-read with os.pread(fd, n, 0); a sweep reads each thread's schedstat only, and its stat
and wchan only when schedstat's third field (timeslices run) moved since the last sweep:
a thread that has not run since cannot have changed its state or its wait (a woken thread
not yet run reads as its old state for at most a sweep). A thread that has not run for
QUIET_SWEEPS sweeps (an idle pool thread: most of a DataLoader job's threads) is read every
QUIET_EVERY-th sweep only, until it runs again: its wake-up, or its exit, is seen up to
~50 ms late. The tree is re-discovered every
DISCOVER_S; a process born in between is counted from its birth (its schedstat from 0).

Storage waits (wchan of a thread in S, or in D outside block I/O; see `storage_wait_kind`): FUSE requests
(`request_wait_answer`, `fuse_*`), NFS/SunRPC (`rpc_wait_bit_killable`, `nfs_*`, `rpc_*`),
CIFS and Ceph clients, and, in worker processes only, a TCP socket receive (`sk_wait_data`,
`tcp_recvmsg*`, and `wait_woken`, which names an inet receive on kernels where
`sk_wait_event` is inlined): a DataLoader worker's only network peer is its storage (an
object store), while its talk with the main process goes over pipes and unix sockets
(`pipe_read`, `unix_stream_data_wait`: asleep). In the main process a socket receive is
far more likely the distributed backend's (NCCL, gloo): asleep. Where wchan reads "0" for
sleeping threads (kernels that hide it) storage waits cannot be seen: a note says so.

Classes: `main` is the training process: the monitored command when it runs Python, else
(a shell, `env`, a launcher) the first Python process found walking down single-child
chains from it; the launchers above it are counted in neither class (they only wait).
Where the job is distributed (autotune.monitor.launchers.ranks_of), `main` is its ranks:
those of a distributed launcher (torchrun, `accelerate launch`, deepspeed: LAUNCHERS),
the launcher in neither class; those torch.multiprocessing.spawn starts, once one has
workers of its own, the spawning process in neither class; or the training process and
the copies of itself it starts with a LOCAL_RANK (Lightning's DDP). Counted as workers,
the ranks' training read as the loader's work, the launcher's sleep as the training
process's, and a rank's wait in all_reduce on a socket as a worker's storage wait.
`workers` are all other processes of the tree (DataLoader workers and their helpers), but
autotune's own and multiprocessing's (autotune.monitor.launchers.helper): the sampler
`autotune.DataLoader` starts beside its workers for a few seconds (`python -m
autotune.monitor.burst`), multiprocessing's resource tracker and forkserver are none of
the job's workers, and counted as workers they read as idle ones and more processes.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable

from autotune.monitor.launchers import (autotunes_own, children, helper, is_launcher,
                                        ranks_of, runs_python)
from autotune.monitor.proctree import read_proc
from autotune.monitor.taskwindow import CLK_TCK, _Thread, _Window, window_budget
from autotune.monitor.timebudget import TimeBudget
from autotune.runqueue import descendants

DELAYACCT_SYSCTL = "/proc/sys/kernel/task_delayacct"
SCHEDSTAT_PROBE = "/proc/self/schedstat"   # absent on kernels without CONFIG_SCHED_INFO
SWITCH_RECORD = "/run/autotune-delayacct/previous"   # autotune.monitor.delayacct's record
DISCOVER_S = 0.2            # how often the tree is re-listed: a non-persistent worker of a short
                            # epoch may live a few tenths of a second, and one unseen is lost
QUIET_SWEEPS = 10            # a thread that has not run for this many sweeps is "quiet"
QUIET_EVERY = 4             # ... and read every this many sweeps until it runs again
MEAN_HZ = 58.0   # sweeps per s (>= 50 achieved); intervals uniform in [2/3, 4/3] x 1/MEAN_HZ

_FUSE = ("request_wait_answer", "fuse_wait_answer", "fuse_")
_NETFS = ("rpc_wait_bit_killable", "rpc_", "nfs_", "nfs4_", "__rpc_", "cifs_",
          "wait_for_response", "smb2_", "ceph_", "ceph_osdc_")
_SOCKET = ("sk_wait_data", "tcp_recvmsg", "inet_recvmsg", "wait_woken", "sk_stream_wait")
# A timer sleep (time.sleep, a retry's backoff, a rate limiter): not storage, but not a
# worker waiting for work either (that is a poll on its index queue's pipe, or a futex).
_TIMER = ("hrtimer_nanosleep", "do_nanosleep", "clock_nanosleep", "common_nsleep")


def storage_wait_kind(wchan: str, worker: bool) -> str | None:
    """"fuse", "netfs" or "socket" when a sleeping thread's wchan is a storage wait, else
    None (a queue, a lock, a pipe, a timer: asleep). Socket receives count in workers only."""
    if wchan.startswith(_FUSE):
        return "fuse"
    if wchan.startswith(_NETFS):
        return "netfs"
    if worker and wchan.startswith(_SOCKET):
        return "socket"
    return None


def boottime() -> float:
    """Seconds since boot, the clock of /proc/PID/stat's starttime."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


YOUNG_S = 2.0   # how long a new process's argv is read again (_own_helpers)


def find_main(root: int) -> tuple[int, bool]:
    """(the training process, whether it is settled): the root when it runs Python, else
    down single-child chains to the first Python process; unsettled while none is found."""
    pid = root
    for _ in range(8):
        if runs_python(pid):
            return pid, True
        kids = children(pid)
        if len(kids) != 1:
            return pid, False
        pid = kids[0]
    return pid, False


def _pread(fd: int, n: int = 512) -> bytes | None:
    try:
        data = os.pread(fd, n, 0)
    except OSError:
        return None
    return data or None


def _open(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY)
    except OSError:
        return -1


def delayacct_on(path: str = DELAYACCT_SYSCTL) -> bool:
    """Whether per-task delay accounting counts now (kernel.task_delayacct = 1)."""
    data = read_proc(path, 16)
    return bool(data) and data.strip() == b"1"


def _switched_on_at(record: str = SWITCH_RECORD) -> float | None:
    """When another autotune run switched delay accounting on (None: on before any did)."""
    data = read_proc(record, 64)
    try:
        return float(data.split()[1]) or None if data else None
    except (IndexError, ValueError):
        return None


def job_tree(root: int, main: int) -> set[int]:
    """The processes sampled below `root`: `main`'s descendants and, where `main` is found
    below `root` (a shell, a launcher), root's other branches, but not the chain from root
    down to `main`."""
    tree = set(descendants(main))
    if main != root:
        # Other branches under a launcher (not the chain above main) are workers too.
        chain = set()
        pid = root
        while pid != main:
            chain.add(pid)
            kids = children(pid)
            if len(kids) != 1:
                break
            pid = kids[0]
        tree |= set(descendants(root)) - chain
    return tree


class TaskSampler:
    """Samples the threads of `root_pid`'s tree in a thread of its own; `take()` returns the
    budget of the window since the previous `take()` (the first: since `start()`).

    delayacct_since: boottime at which delay accounting was switched on for this run
    (autotune.monitor.delayacct); processes started before it are flagged and sampled.
    None: use delay accounting when kernel.task_delayacct reads 1 at start (since when
    another autotune run switched it on, from its record, else for every process).
    A window at whose end the switch reads 0 (someone switched it off) is sampled.
    trainers: returns the processes seen writing steps (launchers.StepWriters of the
    monitor's step log): ranks for sure, where the tree alone cannot tell (ranks_of).
    """

    def __init__(self, root_pid: int, *, mean_hz: float = MEAN_HZ,
                 delayacct_since: float | None = None, psi: bool = True,
                 trainers: Callable[[], frozenset[int]] | None = None) -> None:
        self.root_pid = root_pid
        self._trainers = trainers
        self.mean_hz = mean_hz
        self.main_pid, self._main_settled = find_main(root_pid)
        self.delayacct = delayacct_since is not None or delayacct_on()
        if delayacct_since is None and self.delayacct:
            delayacct_since = _switched_on_at()
        self.delayacct_since = delayacct_since
        self.schedstat = os.path.exists(SCHEDSTAT_PROBE)
        self._threads: dict[tuple[int, int], _Thread] = {}
        self._own: set[int] = set()   # autotune's and multiprocessing's helpers (helper)
        self._ranks: set[int] = set()      # a distributed launcher's ranks (the main class)
        self._launchers: set[int] = set()  # ... and the launchers: in neither class
        self._young: dict[int, float] = {}   # new processes: when first seen
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_sweep: float | None = None
        self._last_discover = -1e9
        self._initial = True
        self._win = _Window(boottime())
        self.cpu_s = 0.0                 # the sampler thread's own CPU time (thread_time)
        self.psi = None
        if psi:
            from autotune.monitor.psi import PsiReader
            self.psi = PsiReader(root_pid)

    # --- life -------------------------------------------------------------------------
    def start(self) -> TaskSampler:
        with self._lock:
            self._sweep(boottime(), discover=True)
            self._initial = False
            self._win = _Window(self._last_sweep or boottime())
            self._rebase()
        self._thread = threading.Thread(target=self._loop, name="autotune-tasks", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            for t in self._threads.values():
                t.close()
            self._threads.clear()

    def _loop(self) -> None:
        rnd = random.Random()
        period = 1.0 / self.mean_hz
        try:
            while True:
                # time.sleep, not Event.wait: a third of the CPU per wake-up, at the cost of
                # stop() waiting up to one interval.
                time.sleep(rnd.uniform(period * 2 / 3, period * 4 / 3))
                if self._stop.is_set():
                    break
                now = boottime()
                with self._lock:
                    self._sweep(now, discover=now - self._last_discover >= DISCOVER_S)
                self.cpu_s = time.thread_time()
        finally:
            self.cpu_s = time.thread_time()
            with self._lock:
                for t in self._threads.values():
                    t.close()

    # --- one sweep ----------------------------------------------------------------------
    def _sweep(self, now: float, discover: bool) -> None:
        dt = 0.0 if self._last_sweep is None else now - self._last_sweep
        self._last_sweep = now
        if discover:
            self._discover(now)
        pread, fast = os.pread, self.schedstat and dt > 0
        for t in self._threads.values():
            if t.gone:
                continue
            if fast:
                # The hot path (most threads, most sweeps): schedstat's bytes unchanged means
                # the thread has not run since the last sweep, so neither its state nor
                # its wait changed: one pread and a compare, no parsing. A thread quiet for
                # QUIET_SWEEPS is read only every QUIET_EVERY-th sweep (idle pool threads:
                # most of a job's threads); its wake-up is seen at most that late.
                skipped = t.skip > 0
                if skipped:
                    t.skip -= 1
                    data = t.raw
                else:
                    try:
                        data = pread(t.fd_sched, 128, 0)
                    except OSError:
                        data = b""
                if data and data == t.raw:
                    t.charge(dt)
                    t.quiet += 1
                    # Only a read that found it unchanged starts a new run of skips: set
                    # on a skipped sweep too, the thread would never be read again.
                    if t.quiet >= QUIET_SWEEPS and not skipped:
                        t.skip = QUIET_EVERY - 1
                    continue
                t.quiet = 0
                self._read(t, now, dt, data=data or None)
            else:
                self._read(t, now, dt)
        self._win.sweeps += 1

    def _discover(self, now: float) -> None:
        self._last_discover = now
        if not self._main_settled:
            was = self.main_pid
            self.main_pid, self._main_settled = find_main(self.root_pid)
            if self.main_pid != was:
                # The launcher has started the training process: the launcher's threads
                # were counted as main until now; from here they are in no class.
                for key, t in list(self._threads.items()):
                    if t.pid == was:
                        t.close()
                        del self._threads[key]
        tree = job_tree(self.root_pid, self.main_pid)
        self._find_ranks()
        for pid in tree - self._own_helpers(tree, now) - self._launchers:
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid_s in tids:
                key = (pid, int(tid_s))
                if key not in self._threads:
                    self._add(pid, int(tid_s), now)

    def _find_ranks(self) -> None:
        # A launcher's ranks (module doc): threads read in the other class are read again.
        ranks, launchers = ranks_of(self.main_pid, self._trainers() if self._trainers
                                    else frozenset(), frozenset(self._ranks))
        if (ranks, launchers) != (self._ranks, self._launchers):
            moved = (ranks ^ self._ranks) | launchers | self._launchers | {self.main_pid}
            for key in [k for k in self._threads if k[0] in moved]:
                self._threads.pop(key).close()
            self._ranks, self._launchers = ranks, launchers

    def _own_helpers(self, tree: set[int], now: float) -> set[int]:
        """autotune's and multiprocessing's own helpers in `tree` (launchers.helper), their
        threads dropped if they were added. A new process is checked again for YOUNG_S:
        until its exec is done its argv is its parent's, or empty, and under load that
        lasts past a discovery."""
        self._own &= tree   # a pid gone may come back as another process
        self._young = {p: t for p, t in self._young.items() if p in tree and now - t < YOUNG_S}
        known = {t.pid for t in self._threads.values()}
        for pid in (tree - known - self._own) | set(self._young):
            if pid == self.main_pid:
                continue
            if helper(pid):
                self._own.add(pid)
                self._young.pop(pid, None)
                for key in [k for k in self._threads if k[0] == pid]:
                    self._threads.pop(key).close()
            elif pid not in known:
                self._young.setdefault(pid, now)
        return self._own

    def _add(self, pid: int, tid: int, now: float) -> None:
        base = f"/proc/{pid}/task/{tid}/"
        fd = _open(base + ("schedstat" if self.schedstat else "stat"))
        if fd < 0:
            return
        t = _Thread(pid, tid, worker=pid not in (self._ranks or {self.main_pid}), fd_sched=fd)
        t.fd_stat = fd if not self.schedstat else _open(base + "stat")
        st = self._read_stat(t)
        if st is None:
            t.close()
            return
        start_s = t.start_s = st[2]
        t.ppid = st[4]
        if self.delayacct and self.delayacct_since is not None:
            # starttime is truncated to a clock tick: within one tick of the switch is after.
            t.pre_switch = start_s + 1.0 / CLK_TCK < self.delayacct_since
        self._read(t, now, 0.0, fresh=True)
        if t.gone:
            return
        self._threads[(pid, tid)] = t
        if not self._initial and start_s > self._win.started:
            # Born in this window: all it ran counts here, from its birth.
            t.base = (0, 0, 0)
            t.alive_s = max(0.0, now - max(start_s, self._win.started))
        else:
            t.base = t.last

    def _read_stat(self, t: _Thread) -> tuple[bytes, int, float, int, int] | None:
        """(state, blkio ticks, start boottime s, utime+stime ticks, ppid) of the thread's
        stat."""
        data = _pread(t.fd_stat, 1024) if t.fd_stat >= 0 else None
        if not data:
            return None
        rest = data[data.rfind(b")") + 2:].split()
        try:
            return (rest[0], int(rest[39]), int(rest[19]) / CLK_TCK,
                    int(rest[11]) + int(rest[12]), int(rest[1]))
        except (IndexError, ValueError):
            return None

    def _read(self, t: _Thread, now: float, dt: float, fresh: bool = False,
              data: bytes | None = None) -> None:
        if self.schedstat:
            if data is None:
                data = _pread(t.fd_sched, 128)
            t.raw = data or b""
            parts = data.split() if data else ()
            try:
                run, wait, pcount = int(parts[0]), int(parts[1]), int(parts[2])
            except (IndexError, ValueError):
                self._gone(t)
                return
            moved = pcount != t.pcount
            t.pcount = pcount
        else:
            run = wait = 0
            moved = True
        blkio = t.last[2]
        if moved or fresh:
            st = self._read_stat(t)
            if st is None or st[0] in (b"Z", b"X"):
                self._gone(t)
                return
            t.state, blkio = st[0], st[1]
            if not self.schedstat:
                run = int(st[3] * 1e9 / CLK_TCK)
            # A storage client may wait in D, not only S: FUSE's O_DIRECT read sleeps
            # uninterruptibly in fuse_direct_IO, NFS's TASK_KILLABLE waits read D. Delay
            # accounting counts neither (they are not io_schedule), so they are storage
            # waits, and D without a storage wchan is block I/O.
            t.timer = False
            t.storage = self._storage(t) if t.state in (b"S", b"D") else None
        t.last = (run, wait, blkio)
        if not fresh:
            t.charge(dt)

    def _storage(self, t: _Thread) -> str | None:
        if t.fd_wchan < 0:
            t.fd_wchan = _open(f"/proc/{t.pid}/task/{t.tid}/wchan")
        w = (_pread(t.fd_wchan, 128) or b"").decode("ascii", "replace").strip()
        if w in ("", "0"):
            self._win.wchan_zero += 1
            return None
        self._win.wchan_named += 1
        t.timer = w.startswith(_TIMER)
        return storage_wait_kind(w, t.worker)

    def _gone(self, t: _Thread) -> None:
        # Exited: it counts to its exit with its last read values.
        t.gone = True
        t.close()

    # --- windows ------------------------------------------------------------------------
    def _rebase(self) -> None:
        for key in [k for k, t in self._threads.items() if t.gone]:
            del self._threads[key]
        for t in self._threads.values():
            t.base = t.last
            t.alive_s = t.d_s = t.s_storage_s = t.s_timer_s = 0.0

    def take(self) -> TimeBudget | None:
        """The budget of the window since the previous take (None before any sweep)."""
        with self._lock:
            end = self._last_sweep
            win = self._win
            if end is None or end <= win.started:
                return None
            # Switched off under us (by hand, or a run outside autotune): blkio stopped
            # counting.
            da = self.delayacct and delayacct_on()
            b = window_budget(self._threads.values(), win, end - win.started,
                              delayacct=self.delayacct, da=da, schedstat=self.schedstat)
            self._win = _Window(end)
            self._rebase()
        if self.psi is not None:
            b.psi_io = self.psi.take()
            if self.psi.note and self.psi.note not in b.notes:
                b.notes.append(self.psi.note)
        return b


__all__ = ["TaskSampler", "autotunes_own", "boottime", "delayacct_on", "find_main",
           "is_launcher", "job_tree", "storage_wait_kind"]
