"""The storage verdict behind a cgroup read cap (the real cap: test_probe_slow_storage.py):
its figures are the cap's, and the advice fits the kind of cap."""

from __future__ import annotations

from types import SimpleNamespace

from autotune.verdict.storage import storage_verdict

FS = SimpleNamespace(klass="ssd", type="ext4", device="loop0")


def test_a_byte_cap_is_not_eased_by_shards():
    cap = SimpleNamespace(iops=None, bps=5 * 2**20, source="blkio.throttle.read_bps_device")
    v = storage_verdict(FS, None, None, cap=cap)
    assert v["read_cap"] == {"iops": None, "mib_s": 5.0, "source": cap.source}
    assert "behind this cgroup's read cap" in v["summary"]
    assert any("5.0 MiB/s" in e and "held to it" in e for e in v["evidence"])
    [advice] = v["advice"]
    assert "shards read the same bytes" in advice and "without the cap" in advice


def test_a_request_cap_is_eased_by_shards_and_no_cap_says_nothing():
    cap = SimpleNamespace(iops=300, bps=None, source="blkio.throttle.read_iops_device")
    [advice] = storage_verdict(FS, None, None, cap=cap)["advice"]
    assert "300 reads/s" in advice and "fewer" in advice
    v = storage_verdict(FS, None, None)
    assert "read_cap" not in v and "cap" not in v["summary"]
