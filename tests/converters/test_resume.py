"""Kill -9 during a conversion (issue 8, case 1), at several points of a real process with
real worker processes: the rerun completes, equals an uninterrupted run byte for byte,
and no file under a final name is ever partial; the workers die with the parent."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

ARGS = ["--workers", "2", "--verify", "decode", "--shard-size", "256KiB", "--readers", "2"]


def _done_units(dst: Path) -> int:
    try:
        return len(os.listdir(dst / ".autotune-convert" / "done"))
    except FileNotFoundError:
        return 0


def _final_files_are_whole(dst: Path) -> None:
    """Every shard under its final name has a done record with its sha256."""
    for shard in dst.glob("shard-*.tar"):
        rec = dst / ".autotune-convert" / "done" / f"unit-{int(shard.stem[6:]):06d}.json"
        if not rec.exists():  # the manifest was written and the work dir removed
            assert (dst / "manifest.json").exists()
            continue
        want = json.loads(rec.read_text())["shard"]["sha256"]
        assert hashlib.sha256(shard.read_bytes()).hexdigest() == want, shard
    assert not (dst / "data.mdb").exists() or (dst / ".autotune-convert" / "published.json").exists() \
        or (dst / "manifest.json").exists()


@pytest.mark.slow
def test_kill9_at_several_points_then_rerun_equals_an_uninterrupted_run(
        img_src, fmt, work_dir, run_cli, popen_cli, tree_digest):
    ref = work_dir / "ref"
    r = run_cli(img_src, ref, "--format", fmt, *ARGS)
    assert r.returncode == 0, r.stderr
    want = tree_digest(ref)
    units = 32 if fmt == "lmdb" else len(json.loads((ref / "manifest.json").read_text())["shards"])
    points = {"early": lambda d: (d / ".autotune-convert").exists(),
              "one unit": lambda d: _done_units(d) >= 1,
              "half": lambda d: _done_units(d) >= units // 2,
              "late": lambda d: _done_units(d) >= units - 2}
    mid_way = 0
    for name, cond in points.items():
        dst = work_dir / f"k-{name.replace(' ', '')}"
        p = popen_cli(img_src, dst, "--format", fmt, *ARGS)
        deadline = time.monotonic() + 60
        while p.poll() is None and not cond(dst) and time.monotonic() < deadline:
            time.sleep(0.002)
        kids = psutil.Process(p.pid).children(recursive=True) if p.poll() is None else []
        p.send_signal(signal.SIGKILL)
        p.wait()
        if not (dst / "manifest.json").exists():
            mid_way += 1
        _final_files_are_whole(dst)
        gone, alive = psutil.wait_procs(kids, timeout=10)
        assert not alive, f"workers outlived the killed conversion: {alive}"
        r = run_cli(img_src, dst, "--format", fmt, *ARGS)
        assert r.returncode == 0, (name, r.stderr)
        assert tree_digest(dst) == want, name
    assert mid_way >= 3  # the kills landed inside the conversion, not after it
