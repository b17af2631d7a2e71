"""A distributed job's ranks are the training processes, their children the workers, and
what only starts them in neither class (autotune.monitor.tasks, launchers.ranks_of):
torchrun, torch.multiprocessing.spawn, and a script that runs itself again per rank
(Lightning's DDP)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from autotune.monitor.launchers import StepWriters, children, helper, ranks_of
from autotune.monitor.tasks import TaskSampler, is_launcher
from autotune.runqueue import descendants

# Each rank forks one child that spins (a DataLoader worker decoding) and waits for it.
RANK = """
import os, time
pid = os.fork()
if pid == 0:
    t = time.time()
    while time.time() - t < 60.0:   # the test kills the job when it has seen it
        pass
    os._exit(0)
os.waitpid(pid, 0)
"""


def _budget(p: subprocess.Popen, ready, **kw):
    """The classes' budgets of job `p` once `ready()`, over 1.5 s; the job killed after."""
    try:
        deadline = time.monotonic() + 60   # spawned ranks import torch first: seconds
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ready()
        s = TaskSampler(p.pid, psi=False, **kw).start()
        time.sleep(1.0)
        s.take()
        time.sleep(1.5)
        b = s.take()
        s.stop()
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert b is not None
    main, workers = b.cls("main"), b.cls("workers")
    assert main is not None, b.to_dict()
    return main, workers


def _two_ranks_wait_for_two_spinning_workers(main, workers) -> None:
    assert main.processes == 2, main.to_dict()
    assert workers is not None and workers.processes == 2, workers.to_dict()
    assert workers.share("on_cpu") + workers.share("runnable") > 0.5, workers.to_dict()
    assert main.share("on_cpu") < 0.2, main.to_dict()   # the ranks wait for their children


def test_torchruns_ranks_are_the_main_class_and_their_children_the_workers(tmp_path: Path) -> None:
    # Before, the ranks were counted as workers and torchrun as the main process: a
    # decode-bound DDP job read "the 4 workers are … idle 44 %" (2 ranks + 2 workers) and
    # "main process … asleep 99 % (in a timer 97 %)" (torchrun's monitor loop).
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(RANK))
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node", "2", str(script)], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Until its exec is done torchrun's argv is ours; then its ranks start their children.
    _two_ranks_wait_for_two_spinning_workers(*_budget(p, lambda: is_launcher(p.pid) and
                                                      _ranks_with_workers(p.pid)))


def test_a_plain_python_job_is_no_launcher(tmp_path: Path) -> None:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        time.sleep(0.3)
        assert not is_launcher(p.pid)
    finally:
        p.kill()
        p.wait()


# torch.multiprocessing.spawn of 2 ranks, as PyTorch's DDP tutorial starts them (argv[2]
# "fork"; the other modes start the same processes through multiprocessing's spawn
# context, as torch.multiprocessing.spawn does, without each rank's second of importing
# torch). argv[2]: "fork": each rank forks a child that spins (its DataLoader worker
# decoding) and waits for it; "forkserver": the same child from a forkserver (a
# DataLoader's forkserver context, Python 3.14's default); "epoch": a child that spins
# 1 s and exits (workers not kept between epochs), then the rank spins itself; "self":
# the rank spins itself (num_workers=0) and writes a step log's header with its pid to
# argv[1], as autotune.instrument does.
SPAWN = """
    import itertools, json, multiprocessing, os, sys, time

    def spin(s):   # the test kills the job when it has seen it
        t = time.time()
        while time.time() - t < s:
            pass

    def rank(r, log, mode):
        if mode == "forkserver":
            ctx = multiprocessing.get_context("forkserver")
            w = ctx.Process(target=sum, args=(itertools.count(),))
            w.start()
            w.join()
        elif mode in ("fork", "epoch"):
            pid = os.fork()
            if pid == 0:
                spin(60.0 if mode == "fork" else 1.0)
                os._exit(0)
            os.waitpid(pid, 0)
        if mode in ("self", "epoch"):
            if mode == "self":
                with open(log, "a") as f:
                    f.write(json.dumps({"autotune": "steps", "pid": os.getpid()}) + "\\n")
            spin(60.0)

    if __name__ == "__main__":
        log, mode = sys.argv[1], sys.argv[2]
        if mode == "fork":
            import torch.multiprocessing
            torch.multiprocessing.spawn(rank, args=(log, mode), nprocs=2)
        else:
            ctx = multiprocessing.get_context("spawn")
            ranks = [ctx.Process(target=rank, args=(r, log, mode)) for r in range(2)]
            for p in ranks:
                p.start()
            for p in ranks:
                p.join()
"""


def _ranks_with_workers(pid: int) -> bool:
    """Both ranks of job `pid` found, each with a worker of its own started."""
    ranks = ranks_of(pid)[0]
    return len(ranks) == 2 and all(any(not helper(d) for d in descendants(r)) for r in ranks)


