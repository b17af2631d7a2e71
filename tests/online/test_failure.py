"""A pool that fails for a reason of autotune's (a worker killed, /dev/shm refused) does not
end the user's loop: the epoch carries on with every sample once, in the sampler's order.
The user's own exceptions still raise. Real worker processes; the /dev/shm cases run a loop
in a private mount namespace with a 64 MiB tmpfs, as Docker gives."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import Dataset, get_worker_info

import autotune
from online_datasets import Slow

HERE = os.path.dirname(os.path.abspath(__file__))
SHM_MSG = ("unable to allocate shared memory(shm) for file </torch_4242_1234567_0>: "
           "No space left on device (28)")


def _flat(batch):
    return batch.flatten().tolist()


def _order(shuffle, n=160, bs=4):
    gen = torch.Generator().manual_seed(5) if shuffle else None
    return [_flat(b) for b in TorchLoader(Slow(n, 0), batch_size=bs, shuffle=shuffle,
                                          generator=gen)]


@pytest.mark.parametrize("shuffle", [False, True])
def test_worker_killed_mid_step_epoch_completes(shuffle, decisions):
    """SIGKILL to a serving worker while the step sleeps: torch's SIGCHLD handler would
    raise in the step; here the epoch goes on, every index batch once, in order."""
    gen = torch.Generator().manual_seed(5) if shuffle else None
    loader = autotune.DataLoader(Slow(160, 0.001), batch_size=4, shuffle=shuffle,
                                 generator=gen, _controller=False)
    loader._force_config(2, 2)
    got, killed = [], []
    for i, b in enumerate(loader):
        got.append(_flat(b))
        pool = loader._pools[0]
        if not killed and i >= 5 and pool.config.num_workers == 2 and loader._switch is None:
            pid = pool.pids()[0]
            killed.append(pid)
            threading.Timer(0.05, os.kill, (pid, signal.SIGKILL)).start()
            time.sleep(0.4)  # the step, during which the worker dies
    assert killed
    assert got == _order(shuffle)
    fell = [r for e, r in decisions() if e == "fell-back"]
    assert len(fell) == 1 and "SIGKILL" in fell[0].getMessage()
    assert loader.num_workers < 2
    loader.close()


class RaisesAt(Dataset):
    def __init__(self, n: int, bad: int) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.bad:
            raise KeyError(f"no item {i}")
        return torch.tensor([i])


def test_user_error_in_getitem_still_raises(decisions):
    loader = autotune.DataLoader(RaisesAt(80, 37), batch_size=4, _controller=False)
    loader._force_config(2, 2)
    with pytest.raises(KeyError, match="no item 37"):
        for _ in loader:
            pass
    assert not [r for e, r in decisions() if e == "fell-back"]
    loader.close()


def shm_refused_in_worker(batch):
    """collate_fn: torch's own /dev/shm error wherever it runs in a worker."""
    if get_worker_info() is not None:
        raise RuntimeError(SHM_MSG)
    return torch.utils.data.default_collate(batch)


def test_shm_refused_in_workers_falls_back_to_the_process(decisions):
    """Every worker pool meets torch's shm error (a mock of the message, beside the real
    ENOSPC test below): the loop ends up loading in this process, nothing lost."""
    loader = autotune.DataLoader(Slow(80, 0), batch_size=4, collate_fn=shm_refused_in_worker,
                                 _controller=False)
    loader._force_config(2, 4)
    got = [_flat(b) for b in loader]
    assert got == _order(False, 80)
    assert loader.num_workers == 0
    fell = [r for e, r in decisions() if e == "fell-back"]
    assert fell and all("/dev/shm refused" in r.getMessage() for r in fell)
    loader.close()


