"""Storage classification from the real mount table and block devices."""

from __future__ import annotations

import pytest

from autotune.blockdev import block_device_for, mount_for
from autotune.probe.classify import classify
from autotune.probe.fio import FioJobResult, FioResult


def _fio(iops: float) -> FioResult:
    job = FioJobResult("rand_read", iops, iops * 4096 / 2**20, 1.0, 1.0, 2.0, 10**6, 1.0)
    seq = FioJobResult("seq_read", 100, 100, 1.0, 1.0, 2.0, 10**6, 1.0)
    return FioResult(True, "libaio", 2**20, 1.0, seq, job)


def test_tmpfs_is_memory_with_no_device():
    m = mount_for("/dev/shm")
    if m is None or m.fstype != "tmpfs":
        pytest.skip("/dev/shm is not tmpfs here")
    info = classify("/dev/shm")
    assert info.klass == "memory" and info.device is None
    assert "RAM" in info.evidence[0]


def test_work_disk_has_a_device_and_evidence(work_dir):
    dev = block_device_for(work_dir)
    if dev is None:
        pytest.skip("work dir is not on a block device")
    info = classify(work_dir)
    assert info.device == dev.name
    assert info.klass in ("nvme", "ssd", "hdd")
    assert any(dev.name in e for e in info.evidence)
    assert info.to_dict()["class"] == info.klass


def test_measured_iops_corrects_or_qualifies_the_device_flag(work_dir):
    dev = block_device_for(work_dir)
    if dev is None:
        pytest.skip("work dir is not on a block device")
    fast = classify(work_dir, _fio(100_000))
    assert fast.klass in ("nvme", "ssd")  # rotational=1 on a virtual disk is overridden
    slow = classify(work_dir, _fio(500))
    assert "hdd" in (slow.klass, slow.behaves_like)
    assert any("500" in e for e in slow.evidence)


def test_page_cache_figures_never_make_a_class(work_dir):
    """A buffered run's page-cache "IOPS" (flagged implausible by fio.check_plausible) must
    not turn a disk, or a filesystem with no visible disk, into nvme."""
    cached = _fio(500_000)
    cached.rand_read.plausible = False
    cached.rand_read.warnings.append("rand_read: implausible: the page cache served the rest")
    nodev = mount_for("/proc")
    if nodev is None or block_device_for("/proc") is not None:
        pytest.skip("/proc is not a filesystem without a block device here")
    assert classify("/proc", _fio(500_000)).klass == "nvme"  # the rule the flag guards
    info = classify("/proc", cached)
    assert info.klass == "unknown"
    assert any("not used for the class" in e and "page cache" in e for e in info.evidence)
    dev = block_device_for(work_dir)
    if dev is not None and not dev.name.startswith("nvme"):
        disk = classify(work_dir, cached)
        assert "nvme" not in (disk.klass, disk.behaves_like)
