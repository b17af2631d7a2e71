"""fio figures the storage did not serve never pass a gate (issue #13 item 8): the gate says
it could not measure them (exit 5, not the "too slow" 3; issue 29).

Real fio through the real CLI: a buffered run on the root disk, where the page cache
serves the repeats, and a run on tmpfs, where there is no disk at all. The mocked checks
of the same rule are in test_fio_parse.py, in addition to these.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from autotune.blockdev import block_device_for, mount_for
from autotune.probe import fio

pytestmark = [pytest.mark.alone, pytest.mark.fio]
MiB = 2**20

# The CLI as users run it, with one change: the O_DIRECT test answers "refused", as it does
# on a filesystem without O_DIRECT. Everything else (scratch file, fio, cross-check, gate)
# is the real code path.
BUFFERED_CLI = """\
import sys
import autotune.probe.fio as f
f.direct_io_supported = lambda path: False
from autotune.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _probe(argv: list[str], *, buffered: bool) -> subprocess.CompletedProcess:
    head = ["-c", BUFFERED_CLI] if buffered else ["-m", "autotune"]
    return subprocess.run([sys.executable, *head, "-q", "probe", *argv], check=False,
                          capture_output=True, text=True, timeout=120)


def test_buffered_run_served_by_the_page_cache_fails_the_gate(work_dir):
    dev = block_device_for(work_dir)
    if dev is None:
        pytest.skip(f"{work_dir} has no block device whose counters could cross-check fio")
    out = work_dir / "probe.json"
    size = 4 * MiB  # re-read many times a second: after the first pass the cache serves it
    r = _probe([str(work_dir), "--size", str(size), "--runtime", "1.5", "--no-replay",
                "--min-iops", "1", "--json", str(out)], buffered=True)
    assert r.returncode == 5, r.stderr   # could not measure the disk: not "too slow" (3)
    d = json.loads(out.read_text())
    rand = d["fio"]["rand_read"]
    assert d["fio"]["direct"] is False and d["fio"]["device"] == dev.name
    assert rand["io_bytes"] > 4 * size  # fio read the file over and over ...
    assert rand["device_share"] < fio.MIN_DEVICE_SHARE_BUFFERED  # ... the disk did not
    assert rand["plausible"] is False and d["fio"]["plausible"] is False
    assert "gate not measured: --min-iops 1: random-read IOPS not the storage's figure" in r.stderr
    assert d["gate"]["outcome"] == "unmeasured" and d["gate"]["checks"][0]["measured"] is None
    assert "page cache served the rest" in r.stderr and dev.name in r.stderr
    # The page-cache figure (hundreds of thousands of "IOPS") does not make the disk nvme.
    fs = d["filesystem"]
    assert "nvme" not in (fs["class"], fs["behaves_like"]) or dev.name.startswith("nvme")
    assert any("not used for the class" in e for e in fs["evidence"])
    assert not [p for p in work_dir.iterdir() if p.name.startswith(fio.SCRATCH_PREFIX)]


def test_ram_backed_fio_never_passes_a_gate():
    m = mount_for("/dev/shm")
    if m is None or m.fstype != "tmpfs" or not Path("/dev/shm").is_dir():
        pytest.skip("/dev/shm is not a tmpfs here")
    d = Path(tempfile.mkdtemp(prefix="autotune-test-", dir="/dev/shm"))
    try:
        out = d / "probe.json"
        r = _probe([str(d), "--size", "8M", "--runtime", "1", "--no-replay", "--min-iops", "1",
                    "--min-seq-mibps", "1", "--json", str(out)], buffered=False)
        assert r.returncode == 5, r.stderr
        doc = json.loads(out.read_text())
        assert doc["fio"]["memory_fs"] == "tmpfs" and doc["fio"]["plausible"] is False
        assert doc["filesystem"]["class"] == "memory"
        for gate in ("--min-iops 1: random-read IOPS", "--min-seq-mibps 1: sequential MiB/s"):
            assert f"{gate} not the storage's figure" in r.stderr
        assert r.stderr.count("RAM-backed") >= 2
    finally:
        shutil.rmtree(d, ignore_errors=True)
