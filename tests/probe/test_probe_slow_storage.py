"""The probe sees slowed storage for real: a cgroup IOPS cap and a FUSE latency mount."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autotune.cache import drop_caches

pytestmark = [pytest.mark.alone, pytest.mark.slow, pytest.mark.root]


def _probe_cmd(path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "autotune", "-q", "probe", str(path), "--json", "-", *extra]


@pytest.mark.fio
def test_fio_under_a_500_iops_cap_measures_about_500(work_dir, small_dataset):
    from autotune.emulate import IoThrottle

    with IoThrottle(work_dir, read_iops=500, name="probe-test") as cap:
        drop_caches()
        r = cap.run(_probe_cmd(work_dir, "--no-replay", "--size", "128M", "--runtime", "4"),
                    capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    iops = d["fio"]["rand_read"]["iops"]
    assert 375 <= iops <= 625, f"random-read IOPS {iops:.0f} under a 500-IOPS cap"
    # The probe notices the disk behaves like a disk, whatever its flags say.
    assert "hdd" in (d["filesystem"]["class"], d["filesystem"]["behaves_like"])
    assert not d["verdict"]["rules"][0]["pass"]  # far below 50k IOPS
    # ... and says the figures are the cgroup's cap's, which it read (a user's review: the
    # probe in a capped container said "ssd" and nothing of the cap)
    assert d["verdict"]["read_cap"]["iops"] == 500, d["verdict"]
    assert "read cap" in d["verdict"]["summary"]
    assert any("caps reads on" in e and "500 reads/s" in e for e in d["verdict"]["evidence"])


def test_replay_behind_a_5ms_fuse_delay_sees_at_least_5ms(small_dataset, tmp_path):
    pytest.importorskip("pyfuse3")
    from autotune.emulate import SlowMount

    mnt = tmp_path / "mnt"
    with SlowMount(small_dataset, mnt, delay_ms=5.0):
        r = subprocess.run(_probe_cmd(mnt, "--concurrency", "1,8", "--replay-seconds", "20"),
                           capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    one, eight = d["replay"]["by_concurrency"]
    assert one["lat_p50_ms"] >= 5.0, one
    # Latency hides behind concurrency, as a bound rather than a ratio of two runs' speeds:
    # a daemon serving its delays one at a time never passes one file per two delays
    # (100 files/s; measured with SlowMount(max_tasks=1): 70), eight readers here 275-350.
    assert eight["files_per_s"] > 1000 / (2 * 5.0), (one, eight)
    assert d["filesystem"]["type"].startswith("fuse")
    assert d["filesystem"]["class"] == "network"
    # The mirror is read-only: fio says why it could not run, and how to fix that.
    assert d["fio"] is None and "--scratch" in d["fio_error"]
