"""The real fio on a real disk: figures, the plausibility cross-check, and safety."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from autotune.blockdev import block_device_for
from autotune.probe import fio
from autotune.probe.fio import FioError

pytestmark = [pytest.mark.alone, pytest.mark.fio]
MiB = 2**20


def _device(path: Path) -> str | None:
    d = block_device_for(path)
    return d.name if d else None


def _scratch_dirs(parent: Path) -> list[Path]:
    return [p for p in parent.iterdir() if p.name.startswith(fio.SCRATCH_PREFIX)]


@pytest.mark.slow
def test_measure_real_disk_reaches_the_device(work_dir):
    dev = _device(work_dir)
    r = fio.measure(work_dir, size=64 * MiB, runtime=1.5, device=dev)
    assert r.direct and r.plausible, r.warnings
    for job in (r.seq_read, r.rand_read):
        assert job.iops > 0 and job.bw_mib_s > 0 and job.lat_mean_ms > 0
        assert job.lat_p50_ms <= job.lat_p99_ms
        if dev:  # direct reads: the disk's own counters saw (about) what fio read
            assert job.device_bytes >= 0.9 * job.io_bytes
    # 4 KiB random reads move far fewer bytes per I/O than 1 MiB sequential ones.
    assert r.rand_read.bw_mib_s < r.seq_read.bw_mib_s
    assert _scratch_dirs(work_dir) == []


@pytest.mark.slow
def test_fallocated_file_gives_an_impossible_figure_that_is_flagged(work_dir):
    d = Path(tempfile.mkdtemp(prefix=fio.SCRATCH_PREFIX, dir=work_dir))
    f = d / fio.SCRATCH_FILE
    fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    os.posix_fallocate(fd, 0, 128 * MiB)  # unwritten extents: reads never hit the disk
    os.close(fd)
    dev = _device(work_dir)
    if dev is None:
        pytest.skip("no block device behind the work dir")
    r = fio.run_job(fio.fio_binary(), f, "rand_read",
                    ["--rw=randread", "--bs=4k", "--numjobs=2", "--iodepth=32"],
                    runtime=1, direct=True, device=dev, ioengine=fio.pick_engine("fio"))
    assert not r.plausible, (r.iops, r.device_bytes)
    assert r.device_bytes < 0.5 * r.io_bytes


def test_layout_writes_real_data(work_dir):
    with fio.scratch_file(work_dir, 8 * MiB) as f:
        data = f.read_bytes()
        assert len(data) == 8 * MiB
        assert data.count(0) < len(data) // 100  # random, not zeros or holes
        assert os.stat(f).st_blocks * 512 >= 8 * MiB  # allocated, not sparse
        assert f.parent.name.startswith(fio.SCRATCH_PREFIX)
    assert not f.parent.exists()


def test_scratch_removed_when_the_body_fails(work_dir):
    with pytest.raises(RuntimeError):
        with fio.scratch_file(work_dir, MiB):
            raise RuntimeError("boom")
    assert _scratch_dirs(work_dir) == []


def test_run_job_refuses_a_file_it_did_not_create(work_dir):
    user = work_dir / "precious.bin"
    user.write_bytes(b"x" * 4096)
    with pytest.raises(FioError, match="refusing"):
        fio.run_job("fio", user, "rand_read", ["--rw=randread"], runtime=1, direct=True,
                    device=None, ioengine="psync")
    assert user.read_bytes() == b"x" * 4096


def test_stale_scratch_of_dead_owner_is_removed_live_and_foreign_kept(work_dir):
    dead = work_dir / (fio.SCRATCH_PREFIX + "dead")
    dead.mkdir()
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    (dead / fio.OWNER_FILE).write_text(f"{p.pid}\n")
    (dead / fio.SCRATCH_FILE).write_bytes(b"x")
    live = work_dir / (fio.SCRATCH_PREFIX + "live")
    live.mkdir()
    (live / fio.OWNER_FILE).write_text(f"{os.getpid()}\n")
    foreign = work_dir / (fio.SCRATCH_PREFIX + "foreign")  # no owner file: not ours
    foreign.mkdir()
    (foreign / "data").write_bytes(b"y")
    removed = fio.remove_stale_scratch(work_dir)
    assert removed == [dead]
    assert live.exists() and (foreign / "data").exists()


def test_not_enough_space_is_a_clear_error(work_dir):
    with pytest.raises(FioError, match="does not fit"):
        with fio.scratch_file(work_dir, 2**62):
            pass


@pytest.mark.slow
@pytest.mark.parametrize("sig, code, word", [(signal.SIGTERM, 143, b"terminated"),
                                             (signal.SIGINT, 130, b"interrupted")])
def test_user_files_keep_their_hash_and_a_signal_cleans_up(work_dir, sig, code, word):
    """fio pointed 'anywhere' only touches its own scratch file; Ctrl-C or SIGTERM mid-fio
    removes it and leaves no fio behind."""
    ds = work_dir / "ds"
    ds.mkdir()
    files = []
    for i in range(5):
        f = ds / f"img_{i}.jpg"
        f.write_bytes(os.urandom(50_000))
        files.append(f)
    before = {f: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "-q", "probe", str(ds),
                             "--size", "32M", "--runtime", "30", "--no-replay"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 30
    fio_seen = False
    while time.monotonic() < deadline and not fio_seen:
        time.sleep(0.2)
        out = subprocess.run(["pgrep", "-P", str(proc.pid), "fio"], capture_output=True)
        fio_seen = out.returncode == 0
    assert fio_seen, "fio never started"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err
    assert word in err
    assert _scratch_dirs(ds) == []
    assert {f: hashlib.sha256(f.read_bytes()).hexdigest() for f in files} == before
    time.sleep(0.5)
    assert subprocess.run(["pgrep", "-f", f"filename={ds}"], capture_output=True).returncode != 0


def test_buffered_fallback_is_labelled(work_dir, monkeypatch):
    monkeypatch.setattr(fio, "direct_io_supported", lambda f: False)
    r = fio.measure(work_dir, size=16 * MiB, runtime=0.5, device=_device(work_dir))
    assert r.direct is False
    assert any("buffered" in w for w in r.warnings)
