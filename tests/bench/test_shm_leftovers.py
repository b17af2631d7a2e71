"""A measurement leaves no /dev/shm/torch_* file of its own processes, however it ends.

A DataLoader worker makes each batch's file as /dev/shm/torch_<PID>_<RANDOM>_<COUNTER>
(open, ftruncate, fallocate) and unlinks the name only afterwards. A worker that dies in
between leaves the name: the SIGKILL that ends a pruned trial lands there every few dozen
kills, and torch's own allocation that fails (a full /dev/shm) never unlinks it. Real
measurement processes and real workers here; the prune is the search's (on_tick).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from autotune.bench import BenchConfig, run_bench
from autotune.bench.shmleft import remove_left

SHM = Path("/dev/shm")

# A dataset factory (run in the measurement process). Each worker, once started, records
# its pid and, where PLANT is set, does what torch's allocator has done when the kill
# catches it: the batch's file opened and sized, its name not unlinked yet. Where FSIZE is
# set, the worker may write no file over 1 MiB: torch's own allocation of a batch fails
# after it opened the file (as on a full /dev/shm).
_FACTORY = """
import os, random, resource, torch
from torch.utils.data import Dataset

RECORD = {record!r}

class Tensors(Dataset):
    def __len__(self):
        return 100000
    def __getitem__(self, i):
        return torch.zeros(3, 224, 224), i

def init(worker_id):
    with open(RECORD, "a") as f:
        f.write(f"{{os.getpid()}}\\n")
    if {plant!r}:
        name = f"/dev/shm/torch_{{os.getpid()}}_{{random.randrange(2**32)}}_0"
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(fd, 4 * 3 * 224 * 224 * 4)
        with open(RECORD + ".planted", "a") as f:
            f.write(name + "\\n")
    if {fsize!r}:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))

def build(path):
    return {{"dataset": Tensors(), "worker_init_fn": init}}
"""


def _factory(tmp_path: Path, *, plant: bool = False, fsize: bool = False) -> tuple[str, Path]:
    record = tmp_path / "workers.txt"
    (tmp_path / "factory.py").write_text(_FACTORY.format(record=str(record), plant=plant,
                                                         fsize=fsize))
    return f"{tmp_path / 'factory.py'}:build", record


def _cfg(spec: str, **kw) -> BenchConfig:
    base = dict(num_workers=2, batch_size=4, seconds=30, cold=False, timeout_s=90,
                compute_ms=20, dataset_factory=spec)
    base.update(kw)
    return BenchConfig.from_preset("decode-only", **base)


def _files_of(pids: set[int]) -> list[str]:
    return sorted(p.name for p in SHM.glob("torch_*_*_*") if int(p.name.split("_")[1]) in pids)


def _pids(record: Path) -> set[int]:
    return {int(x) for x in record.read_text().split()}


def test_a_pruned_trial_leaves_no_torch_file_of_its_workers(tmp_path: Path, no_leftovers) -> None:
    spec, record = _factory(tmp_path, plant=True)
    r = run_bench(tmp_path, _cfg(spec), on_tick=lambda s, ips: "pruned: test")
    assert r.failed and r.failure_kind == "pruned", (r.failure_kind, r.reason)
    workers = _pids(record)
    assert len(workers) == 2, workers
    assert _files_of(workers) == []
    no_leftovers(r)


def test_a_batch_torch_could_not_allocate_leaves_no_torch_file(tmp_path: Path,
                                                               no_leftovers) -> None:
    # torch's own allocator opens the batch's file, fails to size it, and raises without
    # unlinking it (plain torch leaves these); the worker's error ends the measurement.
    spec, record = _factory(tmp_path, fsize=True)
    r = run_bench(tmp_path, _cfg(spec))
    assert r.failed, r.reason
    workers = _pids(record)
    assert workers and _files_of(workers) == []
    no_leftovers(r)


_PARENT = """
import sys
from autotune.bench import BenchConfig, run_bench
cfg = BenchConfig.from_preset("decode-only", num_workers=2, batch_size=4, seconds=60,
                              cold=False, compute_ms=20, dataset_factory=sys.argv[2])
run_bench(sys.argv[1], cfg, progress=lambda m: print(m, flush=True))
"""


def test_a_run_killed_outright_is_swept_by_the_next_run(tmp_path: Path) -> None:
    # The process calling run_bench dies by SIGKILL (no finally runs); its workers die
    # with it (PDEATHSIG). The next run, as it removes the dead run's scratch folder,
    # removes the names its workers left.
    spec, record = _factory(tmp_path, plant=True)
    (tmp_path / "parent.py").write_text(_PARENT)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    parent = subprocess.Popen([sys.executable, str(tmp_path / "parent.py"), str(tmp_path), spec],
                              stdout=subprocess.PIPE, text=True, env=env)
    for line in parent.stdout:
        if line.startswith("measuring"):
            break
    parent.kill()
    parent.wait()
    workers = _pids(record)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in workers):
        time.sleep(0.1)
    # What the kill left: the names the workers made (listed by them, not by /dev/shm: a
    # run_bench of a test beside this one may sweep the dead run first, as it should).
    planted = Path(f"{record}.planted").read_text().split()
    assert len(workers) == 2 and len(planted) == 2, (workers, planted)
    r = run_bench(tmp_path, _cfg(spec, num_workers=0, seconds=1))
    assert not r.failed, r.reason
    assert [n for n in planted if os.path.exists(n)] == []


def test_only_files_of_dead_processes_made_since_are_removed(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    gone, me = int(dead.stdout), os.getpid()
    names = [f"torch_{gone}_1_0", f"torch_{me}_1_0", f"torch_{gone}_x_0"]
    start = time.time() - 1.0
    try:
        for n in names:
            (SHM / n).write_bytes(b"")
        # A live process's file stays, and so does a name that is not torch's.
        assert remove_left({gone, me}, start) == [f"torch_{gone}_1_0"]
        assert sorted(p.name for p in SHM.iterdir() if p.name in names) == sorted(names[1:])
        # A file older than the measurement is not its: it stays.
        (SHM / names[0]).write_bytes(b"")
        assert remove_left({gone}, time.time() + 60) == []
        assert (SHM / names[0]).exists()
    finally:
        for n in names:
            (SHM / n).unlink(missing_ok=True)
