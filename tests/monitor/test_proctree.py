"""Process-tree CPU % and RSS with real child processes that burn CPU, appear and exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from autotune.monitor import ProcessTree, SystemMonitor, TreeUsage, Unavailable

pytestmark = pytest.mark.alone  # it judges what it measures: CI runs it alone (.ci/run)

# A parent that starts N CPU-burning children (after a delay) and reaps them.
PARENT = """
import subprocess, sys, time
time.sleep(float(sys.argv[2]))
kids = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(int(sys.argv[1]))]
print(" ".join(str(k.pid) for k in kids), flush=True)
for k in kids:
    k.wait()
time.sleep(60)
"""

# A parent that keeps starting short-lived children.
CHURN = """
import subprocess, time
end = time.monotonic() + 30
while time.monotonic() < end:
    subprocess.run(["sleep", "0.05"])
"""


def _kill_tree(proc: subprocess.Popen) -> None:
    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        kids = []
    for k in kids:
        try:
            k.kill()
        except psutil.Error:
            pass
    proc.kill()
    proc.wait(timeout=10)


@pytest.fixture
def burner():
    """Start a parent with 2 CPU-burning children, started 0.3 s after the parent."""
    procs: list[subprocess.Popen] = []

    def start(children: int = 2, delay: float = 0.3) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", PARENT, str(children), str(delay)],
                             stdout=subprocess.PIPE, text=True)
        procs.append(p)
        return p

    yield start
    for p in procs:
        _kill_tree(p)


def test_tree_cpu_counts_children_born_after_the_baseline(burner) -> None:
    parent = burner(children=2, delay=0.3)
    tree = ProcessTree(parent.pid)
    t0 = time.monotonic()
    assert tree.sample(t0) is None          # baseline: parent only
    kids = [int(p) for p in parent.stdout.readline().split()]

    def kids_cpu() -> float:
        return sum(sum(psutil.Process(k).cpu_times()[:2]) for k in kids)

    # Until the children have burned enough to show (however busy the machine is).
    deadline = time.monotonic() + 30
    while kids_cpu() < 0.2 and time.monotonic() < deadline:
        time.sleep(0.05)
    before = kids_cpu()     # read before the sample: the tree can only have counted more
    t1 = time.monotonic()
    u = tree.sample(t1)
    assert isinstance(u, TreeUsage)
    assert set(tree.pids) == {parent.pid, *kids}
    assert u.processes == 3 and u.started == 2 and u.exited == 0 and u.root_alive
    # Born after the baseline, so all their CPU time counts (one 10 ms tick of slack each).
    assert before >= 0.2 and u.cpu_pct / 100 * (t1 - t0) >= before - 0.03, (u, before)
    # RSS is the sum over the tree: compare with psutil read right now.
    expect = sum(psutil.Process(p).memory_info().rss for p in tree.pids)
    assert u.rss_bytes == pytest.approx(expect, rel=0.2)
    assert u.rss_bytes > psutil.Process(parent.pid).memory_info().rss


def test_child_exiting_between_samples_does_not_crash(burner) -> None:
    parent = burner(children=2, delay=0.0)
    kids = [int(p) for p in parent.stdout.readline().split()]
    tree = ProcessTree(parent.pid)
    tree.sample(time.monotonic())
    time.sleep(0.3)
    os.kill(kids[0], signal.SIGKILL)   # the parent reaps it
    deadline = time.monotonic() + 5
    while psutil.pid_exists(kids[0]) and time.monotonic() < deadline:
        time.sleep(0.02)
    u = tree.sample(time.monotonic())
    assert isinstance(u, TreeUsage)
    assert u.exited == 1 and u.processes == 2
    assert kids[0] not in tree.pids and kids[1] in tree.pids


def test_churning_children_under_the_sampler_thread() -> None:
    parent = subprocess.Popen([sys.executable, "-c", CHURN])
    try:
        with SystemMonitor(pid=parent.pid, interval=0.1, gpu=False) as mon:
            time.sleep(2.0)
    finally:
        _kill_tree(parent)
    recs = mon.records
    assert len(recs) >= 10
    assert mon.errors == []
    procs = [r.proc for r in recs]
    assert all(isinstance(p, TreeUsage) for p in procs), [p for p in procs if not isinstance(p, TreeUsage)]
    assert sum(p.started for p in procs) >= 3 and sum(p.exited for p in procs) >= 3


def test_tree_reports_unavailable_once_everything_exited() -> None:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    tree = ProcessTree(p.pid)
    tree.sample(time.monotonic())
    p.wait()
    u = tree.sample(time.monotonic())
    assert isinstance(u, Unavailable) and str(p.pid) in u.reason


def test_unknown_pid_is_an_error_at_construction() -> None:
    from autotune.errors import AutotuneError
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    with pytest.raises(AutotuneError, match=str(p.pid)):
        SystemMonitor(pid=p.pid, gpu=False)


def test_stat_parsing_survives_a_command_name_with_spaces_and_parens() -> None:
    from autotune.monitor.proctree import read_proc_stat, read_rss_bytes
    code = ("open('/proc/self/comm', 'w').write('a) b (c)'); import sys, time; "
            "print('ok', flush=True); time.sleep(30)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ok"
        with open(f"/proc/{p.pid}/comm") as f:
            assert f.read().strip() == "a) b (c)"
        st = read_proc_stat(p.pid)
        assert st is not None and st.ppid == os.getpid() and not st.zombie
        assert read_rss_bytes(p.pid) == psutil.Process(p.pid).memory_info().rss
    finally:
        p.kill()
        p.wait()


def test_pid_alive_sees_a_zombie_as_gone():
    """A child that exited but was not reaped is a zombie: its owner is gone, though a
    signal still finds it (fio's scratch and netcap's leftovers are swept by this)."""
    import subprocess
    import time

    from autotune.monitor.proctree import pid_alive

    assert pid_alive(os.getpid())
    p = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while pid_alive(p.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not pid_alive(p.pid)
    os.kill(p.pid, 0)               # still there for a signal: a zombie, not reaped yet
    p.wait()
    assert not pid_alive(p.pid)


# A parent that touches 96 MiB, then forks 2 children that keep it (copy-on-write, as
# DataLoader workers keep torch's and the dataset's pages) and sleep.
SHARED = """
import os, sys, time
buf = bytearray(96 * 2**20)
for i in range(0, len(buf), 4096):
    buf[i] = 1
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        time.sleep(60); os._exit(0)
    kids.append(pid)
