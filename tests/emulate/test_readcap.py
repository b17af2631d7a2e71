"""The read cap of a job's own cgroup (autotune.readcap): its parsers, and a real cap
read from a capped process, its charged reads carried through the monitor's samples."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from autotune.blockdev import block_device_for
from autotune.emulate.throttle import CgroupBackend, IoThrottle
from autotune.monitor.figures import figures_of
from autotune.monitor.sampler import SystemMonitor
from autotune.readcap import capped, read_cap, v1_limit, v2_limits, v2_stat


def test_v1_limit_and_v2_limits_of_one_device():
    assert v1_limit("7:0 100\n8:0 50\n", "8:0") == 50
    assert v1_limit("7:0 100\n", "7:1") is None
    assert v1_limit("", "7:0") is None
    io_max = "7:0 rbps=1048576 wbps=max riops=100 wiops=max\n8:0 rbps=max wbps=5 riops=max wiops=max\n"
    assert v2_limits(io_max, "7:0") == {"iops": 100, "bps": 1048576}
    # A write limit alone caps no read.
    assert v2_limits(io_max, "8:0") == {} and not capped(io_max, "8:0", v2=True)
    assert capped(io_max, "7:0", v2=True) and capped("7:0 60\n", "7:0")
    assert v2_stat("7:0 rbytes=4096 wbytes=0 rios=1 wios=0\n", "7:0", "rbytes") == 4096


@pytest.mark.root
def test_a_capped_process_cap_and_charged_reads_reach_the_monitor(
        disk_dir: Path, backend: CgroupBackend, random_file: Callable[[Path, int], Path]) -> None:
    dev = block_device_for(disk_dir)
    data = random_file(disk_dir / "blob", 4 << 20)
    cap_iops = 400
    assert read_cap(dev) is None  # this process is outside any cap
    with IoThrottle(disk_dir, read_iops=cap_iops, name="test-readcap") as cap:
        sleeper = cap.popen(["sleep", "60"])
        try:
            rc = read_cap(dev, sleeper.pid)
            assert rc is not None and rc.iops == cap_iops and rc.bps is None
            assert rc.majmin == dev.majmin
            assert ("read_iops_device" if backend.version == 1 else "io.max") in rc.source
            before = rc.charged()
            assert before is not None
            reads = 300
            with SystemMonitor(path=disk_dir, pid=sleeper.pid, interval=0.2, gpu=False) as mon:
                # O_DIRECT: every 4 KiB read is one bio charged against the cap.
                cap.run(["dd", f"if={data}", "of=/dev/null", "bs=4k", f"count={reads}",
                         "iflag=direct", "status=none"], check=True, timeout=120)
                time.sleep(0.3)
            after = rc.charged()
        finally:
            sleeper.kill()
            sleeper.wait()
    assert after is not None and after[0] - before[0] >= reads and after[1] - before[1] >= reads * 4096
    disks = [s.disk.to_dict() for s in mon.records if hasattr(s.disk, "to_dict")]
    assert disks and all(d["cap_iops"] == cap_iops for d in disks)
    charged = sum(d["cap_reads_per_s"] * d["interval_s"] for d in disks)
    assert charged >= 0.95 * reads, charged
    figs = figures_of((s.to_dict() for s in mon.records), source="test", joined_by="time")
    assert figs.disk_read_cap == {"iops": cap_iops, "mib_s": None}
    assert figs.disk_cap_reads_per_s is not None and figs.disk_cap_reads_per_s["max"] > 0


def test_no_device_no_cap():
    assert read_cap(None) is None
