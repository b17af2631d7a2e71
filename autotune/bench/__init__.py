"""`autotune bench`: one DataLoader configuration, measured honestly.

Fresh process per run (a hard timeout; the whole process group is killed and checked
afterwards), cold page cache by default, warm-up excluded, an emulated step (a sleep of
compute_ms per batch) or the user's own, windows with a median and a spread, and the
system monitor watching from the parent.

    from autotune.bench import BenchConfig, run_bench
    res = run_bench("/data/train", BenchConfig.from_preset("resnet50", num_workers=8))
    res.images_per_s, res.au, res.to_dict()
"""

from autotune.bench.config import DEFAULT_PRESET, BenchConfig
from autotune.bench.result import BenchResult
from autotune.bench.runner import run_bench

__all__ = ["BenchConfig", "BenchResult", "DEFAULT_PRESET", "run_bench"]
