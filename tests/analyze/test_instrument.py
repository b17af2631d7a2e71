"""autotune.instrument(): what it records, what it costs nothing to import, and that ranks
sharing one file never cut each other's lines."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import autotune
from autotune.analyze import analyze
from autotune.instrumentation import batch_len

REPO = Path(__file__).resolve().parents[2]


class Slow:
    """An iterable whose items take `delay` seconds each to produce."""

    def __init__(self, n: int, delay: float, size: int = 4) -> None:
        self.n, self.delay, self.size = n, delay, size

    def __iter__(self):
        for i in range(self.n):
            time.sleep(self.delay)
            yield [i] * self.size

    def __len__(self) -> int:
        return self.n


def _records(path: Path) -> tuple[list[dict], list[dict]]:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return [x for x in lines if "autotune" in x], [x for x in lines if "wait_s" in x]


def test_wait_and_step_are_timed(tmp_path):
    log = tmp_path / "s.jsonl"
    it = autotune.instrument(Slow(6, 0.02), log=log, batch_size=4)
    t0 = time.perf_counter()
    for _ in it:
        time.sleep(0.03)
    wall = time.perf_counter() - t0
    headers, recs = _records(log)
    assert len(headers) == 1 and headers[0]["batch_size"] == 4
    assert [r["step"] for r in recs] == list(range(6))
    # A sleep lasts at least its time, however busy the machine (never an upper bound
    # here: a loaded CI stretches both); the two are told apart (20 ms data, 30 ms step),
    # and together they cannot exceed the loop's wall time.
    for r in recs:
        assert r["wait_s"] >= 0.018 and r["step_s"] >= 0.028, r
        assert r["batch"] == 4 and r["epoch"] == 0
    assert sum(r["wait_s"] + r["step_s"] for r in recs) <= wall + 0.005
    ts = [r["t"] for r in recs]
    assert ts == sorted(ts) and abs(ts[0] - time.time()) < 5
    s = it.summary()
    waits = sum(r["wait_s"] for r in recs)
    assert s.steps == 6 and s.samples == 24
    assert s.data_wait_fraction == pytest.approx(waits / sum(r["wait_s"] + r["step_s"]
                                                             for r in recs), rel=0.01)


def test_break_exception_and_epochs(tmp_path):
    log = tmp_path / "s.jsonl"
    it = autotune.instrument(Slow(5, 0.0), log=log)
    for i, _ in enumerate(it):
        if i == 2:
            time.sleep(0.02)
            break                                   # the last step still gets its time
    with pytest.raises(RuntimeError):
        for i, _ in enumerate(it):
            if i == 1:
                raise RuntimeError("boom")
    for _ in it:
        pass
    _, recs = _records(log)
    assert [(r["epoch"], r["step"]) for r in recs] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1),
                                                       (2, 0), (2, 1), (2, 2), (2, 3), (2, 4)]
    assert recs[2]["step_s"] >= 0.018
    assert it.summary().epochs == 3


def test_batch_len():
    np = pytest.importorskip("numpy")
    assert batch_len(np.zeros((7, 3))) == 7
    assert batch_len((np.zeros((5, 2)), np.zeros(5))) == 5
    assert batch_len({"image": np.zeros((3, 1)), "label": [1, 2, 3]}) == 3
    assert batch_len([[np.zeros((2, 2))]]) == 2
    assert batch_len("abc") is None and batch_len(7) is None and batch_len(np.float64(1)) is None


def test_dataloader_header_and_passthrough(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    monkeypatch.setenv("AUTOTUNE_STEPS_LOG", str(tmp_path / "env.jsonl"))
    dl = DataLoader(TensorDataset(torch.zeros(20, 3), torch.zeros(20)), batch_size=8)
    it = autotune.instrument(dl)                     # log from $AUTOTUNE_STEPS_LOG
    assert len(it) == 3 and it.batch_size == 8 and it.dataset is dl.dataset
    assert [len(x) for x, _ in it] == [8, 8, 4]
    it.close()
    headers, recs = _records(tmp_path / "env.jsonl")
    loader = headers[0]["loader"]
    assert loader["num_workers"] == 0 and loader["batch_size"] == 8
    assert loader["dataset"] == {"type": "TensorDataset", "len": 20}
    assert [r["batch"] for r in recs] == [8, 8, 4]
    assert headers[0]["cores"] >= 1 and headers[0]["pid"] > 0


def to_tensor(im):
    return im


class _Raises:
    def __getattr__(self, name):
        raise KeyError(name)          # a user's object whose attributes raise

    def __call__(self, im):
        return im


def test_the_header_names_an_open_datasets_transform(tmp_path):
    """open_dataset's dataset with the user's transform: the header names it (analyze's
    next search measures the user's pipeline through a factory then); a transform whose
    attributes raise is named "?", never a crash of the job's loop."""
    from torch.utils.data import DataLoader

    from autotune.synth import make_image_folder
    from autotune_converters.conversion import ConvertOptions, convert

    make_image_folder(tmp_path / "src", 8, 2, workers=1)
    convert(tmp_path / "src", tmp_path / "lmdb", ConvertOptions(format="lmdb"))
    for transform, name in ((to_tensor, f"{__name__}.to_tensor"), (_Raises(), "?")):
        log = tmp_path / f"{name}.jsonl"
        ds = autotune.open_dataset(tmp_path / "lmdb", transform=transform)
        it = autotune.instrument(DataLoader(ds, batch_size=1, collate_fn=list), log=log)
        assert len(list(it)) == 8
        it.close()
        headers, _ = _records(log)
        assert headers[0]["loader"]["dataset"]["transform"] == name, headers[0]


class _ConfigDataset:
    """A user's Dataset whose attributes come from a config dict (review: KeyError for
    `transform`, and `root` before it, stopped the job at its first batch)."""

    def __init__(self):
        self.__dict__["cfg"] = {"n": 4}

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)      # torch's own checks (__getitems__) pass
        return self.__dict__["cfg"][name]

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return i


