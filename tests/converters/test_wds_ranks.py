"""Equal ranks for shards (issue 14, item 4): two real ranks (two processes, torch.distributed
with gloo on loopback) each doing one all_reduce per step over a conversion whose shards
hold different counts. With unequal ranks one rank runs out first and the other waits in
its all_reduce until gloo's timeout (or fails when its peer leaves); equalized, both take
the same number of steps and finish."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from autotune_converters import ConvertOptions, WdsSource, convert

ROOT = Path(__file__).resolve().parents[2]
BATCH, WORKERS = 3, 2

RANK_SCRIPT = r"""
import datetime, json, os, sys
import torch, torch.distributed as dist
from autotune_converters import WdsSource

dst, equalize, timeout = sys.argv[1], sys.argv[2] == "1", float(sys.argv[3])
dist.init_process_group("gloo", init_method=os.environ["INIT"], rank=int(os.environ["RANK"]),
                        world_size=int(os.environ["WORLD_SIZE"]),
                        timeout=datetime.timedelta(seconds=timeout))
ds = WdsSource(dst).dataset(None, seed=3, equalize=equalize, num_workers=%(workers)d)
loader = torch.utils.data.DataLoader(ds, batch_size=%(batch)d, num_workers=%(workers)d,
                                     collate_fn=lambda b: len(b), multiprocessing_context="fork")
steps, samples, ranks_seen = 0, 0, []
for n in loader:
    t = torch.ones(1)
    dist.all_reduce(t)  # every rank must take this step
    ranks_seen.append(int(t.item()))
    steps += 1
    samples += n
t = torch.tensor([steps], dtype=torch.int64)
dist.all_reduce(t, op=dist.ReduceOp.MAX)
print(json.dumps({"steps": steps, "max_steps": int(t.item()), "samples": samples,
                  "len": len(ds), "ranks_seen": sorted(set(ranks_seen))}), flush=True)
dist.destroy_process_group()
""" % {"workers": WORKERS, "batch": BATCH}


@pytest.fixture(scope="module")
def uneven_wds(tmp_path_factory) -> Path:
    """Shards of about equal bytes but different sample counts: small and large JPEGs."""
    import io

    import numpy as np
    from PIL import Image

    src = tmp_path_factory.mktemp("uneven") / "train"
    rng = np.random.default_rng(5)
    for i in range(72):
        side = 24 if i % 3 else 160  # a third large, the rest small
        arr = rng.integers(0, 255, size=(side, side, 3), dtype=np.uint8)
        d = src / f"c{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format="JPEG", quality=90)
        (d / f"{i:03d}.jpg").write_bytes(buf.getvalue())
    dst = src.parent / "wds"
    convert(src, dst, ConvertOptions(format="wds", shard_size=1 << 16, readers=4, seed=1))
    return dst


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_ranks(dst: Path, equalize: bool, timeout: float) -> list[tuple[int, str, str]]:
    init = f"tcp://127.0.0.1:{_free_port()}"
    procs = []
    for rank in range(2):
        env = {**os.environ, "INIT": init, "RANK": str(rank), "WORLD_SIZE": "2",
               "PYTHONPATH": str(ROOT)}
        procs.append(subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT, str(dst), "1" if equalize else "0",
             str(timeout)], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True))
    out = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=timeout + 60)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            o, e = p.communicate()
            out.append((-9, o, e))
            continue
        out.append((p.returncode, o, e))
    return out


def _uneven_for_workers(dst: Path) -> bool:
    """Unequalized, the two ranks' workers hold different counts in epoch 0."""
    counts = []
    for rank in range(2):
        ds = WdsSource(dst).dataset(None, seed=3, rank=rank, world_size=2, equalize=False)
        shards = ds.rank_shards(0)
        counts.append([sum(n for _, n in shards[k::WORKERS]) for k in range(WORKERS)])
    batches = [sum(-(-c // BATCH) for c in cs) for cs in counts]
    return batches[0] != batches[1]


def test_two_gloo_ranks_take_the_same_steps_over_uneven_shards(uneven_wds):
    m = json.loads((uneven_wds / "manifest.json").read_text())
    assert len({s["samples"] for s in m["shards"]}) > 1  # the shards do differ
    assert _uneven_for_workers(uneven_wds)  # without equalizing, the step counts differ
    res = _two_ranks(uneven_wds, equalize=True, timeout=60)
    for code, out, err in res:
        assert code == 0, err[-3000:]
    r = [json.loads(out.strip().splitlines()[-1]) for _, out, _ in res]
    assert r[0]["steps"] == r[1]["steps"] == r[0]["max_steps"] > 0
    assert r[0]["samples"] == r[1]["samples"] == r[0]["len"] == r[1]["len"]
    assert r[0]["ranks_seen"] == r[1]["ranks_seen"] == [2]  # every step had both ranks
    # said once, by rank 0's first worker (a DataLoader worker warns on its stderr)
    said = [ln for _, _, err in res for ln in err.splitlines() if "samples dropped" in ln
            or "dropped, " in ln]
    assert len(said) == 1 and "pass equalize=False" in said[0], said


EPOCHS_SCRIPT = r"""
import sys, torch
from autotune_converters import WdsSource

ds = WdsSource(sys.argv[1]).dataset(None, seed=3, rank=0, world_size=2, num_workers=2)
loader = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=2,
                                     collate_fn=lambda b: len(b), multiprocessing_context="fork")
for epoch in range(3):
    ds.set_epoch(epoch)
    print(sum(loader), flush=True)
"""


def test_the_dropped_remainder_is_said_once_over_epochs_of_new_workers(uneven_wds):
    """torch's default workers are new each epoch: said in rank 0's first worker, the
    warning came every epoch (a user's 6-epoch torchrun run: 6 times); said at set_epoch
    in the training process, its forked workers know it was said."""
    r = subprocess.run([sys.executable, "-c", EPOCHS_SCRIPT, str(uneven_wds)],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(r.stdout.split()) == 3
    said = [ln for ln in r.stderr.splitlines() if "dropped, " in ln]
    assert len(said) == 1, r.stderr[-3000:]


# A control experiment (gloo's behaviour, not ours): CI keeps its premise, asserted by
# test_two_gloo_ranks_take_the_same_steps_over_uneven_shards (_uneven_for_workers), and
# equalize=False read for real by tests/converters/test_wds.py's partition test.
@pytest.mark.extended
def test_unequal_ranks_do_hang_or_fail_without_equalizing(uneven_wds):
    """The control: the same two ranks with equalize=False do not finish together."""
    res = _two_ranks(uneven_wds, equalize=False, timeout=8)
    ok = [code == 0 for code, _, _ in res]
    if all(ok):  # both returned: then they cannot have agreed on the steps
        r = [json.loads(out.strip().splitlines()[-1]) for _, out, _ in res]
        assert r[0]["steps"] != r[1]["steps"]
    else:
        assert not all(ok)
