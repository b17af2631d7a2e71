"""A job started by a distributed launcher (torchrun): its ranks are the training
processes, their children the workers, and the launcher in neither class
(autotune.monitor.tasks)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from autotune.monitor.tasks import TaskSampler, is_launcher

# Each rank forks one child that spins (a DataLoader worker decoding) and waits for it.
RANK = """
    import os, time
    pid = os.fork()
    if pid == 0:
        t = time.time()
        while time.time() - t < 6.0:
            pass
        os._exit(0)
    os.waitpid(pid, 0)
"""


def test_torchruns_ranks_are_the_main_class_and_their_children_the_workers(tmp_path: Path) -> None:
    # Before, the ranks were counted as workers and torchrun as the main process: a
    # decode-bound DDP job read "the 4 workers are … idle 44 %" (2 ranks + 2 workers) and
    # "main process … asleep 99 % (in a timer 97 %)" (torchrun's monitor loop).
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(RANK))
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node", "2", str(script)], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 5   # until its exec is done its argv is ours
        while not is_launcher(p.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert is_launcher(p.pid)
        s = TaskSampler(p.pid, psi=False).start()
        time.sleep(3.0)            # torchrun starts its ranks, the ranks their children
        s.take()
        time.sleep(1.5)
        b = s.take()
        s.stop()
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert b is not None
    main, workers = b.cls("main"), b.cls("workers")
    assert main is not None and workers is not None
    assert main.processes == 2, main.to_dict()
    assert workers.processes == 2, workers.to_dict()
    assert workers.share("on_cpu") + workers.share("runnable") > 0.5, workers.to_dict()
    # The ranks wait for their children: asleep, none of the spinning.
    assert main.share("on_cpu") < 0.2, main.to_dict()


def test_a_plain_python_job_is_no_launcher(tmp_path: Path) -> None:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        time.sleep(0.3)
        assert not is_launcher(p.pid)
    finally:
        p.kill()
        p.wait()
