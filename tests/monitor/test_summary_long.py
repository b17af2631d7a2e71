"""The monitor's running summary over a long run: bounded memory, figures still right.

The monitor kept every figure's every number (8 bytes each, 15 figures, 2 samples a
second: 20 MB a day, 145 MB a week, in the job's own memory limit). Past EXACT_SAMPLES
they go into a log-bucketed histogram instead, whose size does not grow with the run."""

from __future__ import annotations

import math
import random
import tracemalloc

import numpy as np
import pytest

from autotune.monitor.summary import EXACT_SAMPLES, RELATIVE_ERROR, RunningSummary


class _Sample:
    """What RunningSummary reads of a monitor Sample: its times and its dict."""

    interval_s = 0.5

    def __init__(self, i: int, disk: dict, cpu: dict) -> None:
        self.monotonic = 0.5 * (i + 1)
        self._d = {"disk": disk, "cpu": cpu}

    def to_dict(self) -> dict:
        return self._d


def _figures(n: int) -> dict[str, list[float]]:
    rng = random.Random(31)
    return {"disk.reads_per_s": [rng.lognormvariate(6, 1) for _ in range(n)],  # spread wide
            "cpu.total_pct": [min(100.0, rng.gauss(60, 15)) for _ in range(n)],
            "cpu.iowait_pct": [0.0 if i % 3 else rng.random() * 5 for i in range(n)]}


def _feed(seen: dict[str, list[float]]) -> RunningSummary:
    run = RunningSummary()
    reads, total, iowait = seen["disk.reads_per_s"], seen["cpu.total_pct"], seen["cpu.iowait_pct"]
    for i in range(len(reads)):
        run.add(_Sample(i, {"available": True, "reads_per_s": reads[i]},
                        {"available": True, "total_pct": total[i], "iowait_pct": iowait[i]}))
    return run


def test_a_short_run_is_summarised_exactly():
    seen = _figures(1000)
    run = _feed(seen)
    figs = run.result()["figures"]
    for key, vals in seen.items():
        assert figs[key]["median"] == pytest.approx(float(np.percentile(vals, 50)), abs=1e-12)
        assert figs[key]["p95"] == pytest.approx(float(np.percentile(vals, 95)), abs=1e-12)
        assert figs[key]["max"] == max(vals) and figs[key]["n"] == 1000


@pytest.mark.slow
def test_a_long_run_keeps_bounded_memory_and_figures_within_the_relative_error():
    n = 3 * EXACT_SAMPLES             # 27 hours at 0.5 s
    seen = _figures(n)
    tracemalloc.start()
    run = _feed(seen)
    held = tracemalloc.get_traced_memory()[0]   # what the summary keeps: the samples go
    tracemalloc.stop()
    # The three figures' numbers alone, 8 bytes each, would be 4.5 MiB.
    assert held < 1 << 20, held
    figs = run.result()["figures"]
    for key, vals in seen.items():
        f = figs[key]
        assert f["max"] == max(vals) and f["n"] == n
        for q, name in ((50, "median"), (95, "p95")):
            want = float(np.percentile(vals, q))
            tol = 2 * RELATIVE_ERROR * want if want else 0.0
            assert math.isclose(f[name], want, abs_tol=tol + 1e-9), (key, name, f[name], want)
