"""A disk that fills while `autotune stage` copies (another writer, after the free-space
check): one line naming DST, what a rerun still has to copy and what is free; nothing
incomplete published; the rerun, with space freed, finishes. A real small tmpfs.

The line named the whole dataset ("disk full while copying (1,206.6 MiB needed)") where
a rerun, after half of it was staged, needed 678.6 MiB, and said nothing of the free
space."""

from __future__ import annotations

import io
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from autotune.synth import with_comment
from autotune_converters import ConvertOptions, convert, read_manifest
from autotune_converters import stage as stage_mod
from autotune_converters.stage import StageError, stage, verify_staged

MiB = 1 << 20


def _conversion(base: Path) -> Path:
    """8 WebDataset shards of ~3 MB (40 noise JPEGs of ~620 KB)."""
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (800, 800, 3), dtype=np.uint8)
                    ).save(buf, "JPEG", quality=92)
    for i in range(40):
        d = base / "src" / f"c{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:03d}.jpg").write_bytes(with_comment(buf.getvalue(), b"%d" % i))
    convert(base / "src", base / "wds", ConvertOptions(format="wds", readers=8, workers=1))
    return base / "wds"


def test_a_disk_that_fills_names_what_is_left_and_the_rerun_finishes(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    wds = _conversion(tmp_path)
    sizes = {s["file"]: s["bytes"] for s in read_manifest(wds).shards}
    assert sum(sizes.values()) > 20 * MiB
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(mnt)], check=True)
    try:
        real, calls = os.fstatvfs, []

        def roomy_once(fd):  # the check before copying sees room; the copies do not have it
            calls.append(fd)
            st = real(fd)
            return st if len(calls) > 1 else os.statvfs_result(
                (st.f_bsize, st.f_frsize, 1 << 30, 1 << 30, 1 << 30) + tuple(st)[5:])

        monkeypatch.setattr(stage_mod.os, "fstatvfs", roomy_once)
        with pytest.raises(StageError) as err:
            stage(wds, mnt / "dst", workers=2)
        monkeypatch.undo()
        line = str(err.value)
        staged = {p.name for p in (mnt / "dst").glob("shard-*")}
        assert 0 < len(staged) < len(sizes)
        assert all((mnt / "dst" / n).read_bytes() == (wds / n).read_bytes() for n in staged)
        assert "\n" not in line and line.startswith(f"{mnt / 'dst'}: no space left"), line
        left = sum(b for n, b in sizes.items() if n not in staged)
        m = re.search(r"([\d,.]+) MiB still to copy, ([\d,.]+) MiB free", line)
        assert m, line
        assert m.group(1) == f"{left / MiB:,.1f}", line
        assert not (mnt / "dst" / "manifest.json").exists()
        subprocess.run(["mount", "-o", "remount,size=40m", str(mnt)], check=True)  # freed
        res = stage(wds, mnt / "dst")  # the rerun copies the rest
        assert not res.failures and res.manifest_written and res.skipped == len(staged)
        assert not verify_staged(mnt / "dst").failures
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