def test_a_fallback_that_leaves_no_worker_is_said_at_warning(decisions):
    """/dev/shm refused every pool of a validation loader while the training loader's
    epoch holds its batches there: the rest of the run is made in the training process.
    That is said at WARNING (Python prints it with no logging set up), with the /dev/shm
    it needs, what the other loader holds and the fix; the steps to fewer workers stay
    INFO."""
    train = autotune.DataLoader(Slow(80, 0), batch_size=4, _controller=False)
    train._force_config(2, 2)
    it = iter(train)
    for _ in range(6):            # the training epoch is live, its workers' batches queued
        next(it)
    val = autotune.DataLoader(Slow(80, 0), batch_size=4, collate_fn=shm_refused_in_worker,
                              _controller=False)
    val._force_config(2, 4)
    got = [_flat(b) for b in val]
    workers = train.num_workers
    del it
    val.close()
    train.close()
    assert got == _order(False, 80) and workers == 2
    fell = [r for e, r in decisions() if e == "fell-back"]
    alone = [r for r in fell if not r.autotune["config"]["num_workers"]]
    assert len(alone) == 1 and alone[0].levelname == "WARNING", \
        [(r.levelname, r.getMessage()) for r in fell]
    msg = alone[0].getMessage()
    assert "another autotune.DataLoader" in msg and "--shm-size" in msg, msg
    assert all(r.levelname == "INFO" for r in fell if r not in alone)


def test_a_validation_loader_mid_epoch_fits_what_the_training_loaders_batches_leave(tmp_path):
    """A validation pass mid-epoch in Docker's 64 MiB /dev/shm, 9.2 MiB batches: the
    training loader's batches in flight hold most of it. The validation loader, made with
    the training loader, starts within what they leave. Before, each loader budgeted the
    whole of /dev/shm: the validation loader started at 2 workers, prefetch 2, and its pool
    met ENOSPC and fell back (1 of 1 runs; with 12 MiB batches, twice, down to none)."""
    r = _in_small_shm("beside", 2, 512, tmp_path)
    val = r["val"]
    assert val and val["in_order"], r
    assert not [e for e in val["events"] if e.startswith("fell-back")], val["events"]
    fit = [e for e in val["events"] if e.startswith("fit:")]
    assert fit and "another autotune.DataLoader" in fit[0], val["events"]
    assert r["every_sample_once"], r


def _in_small_shm(mode: str, seconds: float, n: int, tmp_path, size: str = "64m") -> dict:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a private /dev/shm")
    env = dict(os.environ, AUTOTUNE_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([os.getcwd(), HERE, os.environ.get("PYTHONPATH", "")]))
    cmd = (f"mount -t tmpfs -o size={size} tmpfs /dev/shm && exec {sys.executable} "
           f"{os.path.join(HERE, 'shm_loop.py')} {mode} {seconds} {n}")
    out = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", cmd],
                         env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_float_batches_in_64mib_shm_never_crash(tmp_path):
    """The issue's loop: 3x224x224 float32, batch 64 (37 MiB) in Docker's 64 MiB /dev/shm:
    no worker batch fits, so the loader fits the start point to the first batch and loads
    in the process; no crash, every sample once per epoch."""
    r = _in_small_shm("float", 6, 256, tmp_path)
    assert r["every_sample_once"] and r["epochs"] >= 1
    assert r["workers_seen"] == [0]
    assert any(e.startswith("fit:") for e in r["events"]), r["events"]
    # Said at WARNING (Python prints it with no logging set up), with what gives workers back.
    fit = [w for w in r["warned"] if w.startswith("fit:")]
    assert len(fit) == 1 and "--shm-size" in fit[0], r["warned"]


def test_batches_that_fit_several_times_still_get_workers(tmp_path):
    """uint8 3x224x224, batch 64 (9.2 MiB): several fit in 64 MiB, workers are used."""
    r = _in_small_shm("uint8", 6, 512, tmp_path)
    assert r["every_sample_once"]
    assert max(r["workers_seen"]) > 0, r["events"]
    assert not [w for w in r["warned"] if w.startswith("fit:")], r["warned"]   # INFO only


