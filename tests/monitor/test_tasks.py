"""The task sampler on real processes whose behaviour is known: a spinner reads on a CPU,
a sleeper asleep, a reader behind a throttled disk blocked on I/O, a reader of a slow FUSE
mount in a storage wait; an exiting process is counted to its exit. Shares are asserted
with wide margins (a busy shared machine moves them), never timings."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.monitor.psi import parse_totals
from autotune.monitor.tasks import TaskSampler, find_main, storage_wait_kind
from autotune.monitor.timebudget import TimeBudget, sum_budgets

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.alone  # it judges what it measures: CI runs it alone (.ci/run)


def _spawn(code: str, *args: str) -> subprocess.Popen[bytes]:
    """A python child running `code`, which prints "ready" once set up."""
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args],
                         stdout=subprocess.PIPE, start_new_session=True)
    assert p.stdout is not None
    assert p.stdout.readline().strip() == b"ready"
    return p


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    out: list[subprocess.Popen[bytes]] = []
    yield out
    for p in out:   # the whole group: forked children must not outlive the test
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def _measure(pid: int, seconds: float, **kw: object) -> TimeBudget:
    s = TaskSampler(pid, **kw).start()  # type: ignore[arg-type]
    try:
        time.sleep(seconds)
        b = s.take()
    finally:
        s.stop()
    assert b is not None
    return b


SPIN_AND_SLEEP = """
    import os, threading, time
    def spin():
        while True: pass
    threading.Thread(target=spin, daemon=True).start()
    pid = os.fork()
    if pid == 0:
        time.sleep(60); os._exit(0)
    print("ready", flush=True)
    time.sleep(60)
