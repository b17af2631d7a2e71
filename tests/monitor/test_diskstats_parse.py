"""Parser and formula tests on recorded /proc/diskstats lines (all field-count variants)."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.monitor.diskstats import (DiskSnapshot, DiskStatsReader, disk_rates,
                                        parse_diskstats, parse_diskstats_line)

# Kernel 4.x (14 fields), 4.18+ with discards (18), 5.5+ with flushes (20; recorded on 6.18).
LINE14 = "   8       0 sda 33167 3812 1124805 428735 28338 77604 850432 3304811 0 384521 3733854"
LINE18 = " 259       0 nvme0n1 255999 814 12369153 47919 996852 81 36123024 425995 0 301795 580470 0 0 0 0"
LINE20 = (" 254       0 vda 69459 22210 3853330 22072 12141 106599 7058992 41822 0 20748 70689 "
          "29212 85 2139992 5510 1054 1283")
OLD_PARTITION = "   8       1 sda1 35713 1122730 106304 850432"   # 2.6.24 partition: 7 fields


def test_parse_14_fields() -> None:
    c = parse_diskstats_line(LINE14)
    assert (c.major, c.minor, c.name) == (8, 0, "sda")
    assert (c.reads, c.reads_merged, c.sectors_read, c.read_ms) == (33167, 3812, 1124805, 428735)
    assert (c.writes, c.writes_merged, c.sectors_written, c.write_ms) == (28338, 77604, 850432, 3304811)
    assert (c.in_flight, c.io_ms, c.weighted_ms) == (0, 384521, 3733854)
    assert c.discards is None and c.flushes is None


def test_parse_18_fields() -> None:
    c = parse_diskstats_line(LINE18)
    assert c.name == "nvme0n1" and c.reads == 255999 and c.weighted_ms == 580470
    assert (c.discards, c.discards_merged, c.sectors_discarded, c.discard_ms) == (0, 0, 0, 0)
    assert c.flushes is None and c.flush_ms is None


def test_parse_20_fields() -> None:
    c = parse_diskstats_line(LINE20)
    assert (c.major, c.minor, c.name) == (254, 0, "vda")
    assert c.io_ms == 20748 and c.weighted_ms == 70689
    assert (c.discards, c.sectors_discarded, c.discard_ms) == (29212, 2139992, 5510)
    assert (c.flushes, c.flush_ms) == (1054, 1283)


def test_unsupported_shape_is_rejected_with_the_count() -> None:
    with pytest.raises(ValueError, match="7 fields"):
        parse_diskstats_line(OLD_PARTITION)
    # ... and skipped, not fatal, when parsing a whole file.
    devs = parse_diskstats("\n".join([LINE14, OLD_PARTITION, LINE20, ""]))
    assert set(devs) == {"sda", "vda"}


def test_reader_finds_device_by_name_in_a_recorded_file(tmp_path) -> None:
    f = tmp_path / "diskstats"
    f.write_text("\n".join([LINE14, LINE18, LINE20]) + "\n")
    snap = DiskStatsReader("nvme0n1", path=str(f)).snapshot()
    assert snap.counters.sectors_read == 12369153
    with pytest.raises(LookupError):
        DiskStatsReader("sdz", path=str(f)).snapshot()


def _pair(**deltas: int) -> tuple[DiskSnapshot, DiskSnapshot]:
    a = parse_diskstats_line(LINE20)
    b = dataclasses.replace(a, **{k: getattr(a, k) + v for k, v in deltas.items()})
    return DiskSnapshot(a, 100.0, 1.0), DiskSnapshot(b, 102.0, 3.0)


def test_rates_use_the_iostat_formulas() -> None:
    before, after = _pair(reads=1000, sectors_read=8000, read_ms=500, reads_merged=10,
                          writes=200, sectors_written=1600, write_ms=400,
                          io_ms=1500, weighted_ms=900)
    r = disk_rates(before, after)
    assert r.interval_s == 2.0
    assert r.reads_per_s == 500.0                    # Δreads / Δt
    assert r.read_mib_s == 8000 / 2048 / 2           # sectors / 2048 = MiB (iostat -m)
    assert r.reads_merged_per_s == 5.0
    assert r.r_await_ms == 0.5                       # Δread_ms / Δreads
    assert r.rareq_sz_kib == 4.0                     # Δsectors / 2 / Δreads
    assert r.writes_per_s == 100.0 and r.write_mib_s == 1600 / 2048 / 2
    assert r.w_await_ms == 2.0
    assert r.aqu_sz == 0.45                          # Δweighted_ms / Δt_ms
    assert r.util_pct == 75.0                        # Δio_ms / Δt_ms * 100
    assert r.to_dict()["available"] is True


def test_no_io_gives_zero_await_not_a_division_error() -> None:
    r = disk_rates(*_pair())
    assert r.reads_per_s == 0.0 and r.r_await_ms == 0.0 and r.rareq_sz_kib == 0.0
    assert r.w_await_ms == 0.0 and r.util_pct == 0.0


def test_util_is_capped_at_100() -> None:
    assert disk_rates(*_pair(io_ms=2100)).util_pct == 100.0


def test_millisecond_counters_wrap_at_32_bits() -> None:
    a = dataclasses.replace(parse_diskstats_line(LINE20), io_ms=2**32 - 100, read_ms=2**32 - 1)
    b = dataclasses.replace(a, io_ms=400, read_ms=9, reads=a.reads + 10)
    r = disk_rates(DiskSnapshot(a, 0.0, 0.0), DiskSnapshot(b, 1.0, 1.0))
    assert r.util_pct == 50.0 and r.r_await_ms == 1.0


def test_counts_going_backwards_are_an_error_not_a_number() -> None:
    a = parse_diskstats_line(LINE20)
    b = dataclasses.replace(a, reads=5)
    with pytest.raises(ValueError, match="reads went backwards"):
        disk_rates(DiskSnapshot(a, 0.0, 0.0), DiskSnapshot(b, 1.0, 1.0))


def test_interval_must_be_positive_and_devices_equal() -> None:
    a = DiskSnapshot(parse_diskstats_line(LINE20), 5.0, 5.0)
    with pytest.raises(ValueError, match="positive"):
        disk_rates(a, a)
    other = DiskSnapshot(parse_diskstats_line(LINE14), 6.0, 6.0)
    with pytest.raises(ValueError, match="different devices"):
        disk_rates(a, other)
