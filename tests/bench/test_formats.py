"""bench reads what `autotune convert` writes, through the same pipeline (both formats)."""

from __future__ import annotations

import pytest

from autotune.bench.config import BenchConfig
from autotune.bench.runner import run_bench
from autotune_converters.registry import open_source


@pytest.fixture(params=["lmdb", "wds"])
def converted(request, small_dataset, tmp_path_factory):
    from autotune_converters import ConvertOptions, convert

    dst = tmp_path_factory.mktemp("conv") / request.param
    convert(small_dataset, dst, ConvertOptions(format=request.param, workers=1, readers=2))
    return request.param, dst


def test_auto_format_reads_the_manifest(converted):
    fmt, dst = converted
    src = open_source(dst)
    assert src.format == fmt and len(src) == 64 and len(src.classes) == 4


@pytest.mark.slow
def test_bench_measures_a_conversion(converted):
    fmt, dst = converted
    cfg = BenchConfig.from_preset("decode-only", batch_size=4, num_workers=2, prefetch_factor=2,
                                  seconds=1.0, warmup_batches=1, cold=True)
    r = run_bench(dst, cfg)
    assert not r.failed, (r.reason, r.hint)
    assert r.dataset["format"] == fmt
    assert r.images_per_s and r.images_per_s > 0
    # The conversion's reader times its stages like the folder's (a tar member's read or
    # an LMDB value, the decode, the transform, the collate).
    assert r.stages and r.stages["samples"] > 0 and all(v > 0 for v in r.stages["seconds"].values())
