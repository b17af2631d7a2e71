"""fio JSON parsing and the plausibility check, on fio's own recorded output.

These are in addition to the real-fio tests in test_fio_real.py, not instead of them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.probe.fio import (
    MIN_DEVICE_SHARE,
    MIN_DEVICE_SHARE_BUFFERED,
    FioError,
    FioJobResult,
    check_plausible,
    parse_fio_json,
)

DATA = Path(__file__).parent / "data"


def test_parses_recorded_randread():
    text = (DATA / "fio-3.33-randread-vda.json").read_text()
    r = parse_fio_json(text, "rand_read")
    doc = json.loads(text)["jobs"][0]["read"]
    assert r.iops == pytest.approx(doc["iops"])
    assert r.bw_mib_s == pytest.approx(doc["bw_bytes"] / 2**20)
    assert r.lat_mean_ms == pytest.approx(doc["clat_ns"]["mean"] / 1e6)
    assert r.lat_p99_ms == pytest.approx(doc["clat_ns"]["percentile"]["99.000000"] / 1e6)
    assert r.lat_p50_ms < r.lat_p99_ms
    assert r.io_bytes == doc["io_bytes"]


def test_skips_warnings_printed_before_the_json():
    text = "fio: this platform does not support process shared mutexes\n" + \
        (DATA / "fio-3.33-randread-vda.json").read_text()
    assert parse_fio_json(text).iops > 0


@pytest.mark.parametrize("text, match", [
    ("", "no JSON"),
    ("fio: file creation disallowed", "no JSON"),
    ('{"jobs": []}', "not the JSON expected"),
    ('{"jobs": [{"jobname": "x", "error": 5, "read": {}}]}', "error 5"),
    ('{"jobs": [{"jobname": "x", "error": 0, "read": {"io_bytes": 0, "iops": 0, "bw_bytes": 0}}]}',
     "read 0 bytes"),
    ('{"jobs": [{"jobname": "x", "err', "not the JSON expected"),
])
def test_bad_output_is_a_clear_error(text, match):
    with pytest.raises(FioError, match=match):
        parse_fio_json(text, "x")


def test_unwritten_extents_recording_is_caught():
    # Real fio output on a fallocate'd file: half a million "IOPS" the disk never saw.
    r = parse_fio_json((DATA / "fio-3.33-randread-unwritten-extents.json").read_text(), "rand_read")
    assert r.iops > 400_000
    r.device_bytes = 0  # what /proc/diskstats showed during that run
    check_plausible(r, direct=True, device="vda")
    assert not r.plausible
    assert "did not reach the disk" in r.warnings[0]


def test_absolute_bound_catches_impossible_figures_without_a_device():
    r = parse_fio_json((DATA / "fio-3.33-randread-vda.json").read_text(), "rand_read")
    r.iops, r.bw_mib_s = 2e7, 47e3 * 1e6 / 2**20 * 100
    check_plausible(r, direct=True, device=None)
    assert not r.plausible


def test_real_recording_is_plausible():
    r = parse_fio_json((DATA / "fio-3.33-randread-vda.json").read_text(), "rand_read")
    r.device_bytes = r.io_bytes
    assert check_plausible(r, direct=True, device="vda").plausible


def _recorded() -> FioJobResult:
    return parse_fio_json((DATA / "fio-3.33-randread-vda.json").read_text(), "rand_read")


def test_buffered_figure_the_disk_did_not_serve_is_implausible():
    r = _recorded()
    r.device_bytes = r.io_bytes // 50  # 2 %: what vda saw under a buffered page-cache run
    check_plausible(r, direct=False, device="vda")
    assert not r.plausible and r.device_share == pytest.approx(0.02, rel=0.01)
    assert "page cache served the rest" in r.warnings[0] and "vda" in r.warnings[0]


def test_buffered_figure_the_disk_served_stands():
    r = _recorded()
    r.device_bytes = r.io_bytes + r.io_bytes // 50  # readahead: the disk read a bit more
    assert check_plausible(r, direct=False, device="vda").plausible, r.warnings


def test_buffered_share_that_passes_direct_fails_buffered():
    # 60 % is enough to show direct reads reached the disk, not that a buffered figure is
    # the disk's (the cache served 40 % of it).
    share = (MIN_DEVICE_SHARE + MIN_DEVICE_SHARE_BUFFERED) / 2
    direct, buffered = _recorded(), _recorded()
    for r in (direct, buffered):
        r.device_bytes = int(r.io_bytes * share)
    assert check_plausible(direct, direct=True, device="vda").plausible
    assert not check_plausible(buffered, direct=False, device="vda").plausible


def test_buffered_without_a_device_is_unverifiable():
    r = check_plausible(_recorded(), direct=False, device=None)
    assert not r.plausible and r.device_share is None
    assert r.warnings[0].startswith("rand_read: unverifiable")


def test_ram_backed_is_never_plausible_even_direct():
    r = check_plausible(_recorded(), direct=True, device=None, memory_fs="tmpfs")
    assert not r.plausible and "RAM-backed" in r.warnings[0] and "tmpfs" in r.warnings[0]


def test_direct_without_a_device_stands_unchecked():
    # NFS, overlay: O_DIRECT bypassed this host's page cache; there is nothing to compare.
    r = check_plausible(_recorded(), direct=True, device=None)
    assert r.plausible and r.device_share is None
