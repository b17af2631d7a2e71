"""Counting the reads a cap charges: the cgroup and diskstats parsers, on real files too."""

from __future__ import annotations

import os
from pathlib import Path

from autotune.blockdev import block_device_for
from autotune.probe.iocount import diskstats_reads, read_counter
from autotune.readcap import capped, v1_reads, v2_stat

V1 = "7:0 Read 1516\n7:0 Write 3\n7:0 Sync 1519\n7:0 Total 1519\n8:0 Read 9\nTotal 1528\n"
V2 = "7:0 rbytes=249580 wbytes=0 rios=1530 wios=0 dbytes=0 dios=0\n254:0 rbytes=1 rios=2\n"


def test_v1_io_serviced_read_count_of_one_device():
    assert v1_reads(V1, "7:0") == 1516
    assert v1_reads(V1, "8:0") == 9
    assert v1_reads(V1, "7:1") is None
    assert v1_reads("Total 0\n", "7:0") is None


def test_v2_io_stat_rios_of_one_device():
    assert v2_stat(V2, "7:0") == 1530
    assert v2_stat(V2, "254:0") == 2
    assert v2_stat(V2, "9:9") is None
    assert v2_stat("7:0 rbytes=1\n", "7:0") is None


def test_a_read_cap_is_recognised_in_v1_and_v2_limit_files():
    assert capped("7:0 100\n", "7:0")
    assert not capped("8:0 100\n", "7:0")
    assert not capped("", "7:0")
    assert capped("7:0 rbps=max wbps=max riops=100 wiops=max\n", "7:0", v2=True)
    assert capped("7:0 rbps=1048576 wbps=max riops=max wiops=max\n", "7:0", v2=True)
    # A write cap alone does not cap the replay's reads.
    assert not capped("7:0 rbps=max wbps=max riops=max wiops=100\n", "7:0", v2=True)


def test_diskstats_reads_completed_field():
    line = "   7       0 loop0 1514 0 247452 812 0 0 0 0 0 900 812 0 0 0 0 0 0\n"
    assert diskstats_reads(line, "loop0") == 1514
    assert diskstats_reads(line, "loop1") is None


def test_the_counter_of_a_real_disk_moves_with_reads(work_dir: Path):
    dev = block_device_for(work_dir)
    counter = read_counter(dev)
    assert counter is not None and dev is not None
    reads, what = counter
    # Outside a cap the disk's own completed reads are counted, and labelled as the machine's.
    assert dev.name in what and "diskstats" in what
    before = reads()
    f = work_dir / "blob"
    f.write_bytes(os.urandom(1 << 20))
    fd = os.open(f, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.read(fd, 1 << 20)
    finally:
        os.close(fd)
    assert reads() > before


def test_no_device_no_counter():
    assert read_counter(None) is None
