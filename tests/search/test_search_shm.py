"""Issue 30, item 2: search and bench fit /dev/shm.

Real: `autotune search` and `autotune bench` in a private mount namespace whose /dev/shm
is a 64 MiB tmpfs (Docker's default), on a folder of tiny JPEGs read as 3x224x224 float32
samples (what the resnet50 preset makes of them, checked on the preset's own pipeline
below): a batch of 64 is 36.8 MiB, so no configuration with workers fits and
num_workers=0 must be recommended, with the reason counted and the --shm-size that would
run the rest.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY_SPACE = ROOT / "tests" / "search" / "space-tiny.yaml"
FACTORY = f"{ROOT / 'tests' / 'search' / 'shm_dataset.py'}:make"
MiB = 2**20


@pytest.fixture(scope="module")
def tiny_jpegs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """256 JPEGs of 32x32 px in 4 classes: cheap to decode, and RandomResizedCrop(224)
    still makes each a 3x224x224 float32 sample (588 KiB)."""
    import numpy as np
    from PIL import Image

    d = tmp_path_factory.mktemp("shm") / "train"
    rng = np.random.default_rng(30)
    for i in range(256):
        c = d / f"c{i % 4}"
        c.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(c / f"{i:03d}.jpg")
    return d


def _env_64mib() -> SimpleNamespace:
    return SimpleNamespace(shm_budget=lambda: 64 * MiB,
                           shm=SimpleNamespace(total_bytes=64 * MiB, free_bytes=64 * MiB, note=None),
                           memory=SimpleNamespace(limit_bytes=None))


def test_bench_refuses_workers_whose_float32_batches_cannot_fit(tiny_jpegs):
    from autotune.bench import BenchConfig
    from autotune.bench.refusal import refusal

    cfg = BenchConfig.from_preset("resnet50", batch_size=64, num_workers=2, prefetch_factor=2)
    r = refusal(tiny_jpegs, cfg, env=_env_64mib())
    assert r is not None and r.failed and r.failure_kind == "shm"
    fit = r.system["shm_fit"]
    assert fit["batch_bytes"] == 64 * 3 * 224 * 224 * 4 + 64 * 8   # measured, labels int64
    assert "5 batches of 36.8 MiB" in r.reason and "64.0 MiB" in r.reason
    assert "--shm-size=256m" in r.hint and "sizeLimit: 256Mi" in r.hint and "uint8" in r.hint
    # No workers: nothing in /dev/shm, nothing refused (and no batch measured for it).
    assert refusal(tiny_jpegs, BenchConfig.from_preset("resnet50", batch_size=64,
                                                           num_workers=0), env=_env_64mib()) is None


def test_gate_adds_num_workers_0_when_nothing_with_workers_fits(tmp_path):
    from autotune.search.shmgate import REASON_PREFIX, ShmGate
    from autotune.search.space import load_space
    from autotune.shmfit import BatchBytes, shm_budget

    space_file = tmp_path / "space.yaml"
    space_file.write_text("num_workers: {choices: [2, 4]}\nprefetch_factor: {choices: [1, 2]}\n"
                          "persistent_workers: {choices: [false]}\npin_memory: {choices: [false]}\n")
    space = load_space(space_file, cores=2, cuda=False)
    f32 = 64 * 3 * 224 * 224 * 4
    gate = ShmGate(shm_budget(_env_64mib()), BatchBytes(f32, f32))
    gate.apply(space)
    assert gate.added_zero and 0 in space.choices["num_workers"] and not gate.workers_fit
    assert (gate.space_size, gate.space_skipped) == (5, 4)
    assert gate.why({"num_workers": 0}) is None
    assert gate.why({"num_workers": 2, "prefetch_factor": 1}).startswith(REASON_PREFIX)
    d = gate.to_dict(3)
    assert d["skipped"] == 4 and d["skipped_trials"] == 3 and d["bound"]
    assert d["advice"]["docker"].startswith("--shm-size=")


def test_what_a_cold_pass_cannot_hold_is_not_counted_against_dev_shm(tmp_path):
    """A configuration a cold pass of the dataset cannot measure would not run in any
    /dev/shm: the gate neither counts it as cut by /dev/shm nor sizes its advice by it (a
    search said '/dev/shm limited the search (2 of 13 not run)' and advised a
    --shm-size that would run them, while its notes said a cold pass could not hold
    them)."""
    from autotune.search.shmgate import ShmGate
    from autotune.search.space import load_space
    from autotune.shmfit import BatchBytes, shm_budget

    space_file = tmp_path / "space.yaml"
    space_file.write_text("num_workers: {choices: [1, 2]}\nprefetch_factor: {choices: [1, 4]}\n"
                          "persistent_workers: {choices: [false]}\npin_memory: {choices: [false]}\n")
    space = load_space(space_file, cores=2, cuda=False)
    mib8 = 8 * 2**20          # 1 x (1 + 1) batches fit in 64 MiB; 2 x (4 + 1) do not
    gate = ShmGate(shm_budget(_env_64mib()), BatchBytes(mib8, mib8))
    deep = [p for p in space.grid() if gate.why(p)]
    assert deep and all(p["prefetch_factor"] == 4 for p in deep)
    gate.apply(space)                                        # every one runnable
    assert gate.space_skipped == len(deep) and gate.bound
    gate = ShmGate(shm_budget(_env_64mib()), BatchBytes(mib8, mib8))
    gate.apply(space, runnable=lambda p: p["prefetch_factor"] == 1)   # a cold pass holds pf 1
    assert gate.space_skipped == 0 and not gate.bound, gate.to_dict(0)


@pytest.mark.root
@pytest.mark.slow
def test_search_in_a_64_mib_dev_shm_recommends_what_fits_and_it_runs(tiny_jpegs, tmp_path):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private /dev/shm")
    out = tmp_path / "out"
    py = f"{sys.executable} -m autotune -q"
    # The resnet50 preset's batch of 64 with samples of its size (3x224x224 float32) from
    # a cheap user dataset: the search's trials stay short on a busy machine.
    common = f"--batch-size 64 --compute-ms 5 --warm --dataset-factory {FACTORY}"
    # One namespace: the search, then bench of what it recommended (the refusal of what
    # cannot fit is checked in-process above: no measurement process starts for it).
    script = f"""
