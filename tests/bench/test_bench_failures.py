"""Failures end as failed results with a reason and a hint, and leave no process behind.

Real failures of real worker processes: a corrupt JPEG, a step that raises or hangs, a
worker killed (as the OOM killer does) or stopped (a hung worker), a low open-files limit,
and a full /dev/shm (a tiny tmpfs in a private mount namespace).
"""

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
from pathlib import Path

import psutil
import pytest

from autotune.bench import BenchConfig, run_bench


def _cfg(**kw) -> BenchConfig:
    base = dict(num_workers=2, batch_size=4, seconds=3, cold=False, timeout_s=90)
    base.update(kw)
    return BenchConfig.from_preset("decode-only", **base)


@pytest.fixture
def corrupt_ds(small_dataset: Path, tmp_path: Path) -> Path:
    d = tmp_path / "ds"
    shutil.copytree(small_dataset, d)
    (d / "class_0002" / "zz_corrupt.jpg").write_bytes(b"\xff\xd8 this is not a JPEG")
    return d


def test_corrupt_file_fails_naming_the_file(corrupt_ds: Path, no_leftovers) -> None:
    r = run_bench(corrupt_ds, _cfg(seconds=30))  # the whole (warm) set is read: it hits the file
    assert r.failed and r.failure_kind == "worker_error", (r.failure_kind, r.reason)
    assert "zz_corrupt.jpg: cannot decode" in r.reason
    assert "fix or remove the file" in r.hint
    assert r.images_per_s is None
    no_leftovers(r)


def test_step_that_raises(small_dataset: Path, tmp_path: Path, no_leftovers) -> None:
    step = tmp_path / "badstep.py"
    step.write_text("def step(batch):\n    raise ValueError('loss is NaN at batch 0')\n")
    r = run_bench(small_dataset, _cfg(step=f"{step}:step"))
    assert r.failed and r.failure_kind == "step_error"
    assert "raised ValueError: loss is NaN at batch 0" in r.reason and "--compute-ms" in r.hint
    no_leftovers(r)


def test_real_step_is_called_with_the_batch(small_dataset: Path, tmp_path: Path, no_leftovers) -> None:
    step = tmp_path / "goodstep.py"
    out = tmp_path / "shapes.txt"
    step.write_text(
        "import time\n"
        f"def step(batch):\n"
        f"    x, y = batch\n"
        f"    open({str(out)!r}, 'a').write(f'{{tuple(x.shape)}} {{x.dtype}} {{len(y)}}\\n')\n"
        "    time.sleep(0.02)\n")
    r = run_bench(small_dataset, _cfg(step=f"{step}:step", seconds=1, warmup_batches=2))
    assert not r.failed, r.reason
    assert out.read_text().splitlines()[0] == "(4, 3, 224, 224) torch.float32 4"
    assert r.au is not None and r.step_ms["p50"] >= 19
    no_leftovers(r)


def test_a_real_step_too_long_for_the_window_names_the_seconds_it_needs(
        small_dataset: Path, tmp_path: Path, no_leftovers) -> None:
    # A real step's time is known only once measured: 1.5 s per batch in a 2 s window
    # kept open 10 s more for the batches a figure needs holds 8. The hint names the
    # window the pace measured needs: 2 warm-up + 10 batches of at least 1.5 s each (a
    # busy machine can only make it longer).
    step = tmp_path / "slowstep.py"
    step.write_text("import time\ndef step(batch):\n    time.sleep(1.5)\n")
    r = run_bench(small_dataset, _cfg(step=f"{step}:step", seconds=2, warmup_batches=2))
    assert r.failed and r.failure_kind == "too_few_batches", r.reason
    assert r.window["batches"] < 10 and r.window["extended_s"] >= 9, r.window
    import re

    m = re.search(r"give --seconds (\d+) or more \(2 warm-up \+ 10 batches at the ", r.hint)
    assert m and int(m.group(1)) >= 18, r.hint