print(" ".join(map(str, kids)), flush=True)
time.sleep(60)
"""


def test_tree_pss_counts_forked_children_s_shared_pages_once() -> None:
    """RSS counts the 96 MiB in each of the 3 processes (~290 MiB); PSS, what the cgroup
    is charged, counts it once: search's --max-memory bound is taken on PSS."""
    p = subprocess.Popen([sys.executable, "-c", SHARED], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and len(p.stdout.readline().split()) == 2
        tree, plain = ProcessTree(p.pid, pss=True), ProcessTree(p.pid)
        assert tree.sample(time.monotonic()) is None and plain.sample(time.monotonic()) is None
        time.sleep(0.2)
        u, v = tree.sample(time.monotonic()), plain.sample(time.monotonic())
        assert isinstance(u, TreeUsage) and u.processes == 3, u
        mib = 2**20
        assert u.rss_bytes > 3 * 96 * mib, u
        assert u.pss_bytes is not None and 96 * mib < u.pss_bytes < 2 * 96 * mib, u
        assert u.to_dict()["pss_bytes"] == u.pss_bytes
        # Not read unless asked (a user's job under `monitor`): RSS alone.
        assert isinstance(v, TreeUsage) and v.pss_bytes is None and v.rss_bytes > 3 * 96 * mib
    finally:
        _kill_tree(p)


def test_a_process_whose_memory_is_released_counts_no_pss():
    """An exiting process keeps /proc/PID after its memory is released (a pool not kept
    between epochs ends its workers while the bench samples): its smaps_rollup is empty.
    That read as "unreadable", so one sample of a bench in three had no PSS and the peak
    RSS judged --max-memory (a user's walk: a 3-worker trial rejected at 1,175 MiB of RSS
    for 360 MiB of PSS). A zombie is in that state for good."""
    from autotune.monitor.proctree import read_pss_bytes

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.time() + 30
    while not open(f"/proc/{child.pid}/stat").read().split(") ")[1].startswith("Z"):
        assert time.time() < deadline
        time.sleep(0.01)
    try:
        assert read_pss_bytes(child.pid) == 0
        assert read_pss_bytes(os.getpid()) > 0          # a live process: its own figure
    finally:
        child.wait()
