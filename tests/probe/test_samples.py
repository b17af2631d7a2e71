"""The storage ceiling of a conversion: samples/s read cold through its format's reader
(bytes only), not the files/s of its shard files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune.probe import probe
from autotune.probe.samples import sample_replay
from autotune_converters import ConvertOptions, convert, open_source


@pytest.fixture(scope="module", params=["wds", "lmdb"])
def conversion(request, small_dataset, tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("conv") / request.param
    convert(small_dataset, dst, ConvertOptions(format=request.param, shard_size=1 << 20,
                                               readers=4))
    return dst


def test_every_sample_is_read_through_the_reader(conversion: Path) -> None:
    src = open_source(conversion)
    r = sample_replay(src, concurrency=(1, 2), seconds_per_level=30)
    assert r.format == conversion.name and r.samples_total == 64
    for lv in r.by_concurrency:
        assert lv.samples == 64 and lv.errors == 0 and lv.bytes > 64 * 10_000
        assert lv.samples_per_s == pytest.approx(lv.samples / lv.seconds)
    assert r.cold_method == ("drop_caches" if os.geteuid() == 0 else "fadvise")


def test_probe_of_a_conversion_gives_samples_not_files(conversion: Path) -> None:
    # Before: "cold replay of N files" read the shard files (and manifest.json) and its
    # files/s became the storage ceiling in images/s.
    res = probe(conversion, run_fio=False, replay_seconds=2, concurrency=(1, 4))
    v = res.to_dict()["verdict"]
    assert res.samples is not None and v["storage_samples_per_s"] == pytest.approx(
        res.samples.best.samples_per_s, rel=1e-3)
    assert res.replay is not None and res.replay.files_sampled < 64   # the files are fewer
    assert "samples/s" in v["evidence"][0] and "not its shard files" not in v["evidence"][0]


def test_the_search_ceiling_of_a_conversion_is_in_samples(conversion: Path) -> None:
    from autotune.search.ceilings import measure

    res = probe(conversion, run_fio=False, replay_seconds=1, concurrency=(1,))
    c = measure(transform=lambda b: b, blobs=[b"x"], batch_size=4, compute_ms=10, probe=res,
                decode_seconds=0.1, samples=64)
    assert c.storage_unit == "samples/s" and c.storage == res.samples.best.samples_per_s
    assert any("read cold through its reader" in e for e in c.evidence)