set -u
mount -t tmpfs -o size=64m tmpfs /dev/shm || exit 90
{py} search {tiny_jpegs} {common} --space {TINY_SPACE} --trials 2 --no-probe --confirm 0 \
  --seconds 2 --out {out} --json {out}.json > {out}.txt 2>&1
echo $? > {out}.rc
w=$({sys.executable} -c "import json; print(json.load(open('{out}.json'))['recommended']['config']['num_workers'])")
{py} bench {tiny_jpegs} {common} --workers $w --seconds 1 --json {out}-rec.json > /dev/null 2>&1
echo $? > {out}-rec.rc
"""
    # One intra-op thread: on a busy 2-core machine torch's two OpenMP threads make each
    # sample 10-100x slower (spinning at barriers), and the trial would not get 10 batches.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                       env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    text = " ".join(Path(f"{out}.txt").read_text().split())  # the table wraps at 110
    assert Path(f"{out}.rc").read_text().strip() == "0", text
    d = json.loads(Path(f"{out}.json").read_text())
    assert d["recommended"]["config"]["num_workers"] == 0, text
    shm = d["shm"]
    assert shm["bound"] and shm["skipped"] == 4 and shm["space_configurations"] == 5
    assert shm["batch_bytes"] == 64 * 3 * 224 * 224 * 4 + 64 * 8
    assert shm["budget"]["total_bytes"] == 64 * MiB
    assert shm["baseline_skipped"] and d["baseline"]["state"] == "skipped"
    # Nothing with workers was started: every such trial is skipped with the reason.
    for t in d["trials"]:
        if t["params"]["num_workers"]:
            assert t["state"] == "skipped" and t["reason"].startswith("/dev/shm too small"), t
    assert "/dev/shm" in d["verdict"]["summary"]
    assert d["verdict"]["advice"][0].startswith("workers need room in /dev/shm first")
    assert "--shm-size=" in text and "/dev/shm" in text and "sizeLimit" in text
    # The recommendation runs in that namespace.
    assert Path(f"{out}-rec.rc").read_text().strip() == "0"
    assert not json.loads(Path(f"{out}-rec.json").read_text())["failed"]



_TRAIN_AT = """
import json, sys, warnings
import torch.utils.data
import autotune
sys.path.insert(0, sys.argv[3])
from shm_dataset import make
with warnings.catch_warnings(record=True) as ws:
    warnings.simplefilter("always")
    kw = autotune.loader_kwargs(sys.argv[1], int(sys.argv[2]))
