"""HuggingFace Accelerate as users run it (issue 29), with the release pip installs: a
training script started with `accelerate launch` (the launcher users run it with, given
its options on the command line instead of a saved `accelerate config`),
`Accelerator().prepare(model, optimizer, loader)` and a few steps on the CPU.

- a torch DataLoader: `prepare` gives a `DataLoaderShard`; `autotune.instrument` wraps it
  after `prepare` and the step log's header has its settings, batch size included (Accelerate
  keeps it in the shard's batch sampler), read by `autotune analyze`;
- an `autotune.DataLoader`: `prepare` hands it back as it is (it shards and places only
  torch DataLoaders), so the script puts each batch on `accelerator.device` itself; every
  sample is trained on once per epoch and the loader tunes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autotune.analyze import analyze

pytest.importorskip("accelerate", reason="Accelerate is not installed (the test extra has it)")
REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent('''
    import json, os, sys
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from accelerate import Accelerator
    import autotune

    out = sys.argv[1]
    accelerator = Accelerator(cpu=True)
    ds = TensorDataset(torch.arange(48, dtype=torch.float32)[:, None], torch.arange(48) % 2)
    results = {"launcher": {k: v for k, v in os.environ.items() if k.startswith("ACCELERATE_")}}
    for which in ("torch", "autotune"):
        model = torch.nn.Linear(1, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        if which == "torch":
            loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=1)
        else:
            loader = autotune.DataLoader(ds, batch_size=4, shuffle=True, key="accelerate-test")
        given = loader
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        res = {"prepared": type(loader).__name__, "same": loader is given}
        if which == "torch":
            loader = autotune.instrument(loader, log=out + "/steps.jsonl")
        seen = []
        for epoch in range(2):
            seen.append([])
            for x, y in loader:
                x, y = x.to(accelerator.device), y.to(accelerator.device)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                seen[-1].extend(int(v) for v in x[:, 0])
        res["seen"] = seen
        if which == "autotune":
            res["tuned"] = loader.tuned_kwargs
            loader.close()
        results[which] = res
    json.dump(results, open(out + "/result.json", "w"))
''')


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, dict]:
    """One script, started as a user starts it (`accelerate launch train.py`), runs both
    loaders."""
    d = tmp_path_factory.mktemp("accelerate")
    script = d / "train.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}"
    env["AUTOTUNE_CACHE_DIR"] = str(d / "cache")   # autotune.DataLoader's settings cache
    env["HF_HOME"] = str(d / "hf")                 # no saved `accelerate config` is read
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes",
              "1", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    r = subprocess.run([*launch, str(script), str(d)], cwd=d, env=env,
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    return d, json.loads((d / "result.json").read_text())


def test_instrument_after_prepare_logs_the_prepared_loader(run):
    d, results = run
    assert results["launcher"].get("ACCELERATE_USE_CPU"), results["launcher"]  # launched
    res = results["torch"]
    assert res["prepared"] == "DataLoaderShard"
    assert [sorted(s) for s in res["seen"]] == [list(range(48))] * 2
    lines = [json.loads(x) for x in (d / "steps.jsonl").read_text().splitlines()]
    h = lines[0]
    assert h["loader"]["type"] == "DataLoaderShard" and h["loader"]["num_workers"] == 1
    assert h["loader"]["batch_size"] == 4, h
    assert len(lines) == 1 + 24
    a = analyze(d / "steps.jsonl", warmup=0)
    assert a.format == "own" and a.steps == 24 and a.batch_size == 4


def test_autotune_dataloader_through_prepare_trains_on_every_sample(run):
    res = run[1]["autotune"]
    assert res["same"] and res["prepared"] == "DataLoader"
    assert [sorted(s) for s in res["seen"]] == [list(range(48))] * 2
    assert res["seen"][0] != res["seen"][1]
    assert set(res["tuned"]) <= {"num_workers", "prefetch_factor", "persistent_workers"}
