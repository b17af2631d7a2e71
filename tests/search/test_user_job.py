"""The user's own job: their Dataset (a factory), their ranks on the node, and the answer
handed back in code (`autotune.loader_kwargs`, `autotune.tune`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import autotune
from autotune.bench import BenchConfig, run_bench

TESTS = Path(__file__).parent
USER = TESTS / "user_dataset.py"


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotune", "-q", *args], capture_output=True,
                          text=True, timeout=timeout)


def cfg(**kw) -> BenchConfig:
    base = dict(num_workers=1, batch_size=4, seconds=2.0, warmup_batches=2, cold=False,
                compute_ms=5, dataset_factory=f"{USER}:make")
    base.update(kw)
    return BenchConfig.from_preset("decode-only", **base)


def test_a_factory_dataset_of_dict_float16_samples_is_measured(small_dataset, no_leftovers):
    r = run_bench(small_dataset, cfg())
    assert not r.failed, (r.reason, r.process.get("log_tail"))
    assert r.dataset == {"path": str(small_dataset), "format": "factory",
                         "factory": f"{USER}:make", "images": 64, "type": "GrayBlur",
                         "iterable": False}
    assert r.images_per_s > 0 and r.window["samples"] == 4 * r.window["batches"]
    no_leftovers(r)


@pytest.mark.parametrize("spec, words", [
    ("nope.py:make", "no such file"),
    (f"{USER}:missing", "has no attribute 'missing'"),
])
def test_a_factory_that_cannot_load_is_one_line_exit_2(small_dataset, spec, words):
    r = cli("bench", str(small_dataset), "--dataset-factory", spec, "--seconds", "3")
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "(option --dataset-factory)" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_factory_needing_a_missing_package_names_it(small_dataset, tmp_path):
    f = tmp_path / "needs.py"
    f.write_text("import nonexistent_pkg_xyz\n\ndef make(root):\n    return None\n")
    r = cli("bench", str(small_dataset), "--dataset-factory", f"{f}:make")
    assert r.returncode == 2 and "'nonexistent_pkg_xyz'" in r.stderr and "install" in r.stderr


@pytest.mark.parametrize("fn, kind, words", [
    ("make_raises", "factory", "raised RuntimeError: no index for"),
    ("make_bad_type", "factory", "returned list, not a torch.utils.data.Dataset"),
    ("make_unbatchable", "collate", "cannot be batched"),
])
def test_what_the_factory_gives_wrongly_fails_the_measurement_naming_it(
        small_dataset, fn, kind, words, no_leftovers):
    r = run_bench(small_dataset, cfg(dataset_factory=f"{USER}:{fn}"))
    assert r.failed and r.failure_kind == kind, (r.failure_kind, r.reason)
    assert words in r.reason and fn in (r.reason + " " + (r.hint or "")) or kind == "collate"
    no_leftovers(r)


def test_two_ranks_each_read_their_share_and_the_node_is_gated_by_the_slowest(
        small_dataset, no_leftovers):
    r = run_bench(small_dataset, cfg(procs_per_node=2, seconds=2.5))
    assert not r.failed, (r.reason, r.process.get("log_tail"))
    assert [p["rank"] for p in r.per_rank] == [0, 1]
    slow = min(p["images_per_s"] for p in r.per_rank)
    assert r.images_per_s == pytest.approx(2 * slow)
    assert r.images_per_s_sum == pytest.approx(sum(p["images_per_s"] for p in r.per_rank))
    assert r.window["ranks"] == 2
    no_leftovers(r)


def test_a_rank_that_dies_fails_the_trial_naming_it(small_dataset, tmp_path, no_leftovers):
    f = tmp_path / "dies.py"
    f.write_text(f"import os, sys\nsys.path.insert(0, {str(TESTS)!r})\n"
                 "from user_dataset import make as _make\n\n"
                 "def make(root):\n    if os.environ.get('RANK') == '1':\n        os._exit(7)\n"
                 "    return _make(root)\n")
    r = run_bench(small_dataset, cfg(procs_per_node=2, dataset_factory=f"{f}:make"))
    assert r.failed and "rank 1 of 2" in r.reason and "exit status 7" in r.reason, r.reason
    no_leftovers(r)


@pytest.mark.slow
def test_search_with_a_factory_and_ranks_hands_back_kwargs_that_work(small_dataset, tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("num_workers: {choices: auto}\nprefetch_factor: {choices: [2]}\n"
                     "persistent_workers: {choices: [false]}\npin_memory: {choices: [false]}\n")
    out = tmp_path / "out"
    r = cli("search", str(small_dataset), "--dataset-factory", f"{USER}:make",
            "--procs-per-node", "2", "--batch-size", "4", "--compute-ms", "5", "--seconds", "2",
            "--warm", "--no-probe", "--confirm", "0", "--trials", "1", "--space", str(space),
            "--preset", "decode-only", "--out", str(out), "--json", "-", timeout=600)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    rec = d["recommended"]
    assert len(rec["per_rank"]) == 2 and rec["config"]["num_workers"] <= max(1, os.cpu_count() // 2)
    assert any("num_workers is per rank" in n for n in d["warnings"])
    # The verdict's next command is this job's: the user's Dataset, not the folder's images.
    nxt = d["verdict"]["next_command"]
    assert f"--dataset-factory {USER}:make" in nxt and "--preset" not in nxt, nxt
    kw = autotune.loader_kwargs(out / "search.json")
    assert kw == d["loader_kwargs"] and kw["batch_size"] == 4 and "shuffle" not in kw
    assert d["batch_size_from"] == "option" and d["schema"] == "autotune.search/2"
    # The code handed back gives each rank its share (shuffle=True trained each on all).
    for code in (d["snippet"], d["train"]["code"]):
        assert "sampler=sampler" in code and "shuffle=True" not in code, code
    assert "sampler.set_epoch(epoch)" in d["train"]["code"]
    # A plain DataLoader over the user's dataset takes them as they are.
    import torch.utils.data

    sys.path.insert(0, str(TESTS))
    from user_dataset import make

    batch = next(iter(torch.utils.data.DataLoader(make(str(small_dataset)), **kw)))
    assert batch["image"].dtype.is_floating_point and batch["image"].shape[0] == 4
    # On a machine with other cores the recommendation is said to be that machine's.
    data = json.loads((out / "search.json").read_text())
    data["ceilings"]["cores"] = 64
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        autotune.loader_kwargs(other)
    assert any("measured on 64 usable core(s)" in str(w.message) for w in caught)


def test_loader_kwargs_of_an_iterable_dataset_has_no_shuffle(tmp_path):
    d = {"recommended": {"config": {"num_workers": 0, "prefetch_factor": None,
                                    "persistent_workers": False, "pin_memory": False}},
         "batch_size": 8, "ceilings": {"iterable": True, "cores": None}}
    (tmp_path / "search.json").write_text(json.dumps(d))
    assert autotune.loader_kwargs(tmp_path) == {"batch_size": 8, "num_workers": 0,
                                                "pin_memory": False}


def test_tune_needs_a_factory_a_fresh_process_can_import(small_dataset):
    from autotune.errors import UsageError

    with pytest.raises(UsageError, match="defined at module level"):
        autotune.tune(small_dataset, factory=lambda root: None)


def test_loader_kwargs_of_an_older_search_json_takes_its_options_batch_size(tmp_path):
    # Written before 'loader_kwargs' and the top-level 'batch_size': batch_size=0 before,
    # which DataLoader rejects.
    d = {"recommended": {"config": {"num_workers": 2, "prefetch_factor": 4,
                                    "persistent_workers": True, "pin_memory": False}},
         "options": {"batch_size": 32}, "ceilings": {"cores": None}}
    (tmp_path / "search.json").write_text(json.dumps(d))
    kw = autotune.loader_kwargs(tmp_path)
    assert kw["batch_size"] == 32 and kw["num_workers"] == 2 and kw["prefetch_factor"] == 4
    del d["options"]
    (tmp_path / "search.json").write_text(json.dumps(d))
    from autotune.errors import UsageError

    with pytest.raises(UsageError, match="no batch size in it"):
        autotune.loader_kwargs(tmp_path)