print(json.dumps({"kw": kw, "warnings": [str(w.message) for w in ws]}), flush=True)
n = sum(1 for _ in torch.utils.data.DataLoader(make(sys.argv[4]), **kw))
print(json.dumps({"batches": n}))
"""


@pytest.mark.root
@pytest.mark.slow
def test_a_larger_batch_than_the_search_measured_gets_settings_that_fit(tiny_jpegs, tmp_path):
    # Searched at batch 8 (4.6 MiB a batch: 2 workers fit in 64 MiB), trained at 64
    # (36.8 MiB): the search's num_workers=2, prefetch_factor=2 put 5 such batches in
    # /dev/shm and the first epoch died ("unable to allocate shared memory"), after a
    # warning that named the batch sizes only. loader_kwargs now fits them and says so.
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private /dev/shm")
    out, space = tmp_path / "out", tmp_path / "space.yaml"
    space.write_text("num_workers: {choices: [2]}\nprefetch_factor: {choices: [2]}\n"
                     "persistent_workers: {choices: [false]}\npin_memory: {choices: [false]}\n")
    script = f"""
set -u
mount -t tmpfs -o size=64m tmpfs /dev/shm || exit 90
{sys.executable} -m autotune -q search {tiny_jpegs} --batch-size 8 --compute-ms 5 --warm \
  --dataset-factory {FACTORY} --space {space} --trials 1 --no-probe --confirm 0 --seconds 2 \
  --out {out} > {out}.txt 2>&1 || exit 91
exec {sys.executable} -c '{_TRAIN_AT}' {out} 64 {ROOT / "tests" / "search"} {tiny_jpegs}
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                       env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    d = json.loads((out / "search.json").read_text())
    assert d["recommended"]["config"]["num_workers"] == 2
    got, ran = (json.loads(line) for line in r.stdout.splitlines()[-2:])
    assert got["kw"]["batch_size"] == 64 and got["kw"]["num_workers"] == 0, got
    assert "prefetch_factor" not in got["kw"] and "persistent_workers" not in got["kw"]
    said = " ".join(got["warnings"])
    assert "/dev/shm" in said and "num_workers=0" in said and "--batch-size 64" in said, said
    assert ran["batches"] == 4        # 256 samples in batches of 64: the epoch ran


