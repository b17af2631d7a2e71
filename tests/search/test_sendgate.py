"""A dataset whose batch no worker can send (a sample holding a generator): search and
bench know it from the first batch, made without workers, before any worker starts.

Each worker's queue thread fails to pickle such a batch and drops it, so a measurement
with workers waits for the whole batch timeout (120 s) and fails; the search spent that
on the baseline and again on its first trial before it stopped, and recommended nothing.
Real: `autotune search` and `autotune bench` in processes of their own, on the user's
dataset factory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
TINY_SPACE = ROOT / "tests" / "search" / "space-tiny.yaml"

_LAZY = """
import torch

class Lazy(torch.utils.data.Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        return torch.zeros(4), (i * k for k in range(3))

def make(root):
    return {"dataset": Lazy(), "collate_fn": lambda b: b}
"""


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    factory = tmp_path / "lazy.py"
    factory.write_text(_LAZY)
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "autotune", "-q", *args[:1], str(data),
                           "--dataset-factory", f"{factory}:make", "--batch-size", "8",
                           "--compute-ms", "5", "--warm", *args[1:]],
                          env=env, capture_output=True, text=True, timeout=400, cwd=ROOT)


def test_a_search_whose_batch_no_worker_can_send_runs_no_worker(tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = _run(["search", "--space", str(TINY_SPACE), "--trials", "3", "--no-probe",
              "--confirm", "0", "--seconds", "2", "--out", str(out)], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads((out / "search.json").read_text())
    send = d["sendable"]
    assert "cannot pickle 'generator' object" in send["unsendable"], send
    assert send["skipped"] == 4 and send["baseline_skipped"], send   # 2 workers x 2 prefetch
    assert d["baseline"]["state"] == "skipped", d["baseline"]
    assert d["recommended"]["config"]["num_workers"] == 0, d["recommended"]
    measured = [t for t in d["trials"] if t["state"] != "skipped"]
    assert measured and all(not t["params"]["num_workers"] for t in measured), measured
    for t in d["trials"]:
        if t["params"]["num_workers"]:
            assert t["reason"].startswith("batch cannot be sent: not run"), t
    said = " ".join(d["warnings"])
    assert "cannot pickle 'generator' object" in said and "num_workers=0" in said, said


def test_bench_refuses_workers_that_could_not_send_a_batch(tmp_path: Path) -> None:
    r = _run(["bench", "--workers", "2", "--seconds", "2", "--json", "-"], tmp_path)
    assert r.returncode == 1, r.stderr[-3000:]
    d = json.loads(r.stdout)
    assert d["failure_kind"] == "unsendable", d["reason"]
    # Refused before any process started: no measurement ran into the batch timeout.
    assert d["reason"].startswith("not run: 2 worker(s)"), d["reason"]
    assert "cannot pickle 'generator' object" in d["reason"], d["reason"]
    assert "num_workers=0" in d["hint"], d["hint"]
    r0 = _run(["bench", "--workers", "0", "--seconds", "2", "--json", "-"], tmp_path)
    assert r0.returncode == 0, r0.stderr[-3000:]   # in the training process it runs
    assert not json.loads(r0.stdout)["failed"]


def test_the_gate_is_shut_only_for_workers_and_adds_num_workers_0() -> None:
    from autotune.search.sendgate import SendGate

    space = SimpleNamespace(choices={"num_workers": [1, 2]}, notes=[],
                            grid=lambda: [{"num_workers": w} for w in (1, 2)])
    open_gate = SendGate(None)
    open_gate.apply(space)
    assert open_gate.why({"num_workers": 2}) is None and space.choices["num_workers"] == [1, 2]
    gate = SendGate("TypeError: cannot pickle 'generator' object")
    gate.apply(space)
    assert gate.skipped == 2 and gate.added_zero and space.choices["num_workers"] == [0, 1, 2]
    assert gate.why({"num_workers": 0}) is None and gate.why({}) is None
    assert "generator" in gate.why({"num_workers": 1})