def test_a_dataset_whose_attributes_raise_is_described_without_them(tmp_path):
    from torch.utils.data import DataLoader

    log = tmp_path / "s.jsonl"
    it = autotune.instrument(DataLoader(_ConfigDataset(), batch_size=2), log=log)
    assert [b.tolist() for b in it] == [[0, 1], [2, 3]]
    it.close()
    headers, _ = _records(log)
    assert headers[0]["loader"]["dataset"] == {"type": "_ConfigDataset", "len": 4}


def test_rank_placeholder(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    it = autotune.instrument(range(3), log=tmp_path / "s-{rank}.jsonl", batch_size=1)
    list(it)
    _, recs = _records(tmp_path / "s-3.jsonl")
    assert {r["rank"] for r in recs} == {3}


_WRITER = """
import sys, autotune
it = autotune.instrument(range(3000), log=sys.argv[1], batch_size=1, rank=int(sys.argv[2]))
for _ in it:
    pass
"""


def test_two_ranks_append_to_one_file_without_cutting_lines(tmp_path):
    log = tmp_path / "shared.jsonl"
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(log), str(r)], cwd=REPO)
             for r in (0, 1)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    headers, recs = _records(log)              # json.loads of every line: none is cut
    assert len(headers) == 2 and len(recs) == 6000
    a = analyze(log, warmup=0)
    assert a.ranks == 2 and a.lines["skipped"] == 0 and a.steps == 6000


_SPAWNED = """
import os, sys
import torch.distributed as dist
import torch.multiprocessing as mp
import autotune

def rank(r, log, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=r,
                            world_size=2)
    if r == 1:
        dist.barrier()      # rank 0 has written and closed its steps
    it = autotune.instrument(range(50), log=log, batch_size=1)
    for _ in it:
        pass
    it.close()
    if r == 0:
        dist.barrier()
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(rank, args=(sys.argv[1], int(sys.argv[2])), nprocs=2)
"""