def test_a_window_too_short_for_a_real_step_stays_open_for_the_batches_it_needs(
        small_dataset: Path, tmp_path: Path, no_leftovers) -> None:
    # 0.3 s per batch: a 1 s window holds 3 batches, so it stays open past --seconds
    # until it holds the 10 a figure needs (about 3 s), then closes.
    step = tmp_path / "step.py"
    step.write_text("import time\ndef step(batch):\n    time.sleep(0.3)\n")
    r = run_bench(small_dataset, _cfg(step=f"{step}:step", seconds=1, warmup_batches=2))
    assert not r.failed, r.reason
    assert r.window["batches"] == 10 and r.window["extended_s"] > 0, r.window
    assert r.window["requested_seconds"] == 1 and r.window["seconds"] >= 3, r.window
    no_leftovers(r)


def _run_in_thread(ds: Path, cfg: BenchConfig) -> tuple[threading.Thread, dict]:
    """run_bench in a thread; box["measuring"] is set once the measured window starts."""
    box: dict = {"measuring": threading.Event()}

    def progress(msg: str) -> None:
        if msg.startswith("measuring"):
            box["measuring"].set()

    def target() -> None:
        try:
            box["res"] = run_bench(ds, cfg, progress=progress)
        except BaseException as e:  # noqa: BLE001  (shown by the test, not lost in a thread)
            box["error"] = e
            box["measuring"].set()

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, box


def _workers(box: dict, n: int, measurement_processes, timeout: float = 60.0) -> list[psutil.Process]:
    """The DataLoader workers (children of the measurement process) while it measures."""
    started = box["measuring"].wait(timeout)
    assert started, f"the measurement did not start: {getattr(box.get('res'), 'reason', None)}"
    assert "error" not in box, box["error"]
    procs = measurement_processes()
    root = next(p for p in procs if p.ppid() not in {q.pid for q in procs})
    kids = [k for k in root.children() if k.status() != psutil.STATUS_ZOMBIE]
    assert len(kids) == n, kids
    return kids


def test_worker_killed_like_the_oom_killer_does(bench_ds: Path, no_leftovers,
                                                live_measurements) -> None:
    t, box = _run_in_thread(bench_ds, _cfg(seconds=60, compute_ms=20))
    victim = _workers(box, 2, live_measurements)[0]
    victim.send_signal(signal.SIGKILL)
    t.join(60)
    r = box["res"]
    assert r.failed and r.failure_kind == "worker_killed", (r.failure_kind, r.reason)
    assert f"pid {victim.pid} was killed by SIGKILL" in r.reason and "OOM" in r.reason
    assert "fewer workers" in r.hint
    no_leftovers(r)


def test_hung_worker_hits_the_dataloader_timeout(small_dataset: Path, tmp_path: Path,
                                                 no_leftovers) -> None:
    # A FIFO named like an image: the worker that opens it blocks in open(), as on a hung
    # network mount, while its other threads (which hand batches over) stay alive.
    d = tmp_path / "ds"
    shutil.copytree(small_dataset, d)
    os.mkfifo(d / "class_0001" / "zz_hung.jpg")
    r = run_bench(d, _cfg(seconds=30, batch_timeout_s=3))
    assert r.failed and r.failure_kind == "timeout", (r.failure_kind, r.reason)
    assert "no batch arrived for 3" in r.reason and "--batch-timeout" in r.hint
    no_leftovers(r)


