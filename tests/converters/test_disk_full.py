"""Disk full during a conversion (issue 8, case 2), on a small real tmpfs: one clear line
with the free space and what is left to write; nothing half-written under a final name;
the rerun after space is freed completes and equals a conversion that never ran out."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ARGS = ["--shard-size", "512KiB", "--readers", "2", "--workers", "2"]


@pytest.fixture
def small_fs(work_dir: Path):
    mnt = work_dir / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.root
@pytest.mark.slow
def test_disk_full_is_clear_leaves_nothing_partial_and_resumes(img_src, fmt, work_dir, small_fs,
                                                               run_cli, tree_digest):
    ref = work_dir / "ref"
    assert run_cli(img_src, ref, "--format", fmt, *ARGS).returncode == 0
    dst = small_fs / "out"
    r = run_cli(img_src, dst, "--format", fmt, *ARGS)
    assert r.returncode == 1
    line = r.stderr.strip()
    assert "\n" not in line and "no space left on device" in line, line
    assert "free; about" in line and "still to write" in line and "resume" in line
    assert not (dst / "manifest.json").exists() and not (dst / "data.mdb").exists()
    assert not list((dst / ".autotune-convert" / "tmp").glob("*"))
    for shard in dst.glob("shard-*.tar"):
        rec = dst / ".autotune-convert" / "done" / f"unit-{int(shard.stem[6:]):06d}.json"
        assert json.loads(rec.read_text())["shard"]["bytes"] == shard.stat().st_size
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_fs)], check=True)
    r = run_cli(img_src, dst, "--format", fmt, *ARGS)
    assert r.returncode == 0, r.stderr
    assert tree_digest(dst) == tree_digest(ref)
