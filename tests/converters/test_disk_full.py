"""DST without room for a conversion, on small real tmpfs mounts.

Refused before anything is written (one line naming DST, what the conversion will still
write and what is free, and the fix; exit 2), a resume counting only the units left; a
DST with room still converts. A disk that fills after the check (another writer) still
stops with one clear line, nothing half-written under a final name, and resumes to the
output of a conversion that never ran out (issue 8, case 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ARGS = ["--shard-size", "512KiB", "--readers", "2", "--workers", "2"]
ROOT = Path(__file__).resolve().parents[2]
# `autotune convert` without its free-space check: a disk that fills during the run.
UNCHECKED = ("import sys; import autotune_converters.conversion as c; "
             "c.check_room = lambda *a, **k: None; from autotune.cli import main; "
             "sys.exit(main())")


@pytest.fixture
def mount_tmpfs(work_dir: Path):
    mounted: list[Path] = []

    def mount(size: str, name: str = "mnt") -> Path:
        mnt = work_dir / name
        mnt.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        mounted.append(mnt)
        return mnt

    try:
        yield mount
    finally:
        for mnt in mounted:
            subprocess.run(["umount", "-l", str(mnt)], check=False)


def _unchecked(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", UNCHECKED, "convert", "-q", *map(str, args)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def _refusal(r: subprocess.CompletedProcess, dst: Path) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr)
    line = r.stderr.strip()
    assert "\n" not in line and str(dst) in line, line
    assert "not enough free space" in line and "will still write" in line, line
    assert " free; free space there" in line and "choose a DST on another disk" in line, line
    return line


@pytest.mark.root
def test_no_room_is_refused_before_anything_is_written(img_src, fmt, mount_tmpfs, run_cli):
    mnt = mount_tmpfs("2m")
    dst = mnt / "out"
    r = run_cli(img_src, dst, "--format", fmt, *ARGS)
    line = _refusal(r, dst)
    assert "Nothing was written" in line, line
    assert list(mnt.iterdir()) == []  # DST, made by the run, removed with its work folder
    dst.mkdir()  # a DST the user made is kept, empty
    _refusal(run_cli(img_src, dst, "--format", fmt, *ARGS), dst)
    assert list(dst.iterdir()) == []


@pytest.mark.root
def test_max_side_is_not_refused_for_the_source_bytes(img_src, mount_tmpfs, run_cli):
    """The source bytes only bound what re-encoding writes: the same folder that is refused
    in 2 MiB converts there at --max-side 64."""
    dst = mount_tmpfs("2m") / "out"
    r = run_cli(img_src, dst, "--format", "wds", *ARGS, "--max-side", "64")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (dst / "manifest.json").exists()


@pytest.mark.root
@pytest.mark.slow
def test_dst_with_room_converts(img_src, fmt, work_dir, mount_tmpfs, run_cli, tree_digest):
    ref = work_dir / "ref"
    assert run_cli(img_src, ref, "--format", fmt, *ARGS).returncode == 0
    dst = mount_tmpfs("16m") / "out"
    r = run_cli(img_src, dst, "--format", fmt, *ARGS)
    assert r.returncode == 0, r.stderr
    assert tree_digest(dst) == tree_digest(ref)


@pytest.mark.root
@pytest.mark.slow
def test_disk_full_is_clear_leaves_nothing_partial_and_resumes(img_src, fmt, work_dir,
                                                               mount_tmpfs, run_cli,
                                                               tree_digest):
    ref = work_dir / "ref"
    assert run_cli(img_src, ref, "--format", fmt, *ARGS).returncode == 0
    small_fs = mount_tmpfs("3m")
    dst = small_fs / "out"
    r = _unchecked(img_src, dst, "--format", fmt, *ARGS)
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


@pytest.mark.root
@pytest.mark.slow
def test_resume_counts_only_what_is_left(img_src, work_dir, mount_tmpfs, run_cli,
                                         tree_digest):
    ref = work_dir / "ref"
    assert run_cli(img_src, ref, "--format", "wds", *ARGS).returncode == 0
    small_fs = mount_tmpfs("5m")
    dst = small_fs / "out"
    assert _unchecked(img_src, dst, "--format", "wds", *ARGS).returncode == 1
    shards = {p.name: p.stat().st_size for p in dst.glob("shard-*.tar")}
    assert shards  # some units were finished before the disk filled
    r = run_cli(img_src, dst, "--format", "wds", *ARGS)
    line = _refusal(r, dst)
    assert "units are left after a resume" in line and "Nothing more was written" in line
    left = float(line.split(" MiB of source data")[0].rsplit("(", 1)[1])
    total = sum(p.stat().st_size for p in img_src.rglob("*") if p.is_file())
    done = sum(json.loads(p.read_text())["source_bytes"]
               for p in (dst / ".autotune-convert" / "done").glob("unit-*.json"))
    assert done > 0 and abs(left - (total - done) / 2**20) <= 0.06, line
    assert {p.name: p.stat().st_size for p in dst.glob("shard-*.tar")} == shards  # kept
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_fs)], check=True)
    assert run_cli(img_src, dst, "--format", "wds", *ARGS).returncode == 0
    assert tree_digest(dst) == tree_digest(ref)


@pytest.mark.root
def test_ranks_rank0_checks_the_whole_before_it_publishes_the_plan(img_src, mount_tmpfs,
                                                                   run_cli):
    # 2 ranks on 6 MiB: each rank's half (~3.7 MiB of source) would fit, the whole not.
    dst = mount_tmpfs("6m") / "out"
    r = run_cli(img_src, dst, "--format", "wds", *ARGS, "--rank", "0", "--world-size", "2")
    _refusal(r, dst)
    assert not list(dst.glob("shard-*")) and not (dst / ".autotune-convert" / "dist.json").exists()
