"""A conversion's DST and manifest from a stranger: links where the work folder or its lock
belongs, records naming files outside DST, a WebDataset manifest without sample counts,
a leftover work folder someone still holds, and who may read the manifest. Real files,
real links, a real second process holding a flock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune_base.errors import ConvertError, UnsafeName, UsageError
from autotune_converters.records import UnitResult
from autotune_converters.workdir import WorkDir


def _hold_flock(path: Path) -> subprocess.Popen:
    """A second process holding an flock on `path` until killed."""
    p = subprocess.Popen([sys.executable, "-c",
                          "import fcntl, sys, time\nf = open(sys.argv[1])\n"
                          "fcntl.flock(f, fcntl.LOCK_EX)\nprint('held', flush=True)\n"
                          "time.sleep(120)", str(path)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_the_conversions_lock_that_is_a_symlink_is_not_truncated(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    dst = tmp_path / "dst"
    (dst / ".autotune-convert").mkdir(parents=True)
    (dst / ".autotune-convert" / "lock").symlink_to(victim)
    with pytest.raises(UsageError, match="a symbolic link where a lock file belongs"):
        WorkDir(dst).lock()
    assert victim.read_text() == "precious"


def test_a_conversion_into_a_dst_with_a_lock_symlink_is_refused(small_dataset, tmp_path):
    from autotune_converters import ConvertOptions, convert

    victim = tmp_path / "victim"
    victim.write_text("precious")
    dst = tmp_path / "dst"
    (dst / ".autotune-convert").mkdir(parents=True)
    (dst / ".autotune-convert" / "lock").symlink_to(victim)
    with pytest.raises(UsageError):
        convert(small_dataset, dst, ConvertOptions(format="wds", workers=1))
    assert victim.read_text() == "precious"


def test_a_work_tmp_that_is_a_symlink_is_not_emptied(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("keep")
    dst = tmp_path / "dst"
    (dst / ".autotune-convert").mkdir(parents=True)
    (dst / ".autotune-convert" / "tmp").symlink_to(elsewhere)
    with pytest.raises(ConvertError, match="not followed"):
        WorkDir(dst).clear_tmp()
    assert (elsewhere / "keep.txt").read_text() == "keep"


def test_a_unit_record_naming_a_shard_outside_dst_is_refused(tmp_path):
    wd = WorkDir(tmp_path / "dst")
    wd.create()
    wd.done_path(0).write_text(json.dumps({
        "unit": 0, "samples": 1, "source_bytes": 1, "stored_bytes": 1,
        "shard": {"file": "../../etc/x.tar", "samples": 1, "bytes": 1}}))
    with pytest.raises(UnsafeName, match=r"unit-000000\.json: shard\.file names '\.\./\.\./etc"):
        wd.read_done(0)
    assert UnitResult.from_dict({"unit": 0, "samples": 0, "source_bytes": 0,
                                 "stored_bytes": 0, "shard": {"file": "shard-000000.tar"}})


def test_a_wds_manifest_without_samples_is_a_clear_error_not_keyerror(tmp_path):
    from autotune_converters import WdsSource

    (tmp_path / "s.tar").write_bytes(b"\0" * 1024)
    (tmp_path / "manifest.json").write_text(json.dumps({
        "version": 1, "format": "wds", "num_samples": 1, "num_classes": 1, "classes": ["a"],
        "shards": [{"file": "s.tar", "bytes": 1024}]}))
    with pytest.raises(UsageError, match=r"manifest\.json: shards\[0\] \(s\.tar\) has no whole "
                                         r"number of samples"):
        WdsSource(tmp_path)


def test_a_manifest_naming_a_file_outside_its_folder_is_refused_by_the_readers(tmp_path):
    from autotune_converters import WdsSource

    (tmp_path / "manifest.json").write_text(json.dumps({
        "version": 1, "format": "wds", "num_samples": 1, "num_classes": 1, "classes": ["a"],
        "shards": [{"file": "/etc/passwd", "samples": 1, "bytes": 1}]}))
    with pytest.raises(UnsafeName, match="an absolute path"):
        WdsSource(tmp_path)


def test_the_manifest_gets_the_umask_not_0600(small_dataset, tmp_path):
    from autotune_converters import ConvertOptions, convert

    old = os.umask(0o022)
    try:
        convert(small_dataset, tmp_path / "wds", ConvertOptions(format="wds", workers=1))
    finally:
        os.umask(old)
    assert (tmp_path / "wds" / "manifest.json").stat().st_mode & 0o777 == 0o644


def test_a_leftover_work_folder_is_removed_only_when_its_lock_is_free(tmp_path):
    wd = WorkDir(tmp_path / "dst")
    wd.create()
    (wd.path / "lock").write_text("pid 999999999 in another namespace\n")
    holder = _hold_flock(wd.path / "lock")
    try:
        assert not wd.remove_stale() and wd.path.is_dir()  # its run is alive
    finally:
        holder.kill()
        holder.wait()
    assert wd.remove_stale() and not wd.path.exists()


def test_a_work_folder_that_is_a_symlink_is_not_removed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("keep")
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / ".autotune-convert").symlink_to(elsewhere)
    assert not WorkDir(dst).remove_stale()
    assert (elsewhere / "keep.txt").read_text() == "keep"