def test_gloo_ranks_on_a_cpu_node_share_the_whole_of_dev_shm(tmp_path):
    """One of 4 gloo ranks on a node with no GPU, Docker's 64 MiB /dev/shm, 4 MiB batches:
    its share is 16 MiB, room for a worker. Holding 20 MiB a rank back for NCCL, which a
    gloo job never starts, left every rank no /dev/shm and no worker for the whole run."""
    r = _in_small_shm("ranks4", 4, 512, tmp_path)
    assert r["every_sample_once"]
    assert max(r["workers_seen"]) > 0, r["events"]


def test_a_dev_shm_with_no_room_says_so_before_the_first_batch(tmp_path):
    """A full /dev/shm holds no worker's batch whatever its size: the start point is cut to
    no workers before the first batch, and that is said at WARNING with the fix (it was
    said nowhere: the fit after the first batch found nothing more to cut)."""
    r = _in_small_shm("full", 3, 256, tmp_path, size="8m")
    assert r["every_sample_once"] and r["workers_seen"] == [0]
    fit = [w for w in r["warned"] if w.startswith("fit:")]
    assert len(fit) == 1 and "before the first batch" in fit[0] and "--shm-size" in fit[0], \
        r["events"]


def test_real_enospc_in_workers_falls_back(tmp_path):
    """/dev/shm filled behind the loader's back: the workers' collate meets a real ENOSPC
    from torch's allocator; the epoch carries on with fewer workers or none, every sample
    once. The refused batch's file (torch does not unlink it) is gone with the failed pool:
    one was left in /dev/shm at each fallback."""
    r = _in_small_shm("fill", 4, 1280, tmp_path)
    assert r["every_sample_once"], r
    assert any(e.startswith("fell-back:") and "/dev/shm" in e for e in r["events"]), r["events"]
    assert r["shm_left"] == [], r["events"]