@pytest.mark.root
@pytest.mark.slow
def test_a_search_outside_the_container_is_fitted_to_the_containers_dev_shm(tiny_jpegs,
                                                                             tmp_path):
    # Searched on the host (a /dev/shm of gigabytes: 2 workers x prefetch 2 at batch 64,
    # 184 MiB, fit), trained at the same batch size in a container's 64 MiB /dev/shm:
    # loader_kwargs handed the host's settings back as they were and the first epoch died
    # ("unable to allocate shared memory"). It now reads this machine's /dev/shm too.
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private /dev/shm")
    out, space = tmp_path / "out", tmp_path / "space.yaml"
    space.write_text("num_workers: {choices: [2]}\nprefetch_factor: {choices: [2]}\n"
                     "persistent_workers: {choices: [false]}\npin_memory: {choices: [false]}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "autotune", "-q", "search", str(tiny_jpegs),
                        "--batch-size", "64", "--compute-ms", "5", "--warm", "--dataset-factory",
                        FACTORY, "--space", str(space), "--trials", "1", "--no-probe",
                        "--confirm", "0", "--seconds", "2", "--out", str(out)],
                       env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads((out / "search.json").read_text())
    if d["shm"]["budget_bytes"] < 200 * MiB:
        pytest.skip(f"this host's own /dev/shm budget ({d['shm']['budget_bytes'] // MiB} MiB) "
                    "is already too small for 2 workers at batch 64: no larger budget to "
                    "search under than the container's")
    assert d["recommended"]["config"]["num_workers"] == 2
    script = f"""
mount -t tmpfs -o size=64m tmpfs /dev/shm || exit 90
exec {sys.executable} -c '{_TRAIN_AT}' {out} 64 {ROOT / "tests" / "search"} {tiny_jpegs}
"""
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                       env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    got, ran = (json.loads(line) for line in r.stdout.splitlines()[-2:])
    assert got["kw"]["num_workers"] == 0 and "prefetch_factor" not in got["kw"], got
    said = " ".join(got["warnings"])
    assert "this machine's /dev/shm allows" in said and "num_workers=0" in said, said
    assert ran["batches"] == 4

def test_a_resumed_studys_figures_that_no_longer_fit_are_not_candidates():
    # An earlier search of the study ran with a larger /dev/shm: its w4 and its baseline
    # are listed, but the recommendation here comes from what fits here.
    from autotune.search.conclude import _fit_now
    from autotune.search.records import TrialRecord
    from autotune.search.shmgate import ShmGate
    from autotune.shmfit import BatchBytes, shm_budget

    f32 = 64 * 3 * 224 * 224 * 4
    s = SimpleNamespace(shm_gate=ShmGate(shm_budget(_env_64mib()), BatchBytes(f32, f32)))
    w0 = TrialRecord(1, {"num_workers": 0}, "complete", images_per_s=50.0)
    w4 = TrialRecord(2, {"num_workers": 4, "prefetch_factor": 2}, "complete", images_per_s=200.0)
    base = TrialRecord(-1, {"num_workers": 2, "prefetch_factor": 2}, "complete", images_per_s=150.0)
    warnings: list[str] = []
    measured, pool_base, conf = _fit_now(s, [w0, w4], base, {"w4": w4, "w0": w0}, warnings)
    assert measured == [w0] and pool_base is None and list(conf) == ["w0"]
    assert "2 configuration(s)" in warnings[0]


def test_gate_scales_the_measured_batch_to_a_searched_batch_size(tmp_path):
    # Measured at batch_size 128 (uint8 3x224x224: 18.4 MiB): one worker with prefetch 1
    # fits 64 MiB there (50 MiB with margin), but not at 256 or 512.
    from autotune.search.shmgate import ShmGate
    from autotune.search.space import load_space
    from autotune.shmfit import BatchBytes, shm_budget

    space_file = tmp_path / "space.yaml"
    space_file.write_text("num_workers: {choices: [1]}\nprefetch_factor: {choices: [1]}\n"
                          "batch_size: {choices: [128, 256, 512]}\n"
                          "persistent_workers: {choices: [false]}\npin_memory: {choices: [false]}\n")
    space = load_space(space_file, cores=2, cuda=False)
    u8 = 128 * 3 * 224 * 224
    gate = ShmGate(shm_budget(_env_64mib()), BatchBytes(u8), base_batch_size=128)
    p = {"num_workers": 1, "prefetch_factor": 1}
    assert gate.why({**p, "batch_size": 128}) is None
    why = gate.why({**p, "batch_size": 256})
    assert why is not None and "36.8 MiB (batch_size 256)" in why
    gate.apply(space)
    assert (gate.space_size, gate.space_skipped) == (3, 2) and gate.workers_fit
    assert gate.largest_skipped["batch_size"] == 512
    adv = gate.advice(gate.largest_skipped)
    assert adv is not None and adv.batch_bytes == 4 * u8


