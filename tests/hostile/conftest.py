"""The hostile-input suite: datasets, shards and logs written by a stranger.

Property-based (hypothesis): manifests, tar shards, LMDB values and log lines are generated
from the formats' grammars and mutated, and each case is checked against the promises:
nothing written outside DST, bounded memory, no exception outside autotune's tree, the same
answer twice. `HYPOTHESIS_PROFILE=long` (scripts/fuzz_hostile.py) runs many more cases.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, settings  # noqa: E402

_common = dict(deadline=None, derandomize=False, print_blob=True,
               suppress_health_check=[HealthCheck.function_scoped_fixture,
                                      HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=int(os.environ.get("HOSTILE_EXAMPLES", "40")),
                          **_common)
settings.register_profile("long", max_examples=int(os.environ.get("HOSTILE_EXAMPLES", "2000")),
                          **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def small_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 small JPEGs in 3 classes: the good dataset the hostile ones are made from."""
    from autotune.synth import make_image_folder

    root = tmp_path_factory.mktemp("hostile-src") / "train"
    make_image_folder(root, 12, 3, seed=5, workers=1)
    return root


@pytest.fixture(scope="session")
def conversions(tmp_path_factory: pytest.TempPathFactory, small_images: Path) -> dict[str, Path]:
    """A real WebDataset and a real LMDB conversion of `small_images`."""
    from autotune_converters.conversion import ConvertOptions, convert

    base = tmp_path_factory.mktemp("hostile-conv")
    out = {}
    for fmt in ("wds", "lmdb"):
        convert(small_images, base / fmt, ConvertOptions(format=fmt, workers=1))
        out[fmt] = base / fmt
    return out
