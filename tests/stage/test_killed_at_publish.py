"""A stage or a conversion killed at the very moment it publishes its manifest leaves
nothing half-written in the user's folder: the temporary file lives in the work folder,
which the rerun empties. Before, `DST/.manifest.json.XXXXXXXX` stayed there for good
(seen in CI after a SIGKILLed stage)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autotune_converters.stage import stage

# Runs `call` with os.replace patched: the rename onto manifest.json SIGKILLs the process
# first, so the temporary file is written and fsynced but never renamed.
_KILL_AT_PUBLISH = textwrap.dedent("""
    import os, signal, sys
    real = os.replace
    def replace(a, b, **kw):
        if os.path.basename(str(b)) == "manifest.json":
            os.kill(os.getpid(), signal.SIGKILL)
        return real(a, b, **kw)
    os.replace = replace
    {call}
""")


def _killed(call: str, cwd: Path) -> None:
    r = subprocess.run([sys.executable, "-c", _KILL_AT_PUBLISH.format(call=call)], cwd=cwd,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -9, r.stderr


def _junk(dst: Path) -> list[str]:
    """Names in DST that are neither published files nor the work folder."""
    return sorted(n for n in os.listdir(dst)
                  if n.startswith(".") and not n.startswith(".autotune-"))


def test_a_stage_killed_at_its_manifest_leaves_no_temporary_file_in_dst(small_dataset, tmp_path):
    dst = tmp_path / "dst"
    _killed(f"from autotune_converters.stage import stage; stage({str(small_dataset)!r}, {str(dst)!r})",
            Path.cwd())
    assert not (dst / "manifest.json").exists()   # killed before the rename, as meant
    assert _junk(dst) == []
    r = stage(small_dataset, dst)
    assert r.manifest_written and _junk(dst) == []
    assert not (dst / ".autotune-stage" / "tmp").exists()   # emptied, then removed


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_a_conversion_killed_at_its_manifest_leaves_no_temporary_file_in_dst(
        small_dataset, tmp_path, fmt):
    from autotune_converters import ConvertOptions, convert

    dst = tmp_path / fmt
    _killed("from autotune_converters import ConvertOptions, convert\n"
            f"if __name__ == '__main__':\n"
            f"    convert({str(small_dataset)!r}, {str(dst)!r}, "
            f"ConvertOptions(format={fmt!r}, workers=1))", Path.cwd())
    assert not (dst / "manifest.json").exists() and _junk(dst) == []
    res = convert(small_dataset, dst, ConvertOptions(format=fmt, workers=1))
    assert res.samples == 64 and _junk(dst) == []
    assert not (dst / ".autotune-convert").exists()
    assert json.loads((dst / "manifest.json").read_text())["num_samples"] == 64


def test_a_verified_file_is_in_the_resume_state_within_a_second(tmp_path):
    # The state was written every 16 files: a kill -9 had up to 15 verified shards (seconds
    # each to copy) copied again by the rerun. Now also a second after the last write.
    import json
    import os
    import time

    from autotune_converters.stage import _State

    (tmp_path / "w").mkdir()
    fd = os.open(tmp_path / "w", os.O_RDONLY | os.O_DIRECTORY)
    try:
        s = _State(tmp_path, fd)
        s.add("shard-000000.tar", 10, 1, "aa")
        time.sleep(1.05)
        s.add("shard-000001.tar", 10, 2, "bb")   # no save() call: as a kill -9 leaves it
        done = json.loads((tmp_path / "w" / "state.json").read_text())
    finally:
        os.close(fd)
    assert set(done) == {"shard-000000.tar", "shard-000001.tar"}, done