"""


def test_spinner_on_cpu_and_sleeper_asleep(procs: list[subprocess.Popen[bytes]]) -> None:
    procs.append(p := _spawn(SPIN_AND_SLEEP))
    b = _measure(p.pid, 1.5)
    main, workers = b.classes["main"], b.classes["workers"]
    assert (main.processes, main.threads) == (1, 2)
    assert (workers.processes, workers.threads) == (1, 1)
    # The spinner's thread is one of main's two: on a CPU or waiting for one all the time
    # (a busy neighbour may take the CPU, never the want of it).
    assert main.share("on_cpu") + main.share("runnable") > 0.8
    assert main.share("on_cpu") > 0.25
    assert main.share("asleep") > 0.5          # the main thread sleeps
    assert workers.share("asleep") > 0.8
    assert workers.share("on_cpu") < 0.1
    assert b.samples > 10 and b.hz > 10
    assert b.io_source in ("delayacct", "state-sampling")
    assert b.wall_s > 1.0


def test_autotunes_own_sampler_in_the_job_is_not_one_of_its_workers(
        procs: list[subprocess.Popen[bytes]]) -> None:
    # autotune.DataLoader starts `python -m autotune.monitor.burst` beside its workers for a
    # few seconds; `autotune monitor` counted it as a worker of the job (one more process,
    # idle: "the 5 workers are idle 59 %").
    code = f"""
        import os, subprocess, sys, time
        if os.fork() == 0:
            time.sleep(60); os._exit(0)
        subprocess.Popen([sys.executable, "-m", "autotune.monitor.burst", str(os.getpid()),
                          "30"], stdout=subprocess.DEVNULL, cwd={str(REPO)!r})
        print("ready", flush=True)
        time.sleep(60)
    """
    procs.append(p := _spawn(code))
    b = _measure(p.pid, 1.5)
    assert b.classes["workers"].processes == 1     # the forked worker, not the sampler
    assert b.classes["main"].processes == 1


def test_multiprocessings_helpers_are_no_workers_but_the_forkservers_children_are(
        procs: list[subprocess.Popen[bytes]]) -> None:
    # Workers of the forkserver context (a DataLoader's multiprocessing_context, Python
    # 3.14's default) are forked by multiprocessing's forkserver, which, with its resource
    # tracker, sleeps beside them: counted as workers they read as two idle ones. The
    # workers keep the forkserver's command line (no exec): they must stay counted.
    code = """
        import itertools, multiprocessing as mp, time
        ctx = mp.get_context("forkserver")
        ps = [ctx.Process(target=sum, args=(itertools.count(),)) for _ in range(2)]
        for p in ps:
            p.start()     # each spins: a worker decoding
        print("ready", flush=True)
        time.sleep(60)
    """
    procs.append(p := _spawn(code))
    b = _measure(p.pid, 1.5)
    w = b.classes["workers"]
    assert w.processes == 2, w.to_dict()
    assert w.share("on_cpu") + w.share("runnable") > 0.5, w.to_dict()
    assert b.classes["main"].processes == 1


def test_a_helper_that_execs_late_is_dropped_once_its_argv_shows(
        procs: list[subprocess.Popen[bytes]]) -> None:
    # Until its exec, a new process's argv is its parent's: discovered then, it is added as a
    # worker. Read again while young, it is dropped once it runs autotune's sampler.
    code = f"""
        import os, sys, time
        if os.fork() == 0:
            time.sleep(0.6)
            os.chdir({str(REPO)!r})
            os.execv(sys.executable, [sys.executable, "-m", "autotune.monitor.burst",
                                      str(os.getppid()), "30"])
        print("ready", flush=True)
        time.sleep(60)
    """
    procs.append(p := _spawn(code))
    b = _measure(p.pid, 2.0)
    w = b.classes.get("workers")
    assert w is None or w.processes == 0, w
    assert b.classes["main"].processes == 1


def test_a_process_exiting_mid_window_is_counted_to_its_exit(
        procs: list[subprocess.Popen[bytes]]) -> None:
    code = """
        import os, time
        pid = os.fork()
        if pid == 0:
            t = time.time()
            while time.time() - t < 0.6: pass     # busy, then gone mid-window
            os._exit(0)
        print("ready", flush=True)
        os.waitpid(pid, 0)
        time.sleep(60)
    """
    procs.append(p := _spawn(code))
    b = _measure(p.pid, 1.8)
    w = b.classes["workers"]
    assert w.processes == 1
    # Counted to its exit: alive for ~0.6 s of the 1.8 s, busy for all of it.
    assert 0.2 < w.process_seconds < 1.4
    assert w.seconds["on_cpu"] + w.seconds["runnable"] > 0.3
    assert w.share("on_cpu") + w.share("runnable") > 0.6


def test_a_process_born_mid_window_counts_from_its_birth(
        procs: list[subprocess.Popen[bytes]]) -> None:
    code = """
        import os, sys, time
        print("ready", flush=True)
        time.sleep(0.6)
        if os.fork() == 0:
            t = time.time()
            while time.time() - t < 30: pass
        time.sleep(60)
    """
    procs.append(p := _spawn(code))
    b = _measure(p.pid, 1.8)
    w = b.classes["workers"]
    assert w.processes == 1
    assert w.process_seconds < 1.6
    assert w.share("on_cpu") + w.share("runnable") > 0.7


def test_launcher_shell_main_is_its_python_child(procs: list[subprocess.Popen[bytes]]) -> None:
    p = subprocess.Popen(["sh", "-c", f"{sys.executable} -c 'import time; time.sleep(30)'; "
                          "echo done"], start_new_session=True)
    procs.append(p)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        main, settled = find_main(p.pid)
        if settled:
            break
        time.sleep(0.05)
    assert settled and main != p.pid
    b = _measure(p.pid, 0.6)
    assert b.classes["main"].processes == 1
    assert b.classes["workers"].processes == 0     # the shell above it counts nowhere


SLEEPER_AND_POLLER = """
    import os, time
    r, w = os.pipe()
    if os.fork() == 0:                  # a worker sleeping inside its work: time.sleep
        while True: time.sleep(0.02)
    if os.fork() == 0:                  # a worker waiting for work: a poll on its pipe
        import select
        while True: select.select([r], [], [], 5.0)
    print("ready", flush=True)
    time.sleep(60)