@pytest.mark.slow
def test_frozen_worker_hits_the_hard_timeout(bench_ds: Path, no_leftovers,
                                             live_measurements) -> None:
    # SIGSTOP freezes every thread of the worker, including the one that passes batch
    # file descriptors: the main process then blocks inside the queue read, beyond the
    # DataLoader timeout's reach. Only the hard timeout ends it. (The workers are stopped
    # as soon as the measurement starts, long before its 5 s window could end.) The hard
    # timeout counts from the process's start: on a busy CI machine the start-up and the
    # warm-up alone took over 10 s, so the timeout ended the run before it measured
    # anything and the workers were never stopped. 30 s leaves that start-up room.
    t, box = _run_in_thread(bench_ds, _cfg(seconds=5, batch_timeout_s=3, timeout_s=30))
    stopped = _workers(box, 2, live_measurements)
    for w in stopped:
        w.send_signal(signal.SIGSTOP)
    t.join(90)
    r = box["res"]
    assert r.failed and r.failure_kind in ("hung", "timeout"), (r.failure_kind, r.reason)
    if r.failure_kind == "hung":
        assert "no result after 30 s (hard timeout)" in r.reason and r.process["timed_out"]
    assert all(not psutil.pid_exists(w.pid) for w in stopped)  # stopped, then killed
    no_leftovers(r)


def test_too_many_open_files(small_dataset: Path, no_leftovers) -> None:
    r = run_bench(small_dataset, _cfg(num_workers=4, max_open_files=24))
    assert r.failed and r.failure_kind == "open_files", (r.failure_kind, r.reason)
    assert "too many open files (limit 24" in r.reason and "ulimit -n" in r.hint
    no_leftovers(r)


def test_a_worker_out_of_open_files_is_named_not_a_hung_storage(small_dataset: Path,
                                                                  tmp_path: Path,
                                                                  no_leftovers) -> None:
    """96 tensors a batch under ulimit -n 140: the worker's queue thread fails with EMFILE
    and drops the batch, so the measurement waits until the DataLoader timeout. It read as
    "a worker is hung or the storage stalled", with a hint about mounts."""
    r = run_bench(small_dataset, _cfg(dataset_factory=f"{_many_tensors(tmp_path)}:make",
                                      max_open_files=140, batch_timeout_s=5, prefetch_factor=2))
    assert r.failed and r.failure_kind == "open_files", (r.failure_kind, r.reason)
    assert "too many open files (limit 140" in r.reason and "ulimit -n" in r.hint, r.reason
    assert "storage" not in r.hint
    # --max-open-files is not this process's limit: both ways to raise one are named.
    assert "docker run --ulimit" in r.hint and "no privilege" not in r.hint, r.hint
    no_leftovers(r)


def _many_tensors(tmp_path: Path) -> Path:
    """A dataset factory whose batches are 96 tensors a sample: past ulimit -n 140."""
    factory = tmp_path / "many.py"
    factory.write_text("import torch\n"
                       "class Many(torch.utils.data.Dataset):\n"
                       "    def __len__(self):\n        return 400\n"
                       "    def __getitem__(self, i):\n"
                       "        return [torch.full((8,), i) for _ in range(96)]\n"
                       "def make(root):\n    return Many()\n")
    return factory


