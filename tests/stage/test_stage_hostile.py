"""`autotune stage` of a dataset from a stranger: a manifest naming files outside SRC or DST,
links and FIFOs in SRC, links already in DST. Real files, real links, a real FIFO; each
case wrote, deleted, replaced or hung before the names were checked and every path was
walked beneath a directory descriptor."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune_base.errors import StageError, UnsafeName, UsageError
from autotune_converters.stage import stage

ROOT = Path(__file__).resolve().parents[2]


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _src(src: Path, shards: list[dict], files: dict[str, bytes] | None = None) -> Path:
    """SRC with these files and a WebDataset manifest listing `shards` as given."""
    src.mkdir(parents=True)
    for name, data in (files or {}).items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    (src / "manifest.json").write_text(json.dumps({
        "version": 1, "format": "wds", "num_classes": 2,
        "num_samples": sum(s["samples"] for s in shards if isinstance(s.get("samples"), int)),
        "classes": ["a", "b"], "shards": shards}))
    return src


def _entry(name: object, data: bytes, **kw) -> dict:
    """A shard entry for `data`: as many samples as its bytes can hold (a manifest whose
    counts its bytes cannot hold is refused before anything else)."""
    return {"file": name, "samples": len(data) // 1024, "bytes": len(data), "sha256": _sha(data),
            **kw}


def test_a_name_with_dotdot_writes_nothing_outside_dst(tmp_path):
    data = b"outside!"
    (tmp_path / "outside.txt").write_bytes(data)  # what SRC/../outside.txt reads
    src = _src(tmp_path / "src", [_entry("../outside.txt", data)])
    dst = tmp_path / "a" / "dst"
    with pytest.raises(UnsafeName, match=r"manifest\.json: shards\[0\]\.file names '\.\./outside"):
        stage(src, dst)
    assert not (tmp_path / "a" / "outside.txt").exists()


def test_an_absolute_name_of_the_wrong_size_is_not_deleted(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"7 bytes")
    src = _src(tmp_path / "src", [{"file": str(victim), "samples": 1, "bytes": 999}])
    with pytest.raises(UnsafeName, match="an absolute path"):
        stage(src, tmp_path / "dst")
    assert victim.read_bytes() == b"7 bytes"


def test_an_absolute_name_equal_to_its_destination_is_not_replaced(tmp_path):
    dst = tmp_path / "dst"
    dst.mkdir()
    mine = dst / "mine.txt"
    mine.write_bytes(b"private")
    mine.chmod(0o600)
    before = mine.stat()
    src = _src(tmp_path / "src", [_entry(str(mine), b"private")])
    with pytest.raises(UnsafeName):
        stage(src, dst)
    after = mine.stat()
    assert (after.st_ino, after.st_mode & 0o777) == (before.st_ino, 0o600)


@pytest.mark.parametrize("name", [5, "", ".", "a\0b", "a/../b", "sub/", "a//b", None])
def test_a_name_that_is_not_a_plain_relative_path_is_one_clear_error(tmp_path, name):
    src = _src(tmp_path / "src", [_entry(name, b"x")])
    with pytest.raises(UnsafeName) as e:
        stage(src, tmp_path / "dst")
    msg = str(e.value)
    assert str(src / "manifest.json") in msg and "shards[0].file" in msg and "\n" not in msg
    assert not (tmp_path / "dst").exists()  # refused before DST is touched


def test_the_cli_exits_2_with_one_line_for_a_bad_name(tmp_path):
    src = _src(tmp_path / "src", [_entry("../x", b"x")])
    r = subprocess.run([sys.executable, "-m", "autotune", "stage", "-q", str(src),
                        str(tmp_path / "dst")], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "'../x'" in r.stderr and "internal error" not in r.stderr


def test_a_wds_manifest_without_samples_is_a_clear_error(tmp_path):
    src = _src(tmp_path / "src", [{"file": "s.tar", "bytes": 1}], {"s.tar": b"x"})
    with pytest.raises(UsageError, match=r"shards\[0\] \(s\.tar\) has no whole number of samples"):
        stage(src, tmp_path / "dst")


def test_a_symlink_in_src_named_by_the_manifest_is_not_followed(tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"only for me")
    secret.chmod(0o600)
    src = _src(tmp_path / "src", [_entry("link.tar", b"only for me")])
    (src / "link.tar").symlink_to(secret)
    r = stage(src, tmp_path / "dst")
    assert r.partial and [f.file for f in r.failures] == ["link.tar"]
    assert "symbolic link" in r.failures[0].reason
    assert not r.failures[0].reason.startswith("link.tar")   # named once, in its own field
    assert not (tmp_path / "dst" / "link.tar").exists()


def test_a_fifo_named_by_the_manifest_is_refused_not_waited_on(tmp_path):
    src = _src(tmp_path / "src", [_entry("pipe.tar", b"")])
    os.mkfifo(src / "pipe.tar")
    code = ("import json, sys\nfrom autotune_converters.stage import stage\n"
            "r = stage(sys.argv[1], sys.argv[2])\n"
            "print(json.dumps([f.to_dict() for f in r.failures]))")
    try:  # a hang is a failure here, not a stuck test run
        out = subprocess.run([sys.executable, "-c", code, str(src), str(tmp_path / "dst")],
                             cwd=ROOT, capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        pytest.fail("stage hung on a FIFO named by the manifest")
    assert out.returncode == 0, out.stderr
    (fail,) = json.loads(out.stdout)
    assert fail["file"] == "pipe.tar" and "a FIFO, not a regular file" in fail["reason"]


def test_a_work_folder_that_is_a_symlink_is_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "tmp").mkdir(parents=True)
    (elsewhere / "tmp" / "keep.txt").write_text("keep")
    src = _src(tmp_path / "src", [_entry("s.tar", b"abc")], {"s.tar": b"abc"})
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / ".autotune-stage").symlink_to(elsewhere)
    with pytest.raises(StageError, match=r"\.autotune-stage: .*not stage's work folder"):
        stage(src, dst)
    assert (elsewhere / "tmp" / "keep.txt").read_text() == "keep"
    assert not (dst / "s.tar").exists()


def test_a_lock_that_is_a_symlink_is_not_opened_nor_truncated(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    src = _src(tmp_path / "src", [_entry("s.tar", b"abc")], {"s.tar": b"abc"})
    dst = tmp_path / "dst"
    (dst / ".autotune-stage").mkdir(parents=True)
    (dst / ".autotune-stage" / "lock").symlink_to(victim)
    with pytest.raises(UsageError, match="a symbolic link where a lock file belongs"):
        stage(src, dst)
    assert victim.read_text() == "precious"


def test_a_directory_in_dst_that_is_a_symlink_is_not_written_through(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    src = _src(tmp_path / "src", [_entry("sub/x.tar", b"abc"), _entry("y.tar", b"def")],
               {"sub/x.tar": b"abc", "y.tar": b"def"})
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "sub").symlink_to(other)
    r = stage(src, dst)
    assert [f.file for f in r.failures] == ["sub/x.tar"]
    assert "symbolic link" in r.failures[0].reason and "remove it" in r.failures[0].reason
    assert list(other.iterdir()) == []
    assert (dst / "y.tar").read_bytes() == b"def"  # the others are staged
    assert not (dst / "manifest.json").exists()


def test_the_staged_manifest_and_files_get_the_umask_not_0600(tmp_path):
    src = _src(tmp_path / "src", [_entry("s.tar", b"abc")], {"s.tar": b"abc"})
    old = os.umask(0o022)
    try:
        assert not stage(src, tmp_path / "dst").partial
    finally:
        os.umask(old)
    for name in ("manifest.json", "s.tar"):
        assert (tmp_path / "dst" / name).stat().st_mode & 0o777 == 0o644, name


def test_a_directory_named_by_the_manifest_is_refused(tmp_path):
    src = _src(tmp_path / "src", [_entry("d.tar", b"")])
    (src / "d.tar").mkdir()
    r = stage(src, tmp_path / "dst")
    assert [f.file for f in r.failures] == ["d.tar"]
    assert "a directory, not a regular file" in r.failures[0].reason