@pytest.mark.alone
def test_oom_group_halves_the_budgets(monkeypatch, decisions):
    """cgroup v2 memory.oom.group=1 (recorded: this machine mounts v1): the OOM killer would
    end the whole job, so both budgets are halved (a memory_budget given is kept) and the
    log says so."""
    import dataclasses

    import autotune.environment as environment

    free = autotune.DataLoader(Slow(40, 0), batch_size=4)
    real = environment.read_environment()
    grouped = dataclasses.replace(real, memory=dataclasses.replace(real.memory, oom_group=True))
    monkeypatch.setattr(environment, "read_environment", lambda *a, **k: grouped)
    given = autotune.DataLoader(Slow(40, 0), batch_size=4, memory_budget=2**30)
    default = autotune.DataLoader(Slow(40, 0), batch_size=4)
    assert [e for e, _ in decisions()].count("oom-group") == 2
    assert given._ctl.budget == 2**30
    assert default._ctl.budget < 0.75 * free._ctl.budget
    # /dev/shm is shared with other processes here: its free space moves a little.
    assert abs(given._ctl.shm - free._ctl.shm // 2) < 256 * 2**20
    for ld in (free, given, default):
        ld.close()


@pytest.mark.parametrize("given", [dict(num_workers=2), dict(num_workers=2, prefetch_factor=2)])
def test_shm_refused_with_the_users_workers_says_why_before_torchs_error(given, decisions):
    """With num_workers given (the documented way for WebDataset shards) and a /dev/shm too
    small for that many workers (Docker's 64 MiB and 224x224 float batches), nothing less
    is autotune's to try and torch's error is raised, as documented. It came alone: nothing
    said that /dev/shm was the cause, what the user's setting needs, or the fix."""
    loader = autotune.DataLoader(Slow(80, 0), batch_size=4, collate_fn=shm_refused_in_worker,
                                 **given)
    with pytest.raises(RuntimeError, match="unable to allocate shared memory"):
        for _ in loader:
            pass
    said = [r for e, r in decisions() if r.levelname == "WARNING" and "/dev/shm" in
            r.getMessage()]
    assert len(said) == 1, [r.getMessage() for _, r in decisions()]
    text = said[0].getMessage()
    assert "num_workers=2" in text and "--shm-size" in text, text
    loader.close()


_KILL_A_WORKER = """
import os, signal, threading, time
import torch, autotune
from torch.utils.data import Dataset

class Slow(Dataset):
    def __len__(self):
        return 80
    def __getitem__(self, i):
        time.sleep(0.001)
        return torch.tensor([i])

loader = autotune.DataLoader(Slow(), batch_size=4, _controller=False)
loader._force_config(2, 2)
killed = []
for i, b in enumerate(loader):
    pool = loader._pools[0]
    if not killed and i >= 5 and pool.config.num_workers == 2 and loader._switch is None:
        killed.append(pool.pids()[0])
        os.kill(killed[0], signal.SIGKILL)
        time.sleep(0.3)
loader.close()
assert killed
"""


def test_a_killed_worker_leaves_no_multiprocessing_folder(tmp_path):
    """A worker killed outright (the OOM killer, a fallback's SIGKILL) never removes the
    /tmp/pymp-* folder of the socket it handed batches over with: one was left per killed
    worker, run after run. The workers share the training process's, removed at its exit."""
    # A short TMPDIR of its own: a socket's path is at most 107 bytes, which xdist's
    # tmp_path below it would pass (a test of its own, below).
    tmp = tempfile.mkdtemp(prefix="at-mp-", dir="/tmp")
    try:
        out = subprocess.run([sys.executable, "-c", _KILL_A_WORKER], capture_output=True,
                             text=True, timeout=120, env=dict(os.environ, TMPDIR=tmp))
        assert out.returncode == 0, out.stderr[-3000:]
        assert sorted(os.listdir(tmp)) == []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_FOUR_EPOCHS = """
import logging, sys, time
import torch, autotune
from torch.utils.data import Dataset

class Items(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        return torch.tensor([i])

logging.basicConfig(level=logging.INFO, stream=sys.stderr)
loader = autotune.DataLoader(Items(), batch_size=4, _controller=False)
loader._force_config(2, 2)
for epoch in range(2):
    assert sorted(int(x) for b in loader for x in b) == list(range(64))
loader.close()
"""


def test_workers_run_under_a_tmpdir_too_long_for_their_sockets(tmp_path):
    """A TMPDIR past about 75 bytes (a pytest tmp_path, a deep job folder): a worker's
    socket path is over AF_UNIX's 107 bytes, its bind fails, and torch waits for its batch
    for ever, where the loop had run without workers before. The workers' folder is then
    a short one, said at INFO."""
    tmp = tmp_path / ("t" * 80)
    tmp.mkdir()
    out = subprocess.run([sys.executable, "-c", _FOUR_EPOCHS], capture_output=True,
                         text=True, timeout=90, env=dict(os.environ, TMPDIR=str(tmp)))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "is too long for the DataLoader workers' sockets" in out.stderr


_SPAWNED = """
import logging, os, sys, tempfile
import torch, autotune
from torch.utils.data import DataLoader as TorchLoader
from online_datasets import Slow, WorkerOnly, open_handle

def epochs(cls, dataset, **kw):
    g = torch.Generator().manual_seed(3)
    loader = cls(dataset, batch_size=4, shuffle=True, generator=g, **kw)
    got = [[x for b in loader for x in b.flatten().tolist()] for _ in range(2)]
    return got, loader

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    tmpdir = os.environ["TMPDIR"]
    want, _ = epochs(TorchLoader, Slow(48, 0))  # torch's order (no worker: no socket)
    # WorkerOnly fails unless the user's worker_init_fn ran in each worker.
    got, loader = epochs(autotune.DataLoader, WorkerOnly(48), num_workers=2, timeout=30,
                         multiprocessing_context=sys.argv[1], worker_init_fn=open_handle,
                         _controller=False)
    loader.close()
    assert got == want, (got, want)
    assert os.environ["TMPDIR"] == tmpdir and tempfile.gettempdir() == tmpdir
"""


@pytest.mark.parametrize("ctx", ["spawn", "forkserver"])
def test_spawned_workers_run_under_a_tmpdir_too_long_for_their_sockets(tmp_path, ctx):
    """Spawn and forkserver workers start a new interpreter, which made its own folder
    under the long TMPDIR rather than take the main process's short one: their sockets'
    bind failed and torch waited for the batch until timeout= (for ever without one); a
    forkserver's own socket failed at once. Each worker is told the short folder in its
    worker_init_fn; the user's runs too, TMPDIR is the user's, the order torch's, and the
    folder is gone with the process."""
    tmp = tmp_path / ("t" * 80)
    tmp.mkdir()
    script = tmp_path / "train.py"  # a file: spawned workers import the main module
    script.write_text(_SPAWNED)
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=os.pathsep.join(
        p for p in (HERE, os.environ.get("PYTHONPATH")) if p))
    out = subprocess.run([sys.executable, str(script), ctx],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    said = [line for line in out.stderr.splitlines() if "their folder is " in line]
    assert said, out.stderr[-3000:]
    folder = said[0].rsplit("their folder is ", 1)[1].strip()
    assert not os.path.exists(folder)
    assert sorted(os.listdir(tmp)) == []


_KILL_A_SPAWNED_WORKER = """
import os, signal, time
import autotune
from online_datasets import Slow

if __name__ == "__main__":
    loader = autotune.DataLoader(Slow(200, 0.002), batch_size=4, _controller=False,
                                 multiprocessing_context="spawn")
    loader._force_config(2, 2)
    killed = []
    for _ in range(2):
        for b in loader:
            pool = loader._pools[0]
            if not killed and pool.config.num_workers == 2 and pool.pids():
                killed.append(pool.pids()[0])
                os.kill(killed[0], signal.SIGKILL)
                time.sleep(0.3)
    loader.close()
    assert killed
"""


def test_a_killed_spawned_worker_leaves_no_multiprocessing_folder(tmp_path):
    """A spawned worker made its own folder for its socket, under TMPDIR, and one killed
    outright left it there: it shares the training process's too, removed at its exit."""
    tmp = tempfile.mkdtemp(prefix="at-mp-", dir="/tmp")  # short: see the test above
    script = tmp_path / "train.py"
    script.write_text(_KILL_A_SPAWNED_WORKER)
    env = dict(os.environ, TMPDIR=tmp, PYTHONPATH=os.pathsep.join(
        p for p in (HERE, os.environ.get("PYTHONPATH")) if p))
    try:
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                             timeout=120, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        assert sorted(os.listdir(tmp)) == []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_worker_killed_mid_handover_is_a_killed_worker_not_the_users_error():
    """A review: a worker SIGKILLed (the OOM killer) while it handed a batch's tensors over
    reset the connection torch was reading them from; ConnectionResetError out of
    rebuild_storage_fd was no failure of ours and raised into the user's loop (2 runs in
    21 of a two-rank test)."""
    import multiprocessing
    import signal

    from autotune.online import failure

    p = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,))
    p.start()
    os.kill(p.pid, signal.SIGKILL)

    def rebuild_storage_fd():   # torch's frame, as _in_fd_handover finds it
        raise ConnectionResetError(104, "Connection reset by peer")
    try:
        rebuild_storage_fd()
    except ConnectionResetError as e:
        got = failure.classify(e, [p])
    assert got is not None and got.kind == "killed" and "SIGKILL" in got.detail, got
    try:
        rebuild_storage_fd()
    except ConnectionResetError as e:   # no worker gone: not ours, raised as it is
        assert failure.classify(e, []) is None