def test_bench_under_a_low_soft_limit_names_the_hard_one(small_dataset: Path,
                                                         tmp_path: Path) -> None:
    """A container's soft limit under a far higher hard one (bench run in that shell, no
    --max-open-files): the hint said `ulimit -n 65536` whatever the hard limit was, as
    though it needed privilege. It now names the hard limit's figure, as the loader does."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= 1024:
        pytest.skip(f"the hard open-files limit is {hard}: no room to lower the soft one")
    script = tmp_path / "bench_low.py"
    script.write_text(
        "import json, sys\n"
        "from autotune.bench import BenchConfig, run_bench\n"
        "cfg = BenchConfig.from_preset('decode-only', num_workers=2, batch_size=4, seconds=3,\n"
        "    cold=False, timeout_s=90, batch_timeout_s=5, prefetch_factor=2,\n"
        "    dataset_factory=sys.argv[2])\n"
        "r = run_bench(sys.argv[1], cfg)\n"
        "print(json.dumps({'kind': r.failure_kind, 'reason': r.reason, 'hint': r.hint}))\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    p = subprocess.run([sys.executable, str(script), str(small_dataset),
                        f"{_many_tensors(tmp_path)}:make"], capture_output=True, text=True,
                       env=env, timeout=180, preexec_fn=lambda: resource.setrlimit(
                           resource.RLIMIT_NOFILE, (140, hard)))
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.splitlines()[-1])
    assert r["kind"] == "open_files" and "limit 140" in r["reason"], r
    assert "so no privilege is needed" in r["hint"] and "ulimit -n" in r["hint"], r["hint"]


def test_a_batch_a_worker_cannot_pickle_is_named_not_a_hung_storage(small_dataset: Path,
                                                                     tmp_path: Path,
                                                                     no_leftovers) -> None:
    """A sample holding a generator: each worker's queue thread fails to pickle its batch
    and drops it, and the measurement waits until the DataLoader timeout. It read as "a
    worker is hung or the storage stalled", with a hint about mounts."""
    factory = tmp_path / "lazy.py"
    factory.write_text("import torch\n"
                       "class Lazy(torch.utils.data.Dataset):\n"
                       "    def __len__(self):\n        return 400\n"
                       "    def __getitem__(self, i):\n"
                       "        return torch.zeros(4), (i * k for k in range(3))\n"
                       "def make(root):\n    return {\"dataset\": Lazy(), \"collate_fn\": lambda b: b}\n")
    r = run_bench(small_dataset, _cfg(dataset_factory=f"{factory}:make", batch_timeout_s=5))
    assert r.failed and r.failure_kind == "unsendable", (r.failure_kind, r.reason)
    assert "cannot pickle 'generator' object" in r.reason, r.reason
    assert "storage" not in r.hint and "--workers 0" in r.hint, r.hint
    no_leftovers(r)


@pytest.mark.root
def test_full_dev_shm(small_dataset: Path, no_leftovers, tiny_shm) -> None:
    r = run_bench(small_dataset, _cfg(), popen=tiny_shm)
    assert r.failed and r.failure_kind == "shm", (r.failure_kind, r.reason)
    assert "/dev/shm" in r.reason and "--shm-size" in r.hint
    assert "used of 0 MiB" in r.reason  # the child's own (tiny) /dev/shm, not ours
    no_leftovers(r)


