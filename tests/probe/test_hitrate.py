"""The page cache's hit rate over later epochs: the strict-LRU bound, and a real measurement
in a real memory cgroup smaller than the files (v1 here; v2 where it is delegated)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune.probe.hitrate import MemoryCgroup, lru_bound, measure_hit_rate, simulate_lru


def test_lru_bound_figures():
    # The figures: 11 % at c = 0.43, 67 % at c = 0.9; everything from c = 1.
    assert lru_bound(0.43) == pytest.approx(0.11, abs=0.005)
    assert lru_bound(0.9) == pytest.approx(0.67, abs=0.005)
    assert lru_bound(0.0) == 0.0 and lru_bound(1.0) == 1.0 and lru_bound(2.5) == 1.0
    # Always below c: a new random order each epoch wastes part of what the cache holds.
    assert all(lru_bound(c / 10) < c / 10 for c in range(1, 10))


@pytest.mark.parametrize("c", [0.2, 0.43, 0.7, 0.9])
def test_lru_bound_matches_a_simulated_lru(c):
    # The formula is strict LRU's steady state under a new permutation each epoch.
    assert simulate_lru(2000, int(c * 2000), epochs=4, seed=1) == pytest.approx(lru_bound(c), abs=0.03)


@pytest.fixture
def forty_mib(work_dir: Path) -> list[str]:
    """160 files of 256 KiB of random bytes (40 MiB) on the root disk."""
    files = []
    for i in range(160):
        p = work_dir / f"f{i:03d}.bin"
        p.write_bytes(os.urandom(256 * 1024))
        files.append(str(p))
    return files


# alone, both: another test's drop_caches during a later epoch turns its hits into misses.
@pytest.mark.alone
@pytest.mark.root
def test_hit_rate_in_a_memory_cgroup_smaller_than_the_files(forty_mib):
    # 20 MiB of cache room for 40 MiB read in a new order each epoch: c = 0.5, strict LRU
    # 15 %, Linux between that and c. The cgroup is sized as the reader's own memory plus
    # the room; hits are counted from /proc/PID/io read_bytes, not assumed.
    room = 20 * 2**20
    r = measure_hit_rate(forty_mib, room, epochs=3, in_place=False)
    assert r.method == "cgroup" and r.cgroup and not Path(r.cgroup).exists()  # removed after
    assert r.limit_bytes == r.reader_bytes + room and r.cache_share == pytest.approx(0.5, abs=0.01)
    assert len(r.epochs) == 3 and all(e["delivered"] == 40 * 2**20 for e in r.epochs)
    # The first epoch came from storage (the files were evicted first) ...
    assert r.epochs[0]["read_bytes"] >= 0.9 * r.epochs[0]["delivered"], r.epochs
    # ... and the later ones hit part of the time: not all (the room is half the data),
    # not none. A measurement: generous bounds around [LRU bound, c].
    assert 0.02 < r.hit_rate < 0.75, r.to_dict()
    assert r.lru_bound == pytest.approx(lru_bound(0.5))


@pytest.mark.alone
@pytest.mark.root
def test_room_for_everything_hits_everything(forty_mib):
    r = measure_hit_rate(forty_mib, 80 * 2**20, epochs=2, in_place=False)
    assert r.hit_rate > 0.9 and r.cache_share == 1.0, r.to_dict()


def test_a_sample_scales_the_room_alike(forty_mib):
    # A dataset over max_bytes is measured on a seeded sample, the room scaled by the
    # same share (in place: no cgroup needed for this check).
    r = measure_hit_rate(forty_mib, 80 * 2**20, epochs=2, max_bytes=10 * 2**20, in_place=True)
    assert r.sampled and r.files == 40 and r.dataset_bytes == 10 * 2**20
    assert r.room_bytes == 20 * 2**20 and r.method == "in place"
    assert any("sample" in n for n in r.notes)


def test_in_place_a_rate_over_the_caches_share_falls_back_to_the_model(forty_mib):
    # In place the reader has all the free memory, not the job's 10 MiB of cache for 40:
    # the later epoch hits nearly everything, more than random order can with a share of
    # 0.25. That larger cache's figure is not the job's: the model of its room is used.
    r = measure_hit_rate(forty_mib, 10 * 2**20, epochs=2, in_place=True)
    assert r.method == "in place" and r.cache_share == pytest.approx(0.25, abs=0.01)
    assert r.hit_rate == pytest.approx(lru_bound(r.cache_share)), r.to_dict()
    assert any("the LRU model's" in n for n in r.notes), r.notes


def test_bad_input_is_one_line():
    from autotune.errors import UsageError

    with pytest.raises(UsageError, match="epochs must be at least 2"):
        measure_hit_rate(["/nonexistent"], 1, epochs=1)
    with pytest.raises(UsageError, match="non-empty"):
        measure_hit_rate([], 1)


@pytest.mark.root
def test_the_cgroup_is_removed_when_the_body_raises():
    with pytest.raises(RuntimeError):
        with MemoryCgroup("test") as cg:
            path = cg.path
            assert path is not None and path.is_dir()
            raise RuntimeError("boom")
    assert not path.exists()


def test_a_hybrid_host_makes_its_cgroup_in_the_v1_memory_hierarchy(tmp_path, monkeypatch):
    # A systemd-hybrid host (synthetic files in the kernel's format): the unified hierarchy,
    # without the memory controller, is mounted before the v1 memory one. The measurement's
    # cgroup goes under the v1 memory cgroup, not to "in place".
    import functools

    import autotune.cgroups as cgroups

    base = tmp_path / "sys/fs/cgroup"
    (base / "unified/user.slice/session-3.scope").mkdir(parents=True)
    (base / "unified/cgroup.controllers").write_text("\n")
    own = base / "memory/user.slice/session-3.scope"
    own.mkdir(parents=True)
    (own / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (tmp_path / "cgroup").write_text("4:memory:/user.slice/session-3.scope\n"
                                     "1:name=systemd:/user.slice/session-3.scope\n"
                                     "0::/user.slice/session-3.scope\n")
    (tmp_path / "mountinfo").write_text(
        f"26 25 0:23 / {base}/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 "
        "cgroup2 rw,nsdelegate\n"
        f"31 25 0:28 / {base}/memory rw,nosuid,nodev,noexec,relatime shared:15 - cgroup "
        "cgroup rw,memory\n")
    monkeypatch.setattr(cgroups, "cgroup_dirs", functools.partial(
        cgroups.cgroup_dirs, cgroup_file=tmp_path / "cgroup",
        mountinfo_file=tmp_path / "mountinfo"))
    with MemoryCgroup("test") as cg:
        assert cg.kind == "v1" and cg.path is not None and cg.path.parent == own
        assert cg.home == own
    assert [p.name for p in own.iterdir()] == ["memory.limit_in_bytes"]  # removed after


def test_a_sample_of_a_table_is_the_sample_of_the_same_list():
    from autotune.probe.hitrate import _sample
    from autotune_base.pathtable import PathTable

    t = PathTable("/d")
    for i in range(1000):
        t.append(f"f{i}", 1000 + i)
    as_list = list(t)
    assert _sample(t, 100_000, seed=3) == _sample(as_list, 100_000, seed=3)
    picked, sampled = _sample(t, 100_000, seed=3)
    assert sampled and 100_000 <= sum(n for _, n in picked) < 100_000 + 2000
    assert _sample(t, 10**9, seed=3) == (as_list, False)