def _spawn_job(tmp_path: Path, mode: str) -> subprocess.Popen:
    script = tmp_path / "spawner.py"
    script.write_text(textwrap.dedent(SPAWN))
    return subprocess.Popen([sys.executable, str(script), str(tmp_path / "steps.jsonl"), mode],
                            start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def test_spawned_ranks_with_workers_are_the_main_class(tmp_path: Path) -> None:
    # Before: main was the spawning process, asleep in join ("1 procs, asleep 100 %"), and
    # the ranks, their workers and multiprocessing's resource tracker 5 "workers".
    p = _spawn_job(tmp_path, "fork")
    _two_ranks_wait_for_two_spinning_workers(*_budget(p, lambda: _ranks_with_workers(p.pid)))


def test_spawned_ranks_whose_workers_come_from_a_forkserver_are_the_main_class(
        tmp_path: Path) -> None:
    p = _spawn_job(tmp_path, "forkserver")
    main, workers = _budget(p, lambda: _ranks_with_workers(p.pid))
    _two_ranks_wait_for_two_spinning_workers(main, workers)


def test_spawned_ranks_stay_ranks_between_epochs(tmp_path: Path) -> None:
    # A rank's workers stop at each epoch's end (persistent_workers=False): the tree then
    # shows no sign; the ranks seen before stay ranks.
    p = _spawn_job(tmp_path, "epoch")
    try:
        deadline = time.monotonic() + 60
        while not (ranks := ranks_of(p.pid)[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(ranks) == 2
        while any(children(r) for r in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(children(r) for r in ranks)
        assert ranks_of(p.pid) == (set(), set())
        assert ranks_of(p.pid, known=frozenset(ranks)) == (ranks, {p.pid})
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_spawned_ranks_that_load_themselves_are_told_by_their_step_log(tmp_path: Path) -> None:
    # A rank with num_workers=0 starts no process: the tree cannot tell it from a spawned
    # DataLoader worker. Its step log's header can. Before: main was the spawner, asleep
    # 100 % ("waits on something else"), and the loading ranks were "workers".
    p = _spawn_job(tmp_path, "self")
    writers = StepWriters(tmp_path / "steps.jsonl")
    main, workers = _budget(p, lambda: len(writers()) == 2, trainers=writers)
    assert main.processes == 2, main.to_dict()
    assert main.share("on_cpu") + main.share("runnable") > 0.5, main.to_dict()
    assert workers is None or workers.processes == 0, workers.to_dict()


# A script that runs itself again for local rank 1, with LOCAL_RANK in its environment,
# as Lightning's DDP does; each rank forks a child that spins (its DataLoader worker).
AGAIN = """
import os, subprocess, sys
again = None
if "LOCAL_RANK" not in os.environ:
    again = subprocess.Popen([sys.executable] + sys.argv, env=dict(os.environ, LOCAL_RANK="1"))
""" + RANK + """
if again is not None:
    again.wait()
"""


def test_a_script_that_runs_itself_again_per_rank_is_the_main_class(tmp_path: Path) -> None:
    # Before: main was local rank 0 alone, and rank 1 one of 3 "workers".
    script = tmp_path / "again.py"
    script.write_text(textwrap.dedent(AGAIN))
    env = {k: v for k, v in os.environ.items() if k != "LOCAL_RANK"}
    p = subprocess.Popen([sys.executable, str(script)], start_new_session=True, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _two_ranks_wait_for_two_spinning_workers(*_budget(p, lambda: _ranks_with_workers(p.pid)))


def test_step_writers_reads_headers_as_they_come(tmp_path: Path) -> None:
    log = tmp_path / "steps.jsonl"
    writers = StepWriters(log)
    assert writers() == frozenset()                       # no file yet
    head = '{"autotune": "steps", "version": 1, "pid": 11, "host": null}\n'
    log.write_text(head + '{"t": 1, "wait_s": 0.1}\n{"autotune": "steps", "pid": 1')
    assert writers() == {11}                              # the cut line is kept for later
    with log.open("a") as f:
        f.write('2, "host": "elsewhere"}\n{"autotune": "steps", "pid": 13}\n')
        f.write('{"autotune": "steps", "pid": "14"}\n{"autotune": "steps", "pid": -1}\n')
        f.write('{"autotune": "steps", "pid": 15, "junk": "' + "x" * (70 << 10) + '"}\n')
        f.write('{"autotune": "steps", "pid": 17, "deep": ' + "[" * 5000 + "]" * 5000 + '}\n')
    # another host's, a pid not a number, a long line, one too deep for json
    assert writers() == {11, 13}
    log.write_text('{"autotune": "steps", "pid": 16}\n')   # a new run truncated it
    assert writers() == {11, 13, 16}
