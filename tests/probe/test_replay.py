"""Dataset replay on real files: counts, coldness, sampling, and a hostile tree."""

from __future__ import annotations

import os

import pytest

from autotune.errors import AutotuneError
from autotune.probe.replay import read_level, replay, sample_files


def test_replay_reads_every_sampled_byte(small_dataset):
    r = replay(small_dataset, concurrency=(1, 4), seconds_per_level=30)
    total = sum(p.stat().st_size for p in small_dataset.rglob("*.jpg"))
    assert r.files_sampled == 64
    assert r.mean_file_bytes == pytest.approx(total / 64)
    for lv in r.by_concurrency:
        assert lv.files == 64 and lv.bytes == total and lv.errors == 0 and not lv.cut_short
        assert lv.files_per_s == pytest.approx(lv.files / lv.seconds)
        assert 0 < lv.lat_p50_ms <= lv.lat_p99_ms
    assert r.cold_method == ("drop_caches" if os.geteuid() == 0 else "fadvise")
    assert r.best.concurrency in (1, 4)


def test_warm_is_labelled(small_dataset):
    r = replay(small_dataset, concurrency=(1,), cold=False)
    assert r.cold_method == "warm" and any("warm" in w for w in r.warnings)


def test_sample_is_bounded_uniform_and_deterministic(tmp_path):
    for d in range(10):
        (tmp_path / f"c{d}").mkdir()
        for i in range(50):
            (tmp_path / f"c{d}" / f"{i}.jpg").write_bytes(b"x" * (i + 1))
    a, stats = sample_files(tmp_path, 100, seed=3)
    b, _ = sample_files(tmp_path, 100, seed=3)
    c, _ = sample_files(tmp_path, 100, seed=4)
    assert a == b and a != c
    assert len(a) == 100 and stats.files_seen == 500
    # Reservoir sampling: every class is represented, not just the first directories.
    assert len({os.path.basename(os.path.dirname(p)) for p, _ in a}) == 10


def test_symlink_loops_empty_files_and_scratch_are_skipped(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.jpg").write_bytes(b"1234")
    (tmp_path / "a" / "empty.jpg").write_bytes(b"")
    os.symlink(tmp_path, tmp_path / "a" / "loop")
    (tmp_path / ".autotune-probe-123").mkdir()
    (tmp_path / ".autotune-probe-123" / "fio-scratch.bin").write_bytes(b"z" * 100)
    files, _ = sample_files(tmp_path, 10)
    assert [os.path.basename(p) for p, _ in files] == ["x.jpg"]


def test_vanished_file_is_counted_not_fatal(tmp_path):
    f = tmp_path / "a.jpg"
    f.write_bytes(b"abc")
    lv = read_level([(str(f), 3), (str(tmp_path / "gone.jpg"), 3)], 2, 10)
    assert lv.files == 1 and lv.errors == 1


def test_time_budget_cuts_a_level_short(small_dataset):
    files, _ = sample_files(small_dataset, 64)
    lv = read_level(files * 2000, 1, 0.2)
    assert lv.cut_short and lv.files < 128_000


def test_empty_tree_is_a_clear_error(tmp_path):
    with pytest.raises(AutotuneError, match="no non-empty regular files"):
        replay(tmp_path)
