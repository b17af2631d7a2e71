"""Resuming a conversion after SRC changed: refused in one line naming both counts, as
ranks are (autotune_converters.ranks), never finished with the old file list. Before, the
rerun exited 0 ("resumed: 3 units kept") and wrote the plan its first run made: a file
deleted since was in the output (or "skipped: unreadable"), a file added since was not,
and the manifest's source figures were the old ones."""

from __future__ import annotations

import json
import shutil

from autotune_converters.workdir import NAME as CONVERT_WORK


def test_a_resume_after_src_changed_is_refused_and_the_fixes_it_names_work(
        img_src, fmt, work_dir, run_cli, convert_ctrl_c, read_all):
    src, dst, out = work_dir / "src", work_dir / "dst", work_dir / "out.json"
    shutil.copytree(img_src, src)
    args = [src, dst, "--format", fmt, "--shard-size", "64KiB", "--workers", "1"]
    r = convert_ctrl_c(*args)  # Ctrl-C as the 4th unit is recorded
    assert r.returncode == 130 and not (dst / "manifest.json").exists(), r.stderr
    done = sorted(p.name for p in (dst / CONVERT_WORK / "done").iterdir())
    assert len(done) == 3

    gone = sorted((src / "class_0001").iterdir())[0]
    kept = gone.read_bytes()
    gone.unlink()
    new = src / "class_0003" / "new.jpg"
    new.write_bytes((src / "class_0000" / "img_0000000.jpg").read_bytes())
    r = run_cli(*args)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert f"{dst}: SRC {src} changed since this conversion began (then 96 files" in lines[0]
    assert "now 96 files" in lines[0] and "restore SRC and rerun to resume" in lines[0]
    assert f"empty {dst} and rerun" in lines[0]
    assert not (dst / "manifest.json").exists()
    assert sorted(p.name for p in (dst / CONVERT_WORK / "done").iterdir()) == done  # kept
    assert not (dst / CONVERT_WORK / "scan").exists()  # the second scan is not left behind

    # The first fix it names: SRC restored, the same command resumes where it stopped.
    new.unlink()
    gone.write_bytes(kept)
    r = run_cli(*args, "--json", out)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["resumed_units"] == 3 and res["samples"] == 96

    # The second: SRC as it is now, into an emptied DST.
    gone.unlink()
    new.write_bytes((src / "class_0000" / "img_0000000.jpg").read_bytes())
    shutil.rmtree(dst)
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    paths = set(read_all(dst))
    assert "class_0003/new.jpg" in paths and gone.relative_to(src).as_posix() not in paths
    assert len(paths) == 96


def test_rank_0_rescans_on_a_resume_too(img_src, work_dir, run_cli):
    """Rank 0 loaded its plan and went on; only the other ranks compared SRC with it. Rank
    0 of 2 run alone writes its units and waits for rank 1's: run again after SRC
    changed, it is refused."""
    src, dst, fmt = work_dir / "src", work_dir / "dst", "wds"  # ranks write WebDataset
    shutil.copytree(img_src, src)
    args = [src, dst, "--format", fmt, "--shard-size", "64KiB", "--workers", "1",
            "--readers", "2", "--rank", "0", "--world-size", "2"]
    r = run_cli(*args)
    assert r.returncode == 0 and not (dst / "manifest.json").exists(), r.stderr
    sorted((src / "class_0001").iterdir())[0].unlink()
    r = run_cli(*args)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert f"{dst}: SRC {src} changed since this conversion began" in r.stderr
