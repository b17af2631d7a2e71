"""`autotune stage` of an interrupted conversion: refused before anything is copied, naming
the conversion as unfinished and the command that finishes it. Before, stage copied the
shards written so far and the work folder (its lock and plan included) and wrote a
"folder" manifest, so the copy looked complete (exit 0), and open_dataset on it then said
"no class subfolders"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import autotune
from autotune_base.errors import DatasetError
from autotune_converters.workdir import NAME as CONVERT_WORK

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotune", *map(str, args)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_stage_refuses_an_interrupted_conversion_and_names_the_fix(small_dataset, tmp_path, fmt,
                                                                  convert_ctrl_c):
    d, s = tmp_path / "converted", tmp_path / "staged"
    args = [small_dataset, d, "--format", fmt, "--shard-size", "64KiB", "--workers", "1"]
    r = convert_ctrl_c(*args)  # Ctrl-C as the 4th unit is recorded
    assert r.returncode == 130, r.stderr
    assert not (d / "manifest.json").exists() and (d / CONVERT_WORK).is_dir()
    if fmt == "wds":
        assert len(list(d.glob("shard-*.tar"))) == 3  # what a folder stage would copy
    else:
        assert [p.name for p in d.iterdir()] == [CONVERT_WORK]  # LMDB publishes at the end

    r = _cli("stage", d, s)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert f"{d}: an unfinished conversion" in lines[0]
    assert "rerun the same `autotune convert`" in lines[0] and "resumes" in lines[0]
    assert not s.exists()  # refused before DST was made
    with pytest.raises(DatasetError, match=rf"{d}: an unfinished conversion .*rerun the "
                                           r"same `autotune convert`"):
        autotune.open_dataset(d)

    # The fix the messages name: the same convert finishes it, then stage copies it whole.
    r = _cli("convert", "-q", *args)
    assert r.returncode == 0, r.stderr
    r = _cli("stage", d, s)
    assert r.returncode == 0, r.stderr
    m = json.loads((s / "manifest.json").read_text())
    assert m["format"] == fmt and m["num_samples"] == 64
    assert not (s / CONVERT_WORK).exists()
    ds = autotune.open_dataset(s, decode=False)
    assert (len(ds) if fmt == "lmdb" else sum(1 for _ in ds)) == 64
