"""A pool's start, hand-off and end with real worker processes, spawn and forkserver
included: a pool still starting on its own thread when the epoch ends, the interpreter
exiting while one starts, a time-budget sampler whose loader is gone."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

import autotune
from online_datasets import Slow

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


class _Heavy(Slow):
    """A dataset whose pickle fills the pipe to a spawned worker: its Process.start returns
    only once the new interpreter has imported torch and read it (a second or more), so a
    pool started on its own thread is still starting when a short epoch ends."""

    def __init__(self, n: int) -> None:
        super().__init__(n, 0.0)
        self.ballast = bytes(1 << 20)


# forkserver starts its workers on the same thread and through the same hand-off as spawn
# (pool.py makes no difference between them there); it stays in `scripts/test`'s full run.
@pytest.mark.parametrize("ctx", ["fork", "spawn", pytest.param("forkserver",
                                                               marks=pytest.mark.extended)])
def test_a_pool_handed_on_while_starting_loses_no_batch(ctx):
    """Each epoch forces a new pool at its first batch and ends (or is left at its second
    batch) long before that pool's spawn/forkserver workers are up: the next epoch starts on
    it. Opened while its own thread still started it, a second inner iterator lost the
    index batches the first had taken (48 of 80 samples, out of order)."""
    loader = autotune.DataLoader(_Heavy(40), batch_size=4, shuffle=False,
                                 multiprocessing_context=ctx, _controller=False)
    got = []
    try:
        for e in range(4):
            seen = []
            for i, b in enumerate(loader):
                if i == 0:
                    loader._force_config(1, 2 + e % 2)  # one worker: a new pool each time
                seen += b.flatten().tolist()
                if e % 2 and i == 1:
                    break  # left early: the next iter() takes the pool still starting
            got.append(seen)
    finally:
        loader.close()
    for e, seen in enumerate(got):
        want = list(range(8)) if e % 2 else list(range(40))
        assert seen == want, f"epoch {e}"


_EXIT_SCRIPT = textwrap.dedent("""
    import atexit
    import multiprocessing.synchronize as ms
    import os
    import sys
    import threading

    _make = ms.SemLock._make_name

    def _say(*words):  # one write: the starter thread says its part too
        os.write(1, (" ".join(map(str, words)) + "\\n").encode())

    def _named():
        name = _make()
        _say("SEM", name)
        return name

    ms.SemLock._make_name = staticmethod(_named)

    import autotune
    from online_datasets import Slow

    def _starting():
        # Exit handlers run once the interpreter has joined its non-daemon threads.
        names = [t.name for t in threading.enumerate() if t.name == "autotune-pool-start"]
        _say("STARTING", len(names))

    if __name__ == "__main__":
        atexit.register(_starting)
        dl = autotune.DataLoader(Slow(400, 0.0), batch_size=8,
                                 multiprocessing_context=sys.argv[1])
        it = iter(dl)
        next(it)  # the first batch made here; the workers now start on a thread
        _say("PENDING", dl._sw.pending is not None)
""")


def _session(sid: int) -> list[int]:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                out.append(p.pid)
        except (ProcessLookupError, PermissionError):
            pass
    return out


def test_exit_while_a_spawned_pool_starts(tmp_path):
    """A script that ends while its loader's spawn workers are still starting on their own
    thread: the interpreter waits for that thread (a daemon one aborted it: exit code 134,
    "terminate called without an active exception", in 10 of 12 runs here) and leaves no
    process and no named semaphore behind (one run in six left one in /dev/shm)."""
    script = tmp_path / "train.py"
    script.write_text(_EXIT_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, HERE, os.environ.get("PYTHONPATH")) if p))
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, str(script), "spawn"], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        assert "PENDING True" in out  # the exit did come while the pool was starting
        assert "STARTING 0" in out  # no pool still starting once the exit handlers run
        deadline = time.monotonic() + 30  # the resource tracker ends once its pipe closes
        while _session(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _session(proc.pid)
        sems = [line.split()[1] for line in out.splitlines() if line.startswith("SEM ")]
        assert not [s for s in sems if os.path.exists("/dev/shm/sem." + s.lstrip("/"))]


def test_a_dropped_burst_ends_its_sampler():
    """A time-budget burst dropped without cancel() (its loader collected without close())
    ends its sampler process at once, not when its seconds are up."""
    from autotune.online.why import Burst

    b = Burst(os.getpid(), seconds=60.0)
    proc = b._proc
    assert proc is not None and proc.poll() is None
    del b
    gc.collect()
    assert proc.returncode is not None  # killed and reaped


def test_exit_mid_burst_ends_the_sampler(tmp_path):
    script = ("import os, sys\n"
              "from autotune.online.why import Burst\n"
              "b = Burst(os.getpid(), seconds=60.0)\n"
              "print(b._proc.pid, flush=True)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    r = subprocess.run([sys.executable, "-W", "error::ResourceWarning", "-c", script],
                       capture_output=True, text=True, env=env, timeout=60)
    pid = int(r.stdout.split()[0])
    alive = psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    if alive:
        psutil.Process(pid).kill()
    assert r.returncode == 0, r.stderr
    assert not alive, "the sampler outlived the interpreter"
    assert "ResourceWarning" not in r.stderr


def test_kept_workers_leave_no_folder_in_tmp_at_exit(tmp_path):
    """A loop that ends with the tuner's kept (persistent) workers alive: they are stopped
    before multiprocessing's exit handler terminates them, so each removes its /tmp/pymp-*
    folder (its socket for handing batches over). Terminated, each left one, every run;
    torch's default, new workers every epoch, leaves none."""
    import shutil
    import tempfile

    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import autotune
        from online_datasets import Slow
        loader = autotune.DataLoader(Slow(64, 0.0), batch_size=4, _controller=False)
        loader._force_config(2, 2)
        for epoch in range(2):
            for batch in loader:
                pass
        print("KEPT", len(loader._pools[0].pids()), flush=True)
        """))
    tmp = tempfile.mkdtemp(prefix="at-", dir="/tmp")   # a socket's path must stay short
    env = dict(os.environ, TMPDIR=tmp, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, HERE, os.environ.get("PYTHONPATH")) if p))
    try:
        r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
        left = sorted(os.listdir(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "KEPT 2" in r.stdout   # the workers were alive when the script ended
    assert left == [], left


def test_a_spawned_pool_handed_on_at_an_epochs_end_says_how_long_its_workers_took(decisions):
    """A user's walk (spawn, 13 batches an epoch): the first pool's spawned workers were
    not up when epoch 0 ended; handed on to epoch 1, its start read "workers up in 0.00 s",
    its ready flags never having been read."""
    loader = autotune.DataLoader(_Heavy(8), batch_size=4, shuffle=False,
                                 multiprocessing_context="spawn", key="spawn-handed-on")
    try:
        for _ in range(3):
            assert [x for b in loader for x in b.flatten().tolist()] == list(range(8))
    finally:
        loader.close()
    ups = [r.autotune.get("startup_s") for e, r in decisions() if e in ("started", "switched")]
    assert ups and all(u is None or u > 0.05 for u in ups), ups
    said = [r.getMessage() for e, r in decisions() if e in ("started", "switched")]
    assert not any("up in 0.00 s" in m for m in said), said