def test_gate_uses_the_searchs_environment_and_no_dev_shm_refuses_workers(monkeypatch, tmp_path):
    # The search passes its one Environment (Session.env); a missing /dev/shm is a budget of
    # 0: workers are refused even when the batch could not be measured.
    import dataclasses

    import autotune.environment as environment
    from autotune.bench import BenchConfig
    from autotune.search.shmgate import REASON_PREFIX, measure_gate

    env = dataclasses.replace(environment.read_environment(),
                              shm=environment.read_shm("/nonexistent-shmfix-dev-shm"))

    def no_second_read(*a, **k):
        raise AssertionError("the environment read again: the search's reading has it")

    monkeypatch.setattr(environment, "read_environment", no_second_read)
    base = BenchConfig.from_preset("resnet50", batch_size=64, num_workers=2)
    gate = measure_gate(tmp_path / "no-such-dataset", base, 1, lambda m: None, env)
    assert gate.batch is None and gate.budget.budget_bytes == 0
    assert gate.why({"num_workers": 1, "prefetch_factor": 1}).startswith(REASON_PREFIX)
    assert gate.why({"num_workers": 0}) is None


def test_confirmation_never_reruns_what_does_not_fit_here():
    # A resumed or shared study measured w4 where /dev/shm was larger: it is the fastest,
    # but confirmation here measures only what fits.
    from autotune.search.confirm import confirm
    from autotune.search.records import TrialRecord
    from autotune.search.shmgate import ShmGate
    from autotune.shmfit import BatchBytes, shm_budget

    u8 = 64 * 3 * 224 * 224
    w0 = TrialRecord(1, {"num_workers": 0}, "complete", images_per_s=50.0)
    w1 = TrialRecord(2, {"num_workers": 1, "prefetch_factor": 2}, "complete", images_per_s=90.0)
    w4 = TrialRecord(3, {"num_workers": 4, "prefetch_factor": 2}, "complete", images_per_s=200.0)
    benched: list[dict] = []

    def bench(params, label, seconds=None):
        benched.append(params)
        return TrialRecord(-1, params, "complete", images_per_s=1.0)

    study = SimpleNamespace(user_attrs={}, set_user_attr=lambda k, v: None)
    s = SimpleNamespace(shm_gate=ShmGate(shm_budget(_env_64mib()), BatchBytes(u8)),
                        opts=SimpleNamespace(confirm=3, confirm_seconds=1.0),
                        study=study, shared=SimpleNamespace(host_key="h"),
                        base=SimpleNamespace(compute_ms=None), deadline=None,
                        config=lambda p, seconds=None: SimpleNamespace(seconds=1.0),
                        say=lambda m: None, bench=bench)
    assert confirm(s, [w0, w1, w4], None)
    assert {p["num_workers"] for p in benched} == {0, 1}


def test_bench_reads_the_environment_once_and_refuses_with_it(tiny_jpegs, monkeypatch, capsys):
    # `autotune bench` reads the environment for its header and JSON; the /dev/shm check
    # uses that reading, not a second one.
    import dataclasses

    import autotune.environment as environment
    from autotune.cli import main

    env = dataclasses.replace(environment.read_environment(tiny_jpegs),
                              shm=environment.ShmSpace("/dev/shm", "tmpfs", 64 * MiB, 64 * MiB))
    calls: list[tuple] = []

    def counted(*a, **k):
        calls.append(a)
        return env

    monkeypatch.setattr(environment, "read_environment", counted)
    rc = main(["-q", "bench", str(tiny_jpegs), "--preset", "resnet50", "--batch-size", "64",
               "--workers", "2", "--prefetch-factor", "2"])
    assert rc == 1 and len(calls) == 1
    cap = capsys.readouterr()
    assert "5 batches of 36.8 MiB" in cap.out + cap.err
