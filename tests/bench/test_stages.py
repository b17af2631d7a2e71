"""The pipeline's own stage budget (autotune.data.stages): each loading process times its
samples' read, decode and transform and its batches' collate into its own row of a shared
file; the window's budget is the difference of two sums. Counts are asserted exactly;
times only from below (a sleep in the read is at least its length: a busy machine can
only add to it)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch.utils.data

from autotune.bench.config import BenchConfig
from autotune.bench.runner import run_bench
from autotune.data.stages import STAGES, StageClock, stage_budget, stage_line
from autotune.data.torchds import ImageDataset
from autotune.data.transforms import TransformSpec, build_transform
from autotune_converters.folder import FolderSource

READ_SLEEP_S = 0.02


class SlowFolder(FolderSource):
    """A folder whose every read takes at least READ_SLEEP_S (a slow disk)."""

    def read(self, index: int):
        time.sleep(READ_SLEEP_S)
        return super().read(index)


@pytest.mark.parametrize("context", [None, "spawn"])
def test_every_loading_process_times_each_of_its_samples(small_dataset: Path, tmp_path: Path,
                                                         context: str | None) -> None:
    workers = 2
    clock = StageClock.create(tmp_path / "stages.bin", workers)
    ds = ImageDataset(SlowFolder(small_dataset), build_transform(TransformSpec(resize=64, crop=56)),
                      stage_clock=clock)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=4, num_workers=workers, multiprocessing_context=context,
        collate_fn=clock.timed_collate(torch.utils.data.default_collate))
    before = clock.totals()
    n = sum(len(y) for _, y in loader)
    t = clock.totals()
    assert n == 64 and t["samples"] == 64 and t["batches"] == 16, t
    assert t["read"] >= 64 * READ_SLEEP_S, t
    assert all(t[s] > 0 for s in STAGES), t
    b = stage_budget(before, t, workers=workers, wall_s=10.0)
    assert b is not None and b["samples"] == 64 and b["workers"] == workers
    assert abs(sum(b["share"].values()) - 1) < 1e-9
    assert b["ms_per_sample"]["read"] >= 1000 * READ_SLEEP_S
    assert "the 2 workers were in the pipeline" in stage_line(b)


def test_without_workers_the_main_process_row_counts() -> None:
    # A plain in-process loop: row 0.
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        clock = StageClock.create(Path(d) / "c.bin", 0)
        clock.add(read=0.5, decode=0.25, transform=0.25, samples=10)
        clock.add(collate=0.1, batches=2)
        b = stage_budget({}, clock.totals(), workers=0, wall_s=2.0)
        assert b["samples"] == 10 and b["batches"] == 2
        assert b["share"]["read"] == pytest.approx(0.5 / 1.1)
        assert b["ms_per_sample"]["read"] == pytest.approx(50.0)
        assert b["collate_ms_per_batch"] == pytest.approx(50.0)
        assert b["busy"] == pytest.approx(1.1 / 2.0)
        assert "the main process (no workers) was in the pipeline 55%" in stage_line(b)
        # Nothing timed between two readings: no budget, not a budget of zeros.
        assert stage_budget(clock.totals(), clock.totals(), workers=0, wall_s=1.0) is None


def test_a_clock_file_that_is_not_one_is_refused(tmp_path: Path) -> None:
    (tmp_path / "c.bin").write_bytes(b"x" * 10)
    with pytest.raises(FileExistsError):
        StageClock.create(tmp_path / "c.bin", 1)   # never written over
    with pytest.raises(ValueError, match="not a stage clock of 2 rows"):
        StageClock(str(tmp_path / "c.bin"), 2).totals()
    with pytest.raises(ValueError, match="0 to 1024 workers, but got -1"):
        StageClock.create(tmp_path / "d.bin", -1)


def test_bench_reports_the_window_stage_budget(small_dataset: Path, no_leftovers) -> None:
    cfg = BenchConfig.from_preset("decode-only", num_workers=2, prefetch_factor=2, batch_size=4,
                                  seconds=1.5, warmup_batches=2, cold=False)
    r = run_bench(small_dataset, cfg)
    assert not r.failed, r.reason
    b = r.to_dict()["stages"]
    assert b is not None and b["workers"] == 2 and set(b["share"]) == set(STAGES)
    # The samples timed in the window are those delivered in it, give or take what the
    # prefetch queue and the batches in the making hold at its two ends.
    slack = (cfg.prefetch_queue + cfg.num_workers) * cfg.batch_size
    assert abs(b["samples"] - r.window["samples"]) <= slack, (b["samples"], r.window)
    assert all(b["seconds"][s] > 0 for s in STAGES), b
    from rich.console import Console

    from autotune.cli.tables.bench import bench_renderable

    con = Console(width=200, record=True)
    con.print(bench_renderable(r))
    assert "pipeline stages (autotune's own" in con.export_text()
    no_leftovers(r)