@pytest.mark.slow
def test_spawned_ranks_without_rank_variables_share_the_log(tmp_path, monkeypatch):
    # torch.multiprocessing.spawn (PyTorch's DDP tutorial) sets no RANK: each rank took
    # itself for the only writer and truncated the file, so a rank that began later erased
    # the other's steps (before: 50 steps of rank 1 alone, no rank in any line).
    import socket

    for name in ("RANK", "SLURM_PROCID", "WORLD_SIZE", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    script, log = tmp_path / "spawned.py", tmp_path / "steps.jsonl"
    script.write_text(_SPAWNED)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([sys.executable, str(script), str(log), str(port)], cwd=REPO,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    headers, recs = _records(log)
    assert sorted(h["rank"] for h in headers) == [0, 1]
    assert {h["world_size"] for h in headers} == {2}
    assert len(recs) == 100 and sorted({x["rank"] for x in recs}) == [0, 1]


def test_import_autotune_stays_light():
    code = ("import sys, autotune; assert 'torch' not in sys.modules; "
            "assert 'autotune.instrumentation' not in sys.modules; "
            "f = autotune.instrument; import autotune.instrumentation; "
            "assert autotune.instrument is f and callable(f); print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.stdout.strip() == "ok", r.stderr


def test_unwritable_log_names_the_file_and_fix(tmp_path):
    from autotune.errors import UsageError

    with pytest.raises(UsageError) as e:
        iter(autotune.instrument(range(2), log=tmp_path / "no" / "dir" / "s.jsonl"))
    assert "s.jsonl" in str(e.value) and "log=" in str(e.value)


def test_lines_a_full_disk_swallows_are_counted_and_warned():
    # /dev/full: every write fails with ENOSPC, as on a full disk. The job goes on, the
    # lost step lines are counted, and it is said once (the log would be missing steps).
    import warnings

    import autotune

    loader = autotune.instrument(list(range(10)), log="/dev/full", append=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in loader:
            pass
        loader.close()
    s = loader.summary()
    assert s.steps == 10 and s.lost_lines >= 10
    msgs = [str(w.message) for w in caught if "autotune.instrument" in str(w.message)]
    assert len(msgs) == 1 and "/dev/full" in msgs[0] and "lost" in msgs[0]


@pytest.mark.parametrize("samples, warm", [(64, True), (1600, False)])
def test_a_dataset_too_small_for_a_cold_search_gets_a_warm_next_search(tmp_path, samples, warm):
    # 64 samples in batches of 16 make 4 batches an epoch; the cheapest cold measurement
    # needs 15 (5 warm-up + 10 measured), and `autotune search` refuses to run cold: the
    # next command it was handed failed as printed. 1,600 make 100: cold, as before.
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    log = tmp_path / "steps.jsonl"
    it = autotune.instrument(DataLoader(TensorDataset(torch.zeros(samples, 3)), batch_size=16),
                             log=log)
    for _ in range(max(1, 80 * 16 // samples)):
        for _ in it:
            # The step: far longer than a batch of 16 rows in RAM, and long enough that
            # a busy machine's scheduling delays stay under a tenth of it (at 20 ms the
            # wait once reached 10 %, with a CI run beside the tests).
            time.sleep(0.05)
    it.close()
    v = analyze(log).verdict
    assert v.bottleneck == "compute" and v.next_command.startswith("autotune search "), v
    assert v.next_command.endswith(" --batch-size 16 --warm") is warm, v.next_command
    assert any("too few for a cold search" in e for e in v.evidence) is warm


@pytest.mark.parametrize("sampled", [False, True])
def test_a_ddp_loader_shuffling_with_no_sampler_is_warned_about(tmp_path, monkeypatch, sampled):
    """A torchrun rank's torch DataLoader with shuffle=True and no DistributedSampler: every
    rank trains on all of the dataset. The header names the sampler; analyze says it."""
    import torch
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ds = TensorDataset(torch.arange(40))
    kw = dict(sampler=DistributedSampler(ds, num_replicas=2, rank=0)) if sampled else \
        dict(shuffle=True)
    log = tmp_path / "steps.jsonl"
    it = autotune.instrument(DataLoader(ds, batch_size=4, **kw), log=log)
    for _ in range(3):
        for _ in it:
            pass
    it.close()
    headers, _ = _records(log)
    want = "DistributedSampler" if sampled else "RandomSampler"
    assert headers[0]["loader"]["sampler"] == want and headers[0]["world_size"] == 2
    said = [w for w in analyze(log, warmup=0).warnings if "whole dataset" in w]
    if sampled:
        assert said == []
    else:
        assert len(said) == 1 and "a job of 2 ranks" in said[0] and "(40 samples)" in said[0]
        assert "sampler=DistributedSampler(dataset)" in said[0]


def test_the_warm_reason_counts_whole_batches_and_each_ranks_share():
    """A user's walk: 400 samples in batches of 32 under 2 ranks read "makes 12 batches of
    32 per epoch" (13 with the last one, 6 a rank)."""
    from autotune.analyze.analysis import warm_because

    loader = {"dataset": {"len": 400}}
    one = warm_because(loader, 32, 2.0)
    assert one is not None and "makes 12 whole batches of 32 per epoch," in one, one
    two = warm_because(loader, 32, 2.0, procs=2)
    assert two is not None and "makes 6 whole batches of 32 per epoch on each of its 2 ranks" in two


def test_a_header_written_at_an_autotune_loaders_first_batch_records_its_workers():
    """A user's walk: Lightning's InstrumentCallback writes the step log's header at the
    first batch, which autotune.DataLoader makes in the training process before its
    workers start; the header said num_workers 0 and analyze answered "too few workers:
    0, set num_workers" of a loader that ran a worker throughout."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import TensorDataset

    from autotune.instrumentation import loader_info

    dl = autotune.DataLoader(TensorDataset(torch.zeros(64, 3)), batch_size=4,
                             key="header-at-first-batch")
    seen = []
    for i, _ in enumerate(dl):
        if i == 0:
            seen = [dl.num_workers, loader_info(dl)]
    dl.close()
    now, info = seen
    assert now == 0 and info["num_workers"] == dl.planned_kwargs["num_workers"] > 0, seen
    assert info["type"] == "DataLoader" and info["batch_size"] == 4, info
