"""A second loader's workers that sit idle (a validation loader's kept workers) are left
out of the window's figures while the loader at work works; a loader's own idle workers
are not (autotune.monitor.taskwindow)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from autotune.monitor.taskwindow import PARKED_NOTE, PARKED_S, _groups, _parked, _Thread
from autotune.monitor.tasks import TaskSampler

# A main process that forks 2 workers that wait on a pipe (as a DataLoader worker waits on
# its index queue), then, GAP seconds later, 2 that spin.
JOB = """
    import os, sys, threading, time
    gap = float(sys.argv[1])
    late = float(sys.argv[2])
    r, w = os.pipe()
    def fork(fn):
        pid = os.fork()
        if pid == 0:
            fn()
            os._exit(0)
        return pid
    def wait():
        # A second thread, as a DataLoader worker's queue feeder starts with its first batch.
        time.sleep(late)
        threading.Thread(target=threading.Event().wait, daemon=True).start()
        os.read(r, 1)
    def spin():
        t = time.time()
        while time.time() - t < 4.0:
            pass
    kids = [fork(wait), fork(wait)]
    time.sleep(gap)
    kids += [fork(spin), fork(spin)]
    time.sleep(4.5)
    os.write(w, b"xx")
    for k in kids:
        os.waitpid(k, 0)
"""


def _budget(gap: float, late: float = 0.0):
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(JOB), str(gap), str(late)])
    try:
        s = TaskSampler(p.pid, psi=False).start()
        time.sleep(gap + 1.0)
        s.take()                       # the start: the spinners just forked
        time.sleep(2.0)
        b = s.take()
        s.stop()
    finally:
        p.wait(timeout=30)
    assert b is not None
    return b


def test_workers_forked_apart_that_wait_are_left_out_while_the_others_work() -> None:
    b = _budget(1.5)
    w = b.cls("workers")
    assert w is not None
    assert b.parked == 2 and PARKED_NOTE in b.notes, (b.parked, b.notes)
    assert w.processes == 2, w.to_dict()
    assert w.share("on_cpu") + w.share("runnable") > 0.5, w.to_dict()
    assert b.to_dict()["parked"] == 2


def test_workers_forked_a_few_tenths_apart_are_two_loaders_as_in_lightning() -> None:
    # Lightning's sanity check runs 2 validation batches, then starts the training loader:
    # its workers forked 0.34 s after the validation loader's (each loader's 0.02 s
    # apart), and those, counted, read "the 4 workers are idle 52 %" and blamed the main
    # process of a decode-bound job (2 of 2 runs, epochs of 2 s: never 30 s idle).
    b = _budget(0.4)
    w = b.cls("workers")
    assert w is not None
    assert b.parked == 2 and PARKED_NOTE in b.notes, (b.parked, b.notes)
    assert w.processes == 2, w.to_dict()


def test_a_workers_later_thread_does_not_move_its_start() -> None:
    # A worker's start is its process's, not its newest thread's: the validation workers'
    # feeder threads, started with their first batch, lay within 0.1 s of the training
    # workers' forks, and the two loaders read as one (parked 0 in 2 of 2 Lightning runs).
    b = _budget(0.4, late=0.35)
    assert b.parked == 2 and PARKED_NOTE in b.notes, (b.parked, b.notes)


def test_workers_forked_together_are_one_loader_and_all_counted() -> None:
    # The same processes forked in one go: one loader whose 2 workers wait while 2 work
    # (the main process gives them work in turn): they are its own, and counted.
    b = _budget(0.0)
    w = b.cls("workers")
    assert w is not None
    assert b.parked == 0 and PARKED_NOTE not in b.notes, b.notes
    assert w.processes == 4, w.to_dict()


def _thread(pid: int, start: float, busy_s: float, *, alive: float = 1.0,
            idle_since: float | None = None) -> tuple[_Thread, float, float, float, bool]:
    t = _Thread(pid, pid, worker=True, fd_sched=-1, ppid=1, start_s=start, alive_s=alive,
                idle_since=idle_since)
    return t, busy_s, 0.0, 0.0, False


@pytest.mark.parametrize("idle_for, parked", [(PARKED_S + 1, True), (PARKED_S - 5, False)])
def test_a_worker_of_the_same_start_is_left_out_only_after_a_long_idle(idle_for, parked):
    # Two loaders started within GROUP_GAP_S (Lightning's sanity check runs 2 validation
    # batches, then training starts): only a long idle tells the kept validation workers.
    end = 1000.0
    seen = [_thread(10, 100.0, 0.9), _thread(11, 100.1, 0.0, idle_since=end - idle_for)]
    assert _parked(seen, end) == ({11} if parked else set())


@pytest.mark.parametrize("forks, loaders", [
    ([0.0, 0.02, 0.34, 0.36], [0, 0, 1, 1]),       # Lightning: validation, then training
    ([0.0, 0.0, 0.01, 0.34, 0.35], [0, 0, 0, 1, 1]),
    ([0.0, 0.34], [0, 0]),                          # one worker each: no usual gap
    ([0.0, 0.1, 0.2, 0.3, 0.6], [0, 0, 0, 0, 0]),   # slow forks: 0.3 s is not 8x 0.1 s
    ([0.0, 0.01, 0.02, 0.09], [0, 0, 0, 0]),        # a late fork under the short gap
    ([0.0, 0.01, 1.5, 1.51], [0, 0, 1, 1]),
])
def test_a_gap_far_longer_than_the_usual_fork_gap_starts_another_loader(forks, loaders):
    start = {10 + i: (1, 100.0 + f) for i, f in enumerate(forks)}
    got = _groups(start)
    assert [got[p] - got[10] for p in sorted(start)] == loaders


def test_nothing_is_left_out_when_no_worker_works() -> None:
    # The main process is the bottleneck: every worker waits; that is the figure to keep.
    end = 1000.0
    seen = [_thread(10, 100.0, 0.001, idle_since=0.0), _thread(11, 500.0, 0.0, idle_since=0.0)]
    assert _parked(seen, end) == set()


def test_a_worker_that_works_again_starts_its_idle_anew() -> None:
    end = 1000.0
    worker = _thread(11, 100.0, 0.5, idle_since=0.0)
    assert _parked([_thread(10, 100.0, 0.9), worker], end) == set()
    assert worker[0].idle_since is None
    # Idle again: counted from this window's start, not its birth.
    assert _parked([_thread(10, 100.0, 0.9), (worker[0], 0.0, 0.0, 0.0, False)],
                   end + 1.0) == set()
    assert worker[0].idle_since == pytest.approx(end)
