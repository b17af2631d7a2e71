"""Real /proc/diskstats: the disk behind tmp_path, reads that reach it, tmpfs, and a
cross-check against sysstat's iostat while fio reads a scratch file this test created."""

from __future__ import annotations

import mmap
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.blockdev import BlockDevice
from autotune.monitor import (DiskStatsReader, SystemMonitor, Unavailable, disk_rates,
                              iostat_crosscheck, resolve_disk)

HAVE_FIO = shutil.which("fio") is not None
HAVE_IOSTAT = shutil.which("iostat") is not None

pytestmark = [pytest.mark.alone, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")]


def _disk(path: Path) -> BlockDevice:
    dev = resolve_disk(path)
    if isinstance(dev, Unavailable):
        pytest.skip(f"tmp_path has no block device here: {dev.reason}")
    return dev


def test_device_of_tmp_path_is_in_diskstats(tmp_path: Path) -> None:
    dev = _disk(tmp_path)
    snap = DiskStatsReader(dev).snapshot()
    assert snap.counters.name == dev.name
    assert (snap.counters.major, snap.counters.minor) == (dev.major, dev.minor)
    assert dev.partition is None or dev.partition != dev.name   # partitions map to the disk


def test_o_direct_read_reaches_the_disk_and_is_counted(scratch_dir: Path, make_real_file) -> None:
    dev = _disk(scratch_dir)
    size = 4 << 20
    f = make_real_file(scratch_dir / "direct.bin", size)
    reader = DiskStatsReader(dev)
    buf = mmap.mmap(-1, 1 << 20)        # page-aligned, as O_DIRECT requires
    fd = os.open(f, os.O_RDONLY | os.O_DIRECT)
    try:
        before = reader.snapshot()
        off = 0
        while off < size:
            off += os.preadv(fd, [buf], off)
        after = reader.snapshot()
    finally:
        os.close(fd)
    r = disk_rates(before, after)
    assert after.counters.reads > before.counters.reads
    # Other processes may read too, so at least (not exactly) our bytes.
    assert after.counters.sectors_read - before.counters.sectors_read >= size // 512
    assert r.reads_per_s > 0 and r.read_mib_s > 0


def test_buffered_read_after_dropping_the_files_pages_is_counted(scratch_dir: Path,
                                                                 make_real_file) -> None:
    # fadvise(DONTNEED) drops this file's clean pages without root and without touching
    # anyone else's cache (unlike drop_caches).
    dev = _disk(scratch_dir)
    size = 2 << 20
    f = make_real_file(scratch_dir / "buffered.bin", size)
    fd = os.open(f, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        reader = DiskStatsReader(dev)
        before = reader.snapshot()
        while os.read(fd, 1 << 20):
            pass
        after = reader.snapshot()
    finally:
        os.close(fd)
    assert after.counters.reads > before.counters.reads
    assert after.counters.sectors_read - before.counters.sectors_read >= size // 512


def test_tmpfs_gives_disk_unavailable_with_reason() -> None:
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    dev = resolve_disk("/dev/shm")
    assert isinstance(dev, Unavailable)
    assert "tmpfs" in dev.reason
    with SystemMonitor(path="/dev/shm", interval=0.1, gpu=False) as mon:
        time.sleep(0.25)
    recs = mon.records
    assert recs
    for r in recs:
        assert r.to_dict()["disk"] == {"available": False, "reason": dev.reason}
    assert "disk" in mon.summary()["unavailable"]
    assert not any(k.startswith("disk.") for k in mon.summary()["figures"])


def test_missing_path_gives_disk_unavailable(tmp_path: Path) -> None:
    dev = resolve_disk(tmp_path / "nope")
    assert isinstance(dev, Unavailable) and "no such file" in dev.reason


def _start_fio(scratch: Path, runtime_s: int) -> subprocess.Popen:
    # Rate-limited: a steady load makes the comparison exact, and other jobs share this disk.
    cmd = ["fio", "--name=monitor-xcheck", f"--filename={scratch}", "--rw=randread",
           "--bs=4k", "--direct=1", "--ioengine=libaio", "--iodepth=8", "--rate_iops=4000",
           "--time_based", f"--runtime={runtime_s}", f"--size={scratch.stat().st_size}",
           "--output-format=terse"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.mark.slow
@pytest.mark.fio
@pytest.mark.skipif(not HAVE_FIO, reason="fio not installed")
@pytest.mark.skipif(not HAVE_IOSTAT, reason="iostat (sysstat) not installed")
def test_rates_agree_with_iostat_under_fio(scratch_dir: Path, make_real_file) -> None:
    _disk(scratch_dir)
    # Only ever point fio at a file we just created (fio overwrites what it is given).
    scratch = make_real_file(scratch_dir / "fio-scratch.bin", 64 << 20)
    fio = _start_fio(scratch, runtime_s=8)
    try:
        time.sleep(1.0)      # let fio reach its rate before measuring
        assert fio.poll() is None, fio.stderr.read().decode() if fio.stderr else ""
        res = iostat_crosscheck(scratch_dir, seconds=3)
    finally:
        fio.terminate()
        fio.wait(timeout=30)
    ref = res["iostat"]
    assert ref["reads_per_s"] > 1000, res   # fio's load is really there
    for src in ("oneshot", "monitor"):
        for k in ("reads_per_s", "read_mib_s"):
            assert res[src][k] == pytest.approx(ref[k], rel=0.10), (src, k, res)
    assert res["monitor_samples"] >= 5
