"""examples/train_cnn.py: the script trains for a few real steps with the settings of a
search.json, its loop instrumented; its `step` is what `autotune bench --step` measures."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.analyze import analyze

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "train_cnn.py"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "TRAIN_CNN_DEVICE": "cpu"}


def _example():
    spec = importlib.util.spec_from_file_location("train_cnn_example", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


CONFIG = {"num_workers": 1, "prefetch_factor": 3, "persistent_workers": True, "pin_memory": False}


def _search_json(path: Path, **extra) -> Path:
    # The keys a search writes (autotune.search.result): the recommended configuration,
    # the batch size; `extra` adds the ones of issue 14 (loader_kwargs).
    path.write_text(json.dumps({"schema": "autotune.search/1", "batch_size": 4,
                                "options": {"batch_size": 4},
                                "recommended": {"config": CONFIG}, **extra}))
    return path


def test_the_script_trains_with_the_searched_settings(small_dataset, tmp_path):
    search = _search_json(tmp_path / "search.json", loader_kwargs={
        "batch_size": 4, "shuffle": True, **CONFIG})
    log = tmp_path / "steps.jsonl"
    r = subprocess.run([sys.executable, str(SCRIPT), str(small_dataset), "--steps", "20",
                        "--size", "64", "--search-json", str(search), "--log", str(log),
                        "--device", "cpu"],
                       capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert ("DataLoader(batch_size=4, shuffle=True, num_workers=1, prefetch_factor=3, "
            "persistent_workers=True, pin_memory=False) on cpu") in out, out
    losses = [float(x.split("loss ")[1]) for x in out.splitlines() if x.startswith("step ")]
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses), out
    assert "20 steps, 80 images" in out, out
    # 64 images / 4 = 16 batches an epoch: the 20 steps ran into a second epoch
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    header, steps = recs[0], recs[1:]
    assert header["loader"]["prefetch_factor"] == 3 and header["loader"]["dataset"]["len"] == 64
    assert [(s["epoch"], s["step"]) for s in steps] == \
        [(0, i) for i in range(16)] + [(1, i) for i in range(4)]
    a = analyze(log, warmup=0)
    assert a.format == "own" and a.steps == 20 and a.batch_size == 4


def test_the_settings_of_a_search_json_without_loader_kwargs(tmp_path):
    # A search.json written before issue 14's `loader_kwargs` key: from its configuration.
    kw = _example().loader_kwargs_from(_search_json(tmp_path / "old.json"))
    assert {k: kw[k] for k in ("batch_size", *CONFIG)} == {"batch_size": 4, **CONFIG}
    bad = tmp_path / "failed.json"
    bad.write_text(json.dumps({"schema": "autotune.search/1", "recommended": None}))
    with pytest.raises(SystemExit) as e:
        _example().loader_kwargs_from(bad)
    assert "failed.json" in str(e.value) and "no recommended configuration" in str(e.value)


def test_the_step_runs_lazily_on_the_bench_batches():
    ex = _example()
    import torch

    assert ex._STATE == {}   # importing it (as the bench does) builds nothing
    os.environ.setdefault("TRAIN_CNN_DEVICE", "cpu")
    batch = (torch.randn(2, 3, 224, 224), torch.tensor([0, 3]))
    first = ex.step(batch)
    assert math.isfinite(first) and ex._STATE["device"].type in ("cpu", "cuda")
    for _ in range(5):
        last = ex.step(batch)
    assert last < first   # it learns: the same batch, five SGD steps later


@pytest.mark.alone
def test_bench_measures_the_example_step_for_real(small_dataset, tmp_path):
    r = subprocess.run([sys.executable, "-m", "autotune", "-q", "bench", str(small_dataset),
                        "--step", "examples/train_cnn.py:step", "--seconds", "3", "--warm",
                        "--batch-size", "2", "--workers", "1", "--warmup-batches", "2",
                        "--json", "-"],
                       capture_output=True, text=True, cwd=REPO, env=_env(), timeout=300)
    d = json.loads(r.stdout)
    assert r.returncode == 0 and not d["failed"], (d.get("reason"), r.stderr[-2000:])
    assert d["config"]["step"] == "examples/train_cnn.py:step" and d["images_per_s"] > 0
    # A real step takes time: with no step the loop would only wait (AU near 0).
    assert d["au"] > 0.1, d["au"]
