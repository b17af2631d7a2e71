"""BenchConfig validation and the window arithmetic (pure, no processes)."""

from __future__ import annotations

import pytest

from autotune.bench import BenchConfig
from autotune.bench.stats import Batch, split_windows, window_figures
from autotune.errors import UsageError


def test_from_preset_and_overrides() -> None:
    c = BenchConfig.from_preset("resnet50", num_workers=8, batch_size=None)
    assert (c.batch_size, c.num_workers, c.prefetch_factor, c.preset) == (256, 8, 2, "resnet50")
    assert c.effective_warmup == 16  # every batch requested at loader start
    z = BenchConfig.from_preset("resnet50", num_workers=0).validate()
    assert z.prefetch_factor is None and z.effective_warmup == 5
    s = BenchConfig.from_preset("resnet50", step="m:f")
    assert s.compute_ms == 0 and s.has_step
    assert BenchConfig.from_dict(c.to_dict()) == c


@pytest.mark.parametrize("kw, msg", [
    ({"prefetch_factor": 0}, "prefetch_factor must be at least 1, but got 0."),
    ({"num_workers": 0, "prefetch_factor": 2}, "prefetch_factor=2 needs num_workers > 0"),
    ({"num_workers": 0, "persistent_workers": True}, "persistent_workers needs num_workers > 0"),
    ({"num_workers": -1}, "num_workers must be at least 0, but got -1."),
    ({"batch_size": 0}, "batch_size must be at least 1, but got 0."),
    ({"seconds": 0}, "seconds must be positive, but got 0."),
    ({"compute_ms": -1}, "compute_ms must be a number >= 0, but got -1."),
    ({"step": "nocolon"}, "step must be 'module:function'"),
    ({"step": "m:f", "compute_ms": 5}, "either compute_ms .* or step"),
    ({"format": "tar"}, "format must be one of auto, folder, lmdb, wds"),
    ({"timeout_s": 5, "seconds": 10}, r"timeout_s \(5 s\) must be longer"),
    ({"max_open_files": 3}, "max_open_files must be at least 8"),
    ({"in_memory": 100}, "in_memory reads no storage, so it cannot be cold"),
])
def test_validation_messages(kw: dict, msg: str) -> None:
    with pytest.raises(UsageError, match=msg):
        BenchConfig.from_preset("resnet50", **kw).validate()


def test_split_windows() -> None:
    assert split_windows(10, 5) == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]
    assert split_windows(5, 5) == [(0, 2), (2, 5)]  # at least two batches per window
    assert split_windows(1, 5) == [(0, 1)]
    assert sum(b - a for a, b in split_windows(37, 5)) == 37


def test_window_figures_from_known_timings() -> None:
    # 10 batches of 4 samples: 30 ms wait then 70 ms step, back to back from t=100.
    t, batches = 100.0, []
    for _ in range(10):
        t += 0.1
        batches.append(Batch(wait_s=0.03, step_s=0.07, samples=4, end=t))
    f = window_figures(batches, start=100.0, windows=5)
    assert f.images_per_s == pytest.approx(40.0)
    assert f.images_per_s_overall == pytest.approx(40.0)
    assert f.data_wait_fraction == pytest.approx(0.3)
    assert f.step_fraction == pytest.approx(0.7)
    assert f.wait_ms_p50 == pytest.approx(30.0) and f.step_ms_p95 == pytest.approx(70.0)
    assert f.spread == pytest.approx(0.0)


def test_a_stall_counts_in_the_figure_the_median_is_only_beside_it() -> None:
    # A disk that serves in bursts: the sub-windows' median hides the stall, the figure
    # (the whole window, DESIGN.md) does not.
    t, batches = 0.0, []
    for i in range(10):
        t += 2.0 if i == 3 else 0.1  # one 2 s stall in the second window
        batches.append(Batch(0.0, 0.0, 10, t))
    f = window_figures(batches, start=0.0, windows=5)
    assert f.images_per_s == pytest.approx(100 / 2.9)
    assert f.images_per_s_median == pytest.approx(100.0)
    assert f.spread > 0.9


def test_the_window_follows_from_a_long_step_and_the_queue() -> None:
    # A heavy model's step: 3 s per batch of 64. The window must hold the warm-up and the
    # batches a figure needs at the demand rate: (warm-up + max(10, 2 x queue)) x step.
    c = BenchConfig.from_preset("resnet50", compute_ms=3000, batch_size=64, num_workers=2,
                                prefetch_factor=2).validate()
    assert (c.effective_warmup, c.min_batches) == (5, 10)
    assert c.window_needed_s == pytest.approx(45.0) and c.seconds == 45.0
    deep = BenchConfig.from_preset("resnet50", compute_ms=3000, batch_size=64, num_workers=8,
                                   prefetch_factor=4)
    assert (deep.effective_warmup, deep.min_batches) == (32, 64)
    assert deep.seconds == 288.0 and deep.effective_timeout >= 288 * 2
    # Whole seconds, rounded up; a short step keeps the default (or the caller's).
    odd = BenchConfig.from_preset("resnet50", compute_ms=1234, num_workers=2)
    assert odd.window_needed_s == pytest.approx(15 * 1.234) and odd.seconds == 20.0
    assert BenchConfig.from_preset("resnet50", num_workers=2).seconds == 20.0
    assert BenchConfig.from_preset("resnet50", num_workers=2, compute_ms=1234,
                                   default_seconds=10.0).seconds == 19.0
    assert BenchConfig.from_preset("resnet50", num_workers=2, default_seconds=10).seconds == 10
    # No emulated step (the loader alone, or a real step not yet timed): nothing to follow.
    assert BenchConfig.from_preset("decode-only").window_needed_s is None
    assert BenchConfig.from_preset("resnet50", step="m:f").window_needed_s is None
    # Its own warm-up setting counts: one warm-up batch, ten measured.
    one = BenchConfig.from_preset("resnet50", compute_ms=3000, num_workers=2, warmup_batches=1)
    assert one.seconds == 33.0


def test_a_given_window_too_short_for_the_step_is_refused_in_one_line() -> None:
    c = BenchConfig.from_preset("resnet50", compute_ms=3000, batch_size=64, num_workers=2,
                                prefetch_factor=2, seconds=10)
    with pytest.raises(UsageError) as e:
        c.validate()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("--seconds 10 is too short for a 3000 ms step")
    assert "5 warm-up + 10 measured batches" in msg and "give --seconds 45 or more" in msg
    assert "21.3 images/s" in msg
    assert BenchConfig.from_preset("resnet50", compute_ms=3000, batch_size=64, num_workers=2,
                                   seconds=45).validate().seconds == 45
    assert c.short_window(60) is None
    assert "--confirm-seconds 30 is too short" in c.short_window(30, "--confirm-seconds")