"""


def test_a_timer_sleep_is_told_from_a_wait_for_work(procs: list[subprocess.Popen[bytes]]) -> None:
    """Both workers are asleep; only the one in nanosleep is asleep in a timer (the verdict
    reads that as a wait inside the Dataset, the other as a wait for the main process)."""
    procs.append(p := _spawn(SLEEPER_AND_POLLER))
    time.sleep(0.2)
    kids = sorted(int(x) for x in Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split())
    assert len(kids) == 2
    sleeper, poller = kids
    for pid, want in ((sleeper, True), (poller, False)):
        s = TaskSampler(p.pid, psi=False)
        s._add = (lambda orig, keep: lambda q, tid, now: orig(q, tid, now) if q == keep
                  else None)(s._add, pid)   # one worker each time
        s.start()
        try:
            time.sleep(1.5)
            b = s.take()
        finally:
            s.stop()
        assert b is not None
        w = b.classes["workers"]
        assert w.share("asleep") > 0.8
        if want:
            assert w.timer() > 0.5, w.to_dict()
        else:
            assert w.timer() == 0.0, w.to_dict()
    b2 = TimeBudget.from_dict(b.to_dict())
    assert b2.classes["workers"].timer_s == b.classes["workers"].timer_s


def test_storage_wait_kinds() -> None:
    assert storage_wait_kind("request_wait_answer", worker=True) == "fuse"
    assert storage_wait_kind("fuse_dev_do_read", worker=False) == "fuse"
    assert storage_wait_kind("rpc_wait_bit_killable", worker=False) == "netfs"
    assert storage_wait_kind("sk_wait_data", worker=True) == "socket"
    assert storage_wait_kind("sk_wait_data", worker=False) is None    # NCCL, gloo: asleep
    assert storage_wait_kind("pipe_read", worker=True) is None
    assert storage_wait_kind("futex_wait_queue", worker=True) is None
    assert storage_wait_kind("unix_stream_data_wait", worker=True) is None


def test_budgets_of_windows_sum(procs: list[subprocess.Popen[bytes]]) -> None:
    procs.append(p := _spawn(SPIN_AND_SLEEP))
    s = TaskSampler(p.pid).start()
    parts = []
    try:
        for _ in range(3):
            time.sleep(0.4)
            b = s.take()
            assert b is not None
            parts.append(b)
    finally:
        s.stop()
    total = sum_budgets([x.to_dict() for x in parts])
    assert total is not None
    assert total.samples == sum(x.samples for x in parts)
    assert abs(total.wall_s - sum(x.wall_s for x in parts)) < 1e-9
    assert total.classes["main"].process_seconds == pytest.approx(
        sum(x.classes["main"].process_seconds for x in parts))


def test_psi_totals_parse() -> None:
    text = (b"some avg10=0.00 avg60=0.01 avg300=0.16 total=1938003\n"
            b"full avg10=0.00 avg60=0.00 avg300=0.14 total=1804104\n")
    assert parse_totals(text) == {"some": 1938003, "full": 1804104}


def test_psi_beside_the_budget(procs: list[subprocess.Popen[bytes]]) -> None:
    procs.append(p := _spawn(SPIN_AND_SLEEP))
    b = _measure(p.pid, 0.6)
    if not os.path.exists("/proc/pressure/io"):
        assert any("/proc/pressure/io" in n for n in b.notes)
        return
    assert b.psi_io is not None
    assert b.psi_io["scope"] in ("cgroup", "machine")
    assert 0.0 <= b.psi_io["some_pct"] <= 100.0


READER = """
    import os, random, sys
    fd = os.open(sys.argv[1], os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    import mmap
    buf = mmap.mmap(-1, 4096)
    size = os.fstat(fd).st_size
    print("ready", flush=True)
    while True:
        if os.fork() == 0:        # a worker: the reading is in a child process
            while True:
                os.preadv(fd, [buf], random.randrange(size // 4096) * 4096)
        os.wait()
"""


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("delayacct", [False, True], ids=["sampled", "delayacct"])
def test_reader_behind_a_throttled_disk_is_blocked_on_io(
        tmp_path: Path, procs: list[subprocess.Popen[bytes]], delayacct: bool) -> None:
    from autotune.blockdev import block_device_for
    from autotune.emulate.throttle import IoThrottle
    from autotune.errors import NotPermitted

    if block_device_for(tmp_path) is None:
        pytest.skip(f"{tmp_path} has no block device: nothing to throttle")
    f = tmp_path / "data.bin"
    with open(f, "wb") as fh:
        fh.write(os.urandom(16 << 20))
        fh.flush()
        os.fsync(fh.fileno())
    try:
        cap = IoThrottle(tmp_path, read_iops=20, name="test-tasks")
        cap.__enter__()
    except NotPermitted as e:
        pytest.skip(str(e))
    hold = None
    try:
        if delayacct:
            from autotune.monitor.delayacct import DelayacctHold
            hold = DelayacctHold(str(tmp_path / "run"))
            hold.acquire()      # before the spawn: the reader is counted exactly
        p = cap.popen([sys.executable, "-c", textwrap.dedent(READER), str(f)],
                      stdout=subprocess.PIPE, start_new_session=True)
        procs.append(p)
        assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
        time.sleep(0.3)
        b = _measure(p.pid, 2.0, delayacct_since=hold.since if hold else None)
    finally:
        if hold is not None:
            hold.release()
        cap.__exit__(None, None, None)
    assert b.io_source == ("delayacct" if delayacct else b.io_source), b.notes
    assert b.samples > 10
    w = b.classes["workers"]
    assert w.processes == 1
    assert w.share("io") > 0.5, b.to_dict()
    assert w.share("on_cpu") < 0.3


@pytest.mark.root
@pytest.mark.slow
def test_reader_of_a_slow_fuse_mount_is_in_a_storage_wait(
        tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    from autotune.emulate.slowfs import SlowMount, fuse_unavailable_reason

    reason = fuse_unavailable_reason()
    if reason:
        pytest.skip(f"needs FUSE: {reason}")
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        (src / f"f{i}").write_bytes(os.urandom(1 << 16))
    code = """
        import os, sys
        print("ready", flush=True)
        if os.fork() == 0:
            while True:
                for name in sorted(os.listdir(sys.argv[1])):
                    fd = os.open(os.path.join(sys.argv[1], name), os.O_RDONLY | os.O_DIRECT)
                    os.pread(fd, 4096, 0)
                    os.close(fd)
        os.wait()
    """
    with SlowMount(src, tmp_path / "mnt", delay_ms=50):
        procs.append(p := _spawn(code, str(tmp_path / "mnt")))
        time.sleep(0.3)
        b = _measure(p.pid, 2.0)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    w = b.classes["workers"]
    if any("wchan reads 0" in n for n in b.notes):
        # The kernel hides wchan: the budget must say so, and sees no storage wait.
        assert w.seconds["storage_wait"] == 0.0
        return
    assert w.blocked() > 0.5, b.to_dict()
    assert w.share("asleep") < 0.5


def test_without_delay_accounting_the_budget_says_sampling_and_how_many(
        procs: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch) -> None:
    import autotune.monitor.tasks as tasks

    monkeypatch.setattr(tasks, "delayacct_on", lambda path=None: False)   # as without root
    procs.append(p := _spawn(SPIN_AND_SLEEP))
    b = _measure(p.pid, 0.6)
    assert b.io_source == "state-sampling" and b.samples > 5
    assert "state-sampling" in json_dumps(b) and "task-state sampling" in b.source_text()
    assert f"({b.samples:,} samples)" in b.source_text()


def json_dumps(b: TimeBudget) -> str:
    import json
    return json.dumps(b.to_dict())


def test_a_kernel_without_schedstat_or_psi_gets_one_note_each(
        procs: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    import autotune.monitor.psi as psi
    import autotune.monitor.tasks as tasks

    monkeypatch.setattr(tasks, "SCHEDSTAT_PROBE", str(tmp_path / "no-schedstat"))
    monkeypatch.setattr(psi, "MACHINE_PSI", str(tmp_path / "no-pressure-io"))
    monkeypatch.setattr(psi, "job_psi_file", lambda pid: (psi.MACHINE_PSI, "machine"))
    procs.append(p := _spawn(SPIN_AND_SLEEP))
    b = _measure(p.pid, 1.2)
    sched = [n for n in b.notes if "schedstat" in n]
    pressure = [n for n in b.notes if "no-pressure-io" in n]
    assert len(sched) == 1 and "/proc/PID/task/TID/schedstat" in sched[0]
    assert len(pressure) == 1 and b.psi_io is None
    main = b.classes["main"]
    # On CPU from stat's utime + stime instead: the spinner still shows; runnable unseen.
    assert main.share("on_cpu") > 0.2
    assert main.seconds["runnable"] == 0.0
    assert b.io_source == "state-sampling" or tasks.delayacct_on()


def test_a_thread_that_sleeps_between_bursts_is_still_read():
    # A training step's pattern: 250 ms asleep (quiet for more than QUIET_SWEEPS sweeps),
    # then 50 ms on a CPU. The quiet-thread shortcut once skipped such a thread for good:
    # every window after the first read on a CPU 0 % (the demo's budget said "idle").
    import subprocess
    import sys
    import time

    from autotune.monitor.tasks import TaskSampler

    code = ("import time\nwhile True:\n    time.sleep(0.25)\n    t = time.perf_counter()\n"
            "    while time.perf_counter() - t < 0.05:\n        pass\n")
    p = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.3)
        ts = TaskSampler(p.pid).start()
        shares = []
        for _ in range(5):
            time.sleep(0.6)
            shares.append(ts.take().classes["main"].share("on_cpu"))
        ts.stop()
    finally:
        p.kill()
        p.wait()
    assert all(s > 0.01 for s in shares[1:]), shares


def test_the_timer_share_never_exceeds_idle() -> None:
    """Two threads of one process asleep in timers for the whole second are 2.0
    thread-seconds per process-second, but idle is one thread's share: capped at it."""
    from autotune.monitor.timebudget import ClassBudget

    b = ClassBudget(processes=1, threads=3, process_seconds=1.0,
                    seconds={"on_cpu": 0.5, "runnable": 0.0, "io": 0.0, "storage_wait": 0.0,
                             "asleep": 2.0}, timer_s=2.0)
    assert b.idle() == pytest.approx(0.5) and b.timer() == pytest.approx(0.5)
    b.timer_s = 0.2
    assert b.timer() == pytest.approx(0.2)
