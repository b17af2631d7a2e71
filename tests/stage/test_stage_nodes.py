"""`autotune stage --node-rank R --nnodes N` (issue 15): each node gets exactly the shards its
ranks read (split by node, then local rank, the same every epoch), verified, plus the
manifest; the reader reads a node's copy on that node's ranks and refuses the others."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wds_src(small_dataset, tmp_path_factory) -> Path:
    from autotune_converters import ConvertOptions, convert

    dst = tmp_path_factory.mktemp("nodes") / "wds"
    convert(small_dataset, dst, ConvertOptions(format="wds", shard_size=256 << 10, readers=4,
                                               workers=1))
    return dst


def _stage(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotune", "stage", "-q", *map(str, args)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_each_node_gets_the_shards_its_ranks_read_and_nothing_else(wds_src, tmp_path):
    from autotune_converters import WdsSource
    from autotune_converters.wds.split import rank_shards

    manifest = json.loads((wds_src / "manifest.json").read_text())
    names = [s["file"] for s in manifest["shards"]]
    world, per_node = 4, 2  # 2 nodes x 2 ranks
    copies = {}
    for node in (0, 1):
        dst = tmp_path / f"node{node}"
        r = _stage(wds_src, dst, "--node-rank", node, "--nnodes", 2, "--json", "-")
        assert r.returncode == 0, r.stderr
        d = json.loads(r.stdout)
        assert d["node_rank"] == node and d["nnodes"] == 2 and not d["failures"]
        held = sorted(p.name for p in dst.glob("shard-*.tar"))
        wanted = sorted({n for rank in range(node * per_node, (node + 1) * per_node)
                         for n in rank_shards(names, rank, world, per_node)})
        assert held == wanted  # exactly what its ranks read
        assert (dst / "manifest.json").read_bytes() == (wds_src / "manifest.json").read_bytes()
        assert json.loads((dst / "node.json").read_text())["node_rank"] == node
        v = _stage(wds_src, dst, "--verify-only", "--json", "-")
        assert v.returncode == 0 and json.loads(v.stdout)["files"] == len(held), v.stderr
        copies[node] = dst
    assert not set(p.name for p in copies[0].glob("*.tar")) & \
        set(p.name for p in copies[1].glob("*.tar"))

    # every rank reads its node's copy; every sample once per epoch (equalize=False: all of
    # them); the same shards every epoch; by default the same count on every rank
    for epoch in (0, 1):
        seen: Counter = Counter()
        counts = set()
        for rank in range(world):
            src = WdsSource(copies[rank // per_node])
            ds = src.dataset(None, seed=3, rank=rank, world_size=world,
                             local_world_size=per_node, equalize=False)
            ds.set_epoch(epoch)
            shards = {Path(u).name for u, _ in ds.rank_shards()}
            ds.set_epoch(0)
            assert shards == {Path(u).name for u, _ in ds.rank_shards()}
            ds.set_epoch(epoch)
            got = [data for data, _ in ds]
            assert len(got) == len(ds)
            seen.update(got)
            eq = src.dataset(None, seed=3, rank=rank, world_size=world, local_world_size=per_node)
            eq.set_epoch(epoch)
            counts.add(sum(1 for _ in eq))
        assert sum(seen.values()) == manifest["num_samples"] and set(seen.values()) == {1}
        assert len(counts) == 1, counts


def test_a_rank_of_another_node_is_told_which_node_to_stage(wds_src, tmp_path):
    from autotune_converters import SampleError, WdsSource

    dst = tmp_path / "n0"
    assert _stage(wds_src, dst, "--node-rank", 0, "--nnodes", 2).returncode == 0
    ds = WdsSource(dst).dataset(None, rank=3, world_size=4, local_world_size=2)
    with pytest.raises(SampleError, match="--node-rank 1 --nnodes 2"):
        next(iter(ds))


def test_staging_whole_after_a_node_copy_makes_it_whole(wds_src, tmp_path):
    from autotune_converters import WdsSource

    dst = tmp_path / "grow"
    assert _stage(wds_src, dst, "--node-rank", 1, "--nnodes", 2).returncode == 0
    r = _stage(wds_src, dst)
    assert r.returncode == 0, r.stderr
    assert not (dst / "node.json").exists()
    assert len(list(dst.glob("*.tar"))) == len(list(wds_src.glob("*.tar")))
    assert sum(1 for _ in WdsSource(dst).dataset(None, rank=0, world_size=1)) == 64


@pytest.mark.parametrize("args, says", [
    (["--node-rank", "0"], "give both node_rank and nnodes"),
    (["--node-rank", "2", "--nnodes", "2"], "between 0 and 1"),
])
def test_bad_node_options_exit_2(wds_src, tmp_path, args, says):
    r = _stage(wds_src, tmp_path / "x", *args)
    assert r.returncode == 2 and says in r.stderr, r.stderr


def test_an_lmdb_is_staged_whole(small_dataset, tmp_path):
    from autotune_converters import ConvertOptions, convert

    src = tmp_path / "lmdb"
    convert(small_dataset, src, ConvertOptions(format="lmdb", workers=1))
    r = _stage(src, tmp_path / "y", "--node-rank", "0", "--nnodes", "2")
    assert r.returncode == 2 and "stage it whole" in r.stderr, r.stderr
