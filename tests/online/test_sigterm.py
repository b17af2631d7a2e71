"""A training process ended by SIGTERM alone (`kill PID`, as SLURM preemption and a
Kubernetes pod's end send it): no worker and no forkserver of autotune's pools outlives it.
Real processes, each script in a session of its own so that what it leaves can be found."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

_SCRIPT = textwrap.dedent("""
    import os, sys, time
    import autotune
    from online_datasets import Slow

    def _init(worker_id):
        # Tells the test this worker is starting; holds it there for INIT_S seconds.
        open(os.path.join(os.environ["MARKS"], f"init-{os.getpid()}"), "w").close()
        time.sleep(float(os.environ["INIT_S"]))

    if __name__ == "__main__":
        dl = autotune.DataLoader(Slow(100000, 0.001), batch_size=4, _controller=False,
                                 multiprocessing_context=sys.argv[1], worker_init_fn=_init)
        dl._force_config(2, 2)
        for batch in dl:
            print("BATCH", flush=True)
            time.sleep(0.01)
""")


def _session(sid: int) -> list[int]:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (psutil.Error, ProcessLookupError, PermissionError):
            pass
    return out


def _left_after_sigterm(tmp_path, ctx: str, init_s: float, when: str) -> list[str]:
    """Run the script, SIGTERM its main process alone at `when` ("batches": mid-epoch,
    "init": while its workers start), and return what of its session is left 30 s later."""
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ, MARKS=str(marks), INIT_S=str(init_s), PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, HERE, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.Popen([sys.executable, str(script), ctx], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        if when == "batches":
            for _ in range(20):
                assert proc.stdout.readline() == "BATCH\n"
        else:
            while len(os.listdir(marks)) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(os.listdir(marks)) == 2, "the workers never started"
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM
        deadline = time.monotonic() + 30  # torch's watchdog looks every 5 s
        while _session(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = []
        for pid in _session(proc.pid):
            with_cmd = psutil.Process(pid)
            left.append(" ".join(with_cmd.cmdline())[:120])
        return left
    finally:
        for pid in _session(proc.pid):  # only this test's own session
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.stdout.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_forkserver_workers_end_with_the_training_process(tmp_path):
    """Every forkserver child held the pipe end whose closing tells the forkserver that the
    training process is gone, and torch's watchdog watches a worker's parent, the
    forkserver: both lived on for good (plain torch's too)."""
    assert _left_after_sigterm(tmp_path, "forkserver", 0.0, "batches") == []


@pytest.mark.parametrize("ctx", ["spawn", "forkserver"])
def test_workers_starting_when_the_training_process_dies_end(tmp_path, ctx):
    """A worker still starting (a spawn worker's second; a pool started beside the serving
    one) when the training process dies: torch's watchdog, made after worker_init_fn, took
    the adopter for its parent and the worker waited for indices for ever."""
    assert _left_after_sigterm(tmp_path, ctx, 3.0, "init") == []