def _measuring_parent(tmp_path: Path, dataset: Path, **env: str) -> subprocess.Popen:
    """A process that calls run_bench (a minute's window; Ctrl-C exits 130), returned once
    the measurement runs."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import sys\n"
        "from autotune.bench import BenchConfig, run_bench\n"
        "cfg = BenchConfig.from_preset('decode-only', num_workers=2, batch_size=4, seconds=60,\n"
        "                              cold=False, compute_ms=50)\n"
        "try:\n"
        "    run_bench(sys.argv[1], cfg, progress=lambda m: print(m, flush=True))\n"
        "except KeyboardInterrupt:\n"
        "    sys.exit(130)\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), **env}
    parent = subprocess.Popen([sys.executable, str(script), str(dataset)],
                              stdout=subprocess.PIPE, text=True, env=env)
    for line in parent.stdout:
        if line.startswith("measuring"):
            break
    return parent


def test_killed_bench_parent_takes_its_measurement_along(small_dataset: Path, tmp_path: Path,
                                                         live_measurements) -> None:
    # The process calling run_bench dies outright (SIGKILL: no finally runs): the
    # measurement process and its workers must not outlive it.
    parent = _measuring_parent(tmp_path, small_dataset)
    kids = [p for p in psutil.Process(parent.pid).children(recursive=True)]
    assert len(kids) >= 3  # measurement process + 2 workers
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in kids):
        time.sleep(0.1)
    assert not [p.pid for p in kids if _alive(p)]
    # The killed parent could not remove its scratch directory; the next run_bench would.
    for d in Path(tempfile.gettempdir()).glob(f"autotune-bench-{parent.pid}-*"):
        shutil.rmtree(d, ignore_errors=True)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_ctrl_c_leaves_no_folder_of_the_workers_in_tmp(small_dataset: Path, tmp_path: Path) -> None:
    # Each worker that hands a batch over by file descriptor makes multiprocessing's
    # /tmp/pymp-* folder (its socket for the descriptors); a worker killed on Ctrl-C never
    # removed it. They now live in the run's scratch folder, which the run removes.
    # A short TMPDIR (pytest's own folders are too deep for a socket's path below it).
    tmp = Path(tempfile.mkdtemp(prefix="at-", dir="/tmp"))
    parent = _measuring_parent(tmp_path, small_dataset, TMPDIR=str(tmp))
    time.sleep(1.0)   # batches handed over: each worker has its socket
    parent.send_signal(signal.SIGINT)
    assert parent.wait(timeout=60) == 130
    left = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*"))
    shutil.rmtree(tmp, ignore_errors=True)
    assert left == [], left


@pytest.mark.parametrize("length", [60, 85])
def test_a_pruned_trial_under_a_long_tmpdir_leaves_no_folder_of_its_workers(
        small_dataset: Path, monkeypatch: pytest.MonkeyPatch, no_leftovers, length: int) -> None:
    # Under a TMPDIR this long the scratch folder's `mp` is too deep for a socket's path;
    # the workers' folder is then a short one beside the scratch folder (60), or, that too
    # long as well (85: a cluster's per-job folder), in /tmp: not multiprocessing's own
    # pymp-* (which each worker the prune's SIGKILL ends left). At 85 the workers' sockets
    # did not fit at all and the measurement hung to its hard timeout.
    tmp = Path(tempfile.mkdtemp(prefix="at-", dir="/tmp"))
    deep = tmp / ("d" * (length - len(str(tmp)) - 1))
    deep.mkdir()
    monkeypatch.setenv("TMPDIR", str(deep))
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    before = set(Path("/tmp").glob("autotune-mp-*"))
    try:
        r = run_bench(small_dataset, _cfg(seconds=30, compute_ms=20, timeout_s=60),
                      on_tick=lambda s, ips: "pruned: test")
        left = sorted(str(p.relative_to(deep)) for p in deep.rglob("*"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert r.failed and r.failure_kind == "pruned", (r.failure_kind, r.reason)
    assert left == [], left
    assert set(Path("/tmp").glob("autotune-mp-*")) <= before
    no_leftovers(r)


_OOM_PARENT = """
import json, sys
from autotune.bench import BenchConfig, run_bench
held = b"\\x01" * (900 << 20)   # the parent: larger than the measurement when memory runs out
cfg = BenchConfig.from_preset("decode-only", num_workers=0, batch_size=4, seconds=60,
                              cold=False, timeout_s=120, step=sys.argv[2])
r = run_bench(sys.argv[1], cfg)
print(json.dumps({"kind": r.failure_kind, "reason": r.reason}))
"""


def test_the_oom_killer_takes_the_measurement_not_the_bench(small_dataset: Path, tmp_path: Path,
                                                            memory_cgroup) -> None:
    """A memory cgroup (a container's limit) that the measurement's step fills: the kernel's
    OOM killer chose the largest process, the bench (or search) that started it, which
    died with exit 137 and said nothing. The measurement and its workers go first: the
    bench lives and says the measurement ran out of memory."""
    step = tmp_path / "grow.py"
    step.write_text("KEEP = []\n\ndef step(batch):\n    KEEP.append(b'\\x01' * (64 << 20))\n")
    with memory_cgroup(1600 << 20, "autotune-oom") as cg:
        r = subprocess.run(["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh",
                            sys.executable, "-c", _OOM_PARENT, str(small_dataset),
                            f"{step}:step"], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert d["kind"] == "oom" and "OOM killer" in d["reason"], d
