"""The Lightning callback writes the step log of `autotune.instrument`: a real Trainer fit
on the CPU, its log read by `autotune analyze` (format `own`); the fallback timing from
the hooks alone, driven with Lightning's hook signatures; the one line without Lightning."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from autotune.analyze import analyze

REPO = Path(__file__).resolve().parents[2]
DATA_S = 0.012      # per sample: a batch of 4 takes ~48 ms to load
STEP_S = 0.1        # the training step: apart from a fetch by more than noise moves
VAL_S = 0.5        # one validation run (two batches)


def _records(path: Path) -> tuple[list[dict], list[dict]]:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return [x for x in lines if "autotune" in x], [x for x in lines if "wait_s" in x]


def _fit(log: Path, *, iterable: bool, max_steps: int, val_every: int | None = None):
    L = pytest.importorskip("lightning.pytorch", reason="Lightning is not installed "
                            "(pip install 'autotune-loader[lightning]'; scripts/setup does)")
    import torch
    from torch.utils.data import DataLoader, Dataset, IterableDataset

    from autotune.integrations.lightning import InstrumentCallback

    class Slow(Dataset):
        def __len__(self) -> int:
            return 24

        def __getitem__(self, i: int):
            time.sleep(DATA_S)
            return torch.full((3, 8, 8), float(i)), i % 2

    class SlowStream(IterableDataset):
        def __iter__(self):
            for i in range(24):
                time.sleep(DATA_S)
                yield torch.full((3, 8, 8), float(i)), i % 2

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(3 * 8 * 8, 2)

        def training_step(self, batch, batch_idx):
            x, y = batch
            time.sleep(STEP_S)
            return torch.nn.functional.cross_entropy(self.net(x.flatten(1)), y)

        def validation_step(self, batch, batch_idx):
            time.sleep(VAL_S / 2)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    ds = SlowStream() if iterable else Slow()
    train = DataLoader(ds, batch_size=4, num_workers=0)
    val = DataLoader(Slow(), batch_size=12) if val_every else None
    cb = InstrumentCallback(log=log)
    trainer = L.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[cb], num_sanity_val_steps=0,
                        val_check_interval=val_every, limit_val_batches=2 if val_every else 0)
    trainer.fit(Tiny(), train, val)
    return cb


def test_a_real_fit_writes_the_step_log_that_analyze_reads(tmp_path):
    log = tmp_path / "steps.jsonl"
    cb = _fit(log, iterable=False, max_steps=9, val_every=3)   # 6 batches an epoch: 2 epochs
    headers, recs = _records(log)
    assert len(headers) == 1
    h = headers[0]
    assert h["recorder"] == "lightning" and h["wait_from"] == "fetch", h
    assert h["loader"]["batch_size"] == 4 and h["loader"]["num_workers"] == 0
    assert h["loader"]["dataset"]["len"] == 24 and h["cores"] >= 1
    assert [(r["epoch"], r["step"]) for r in recs] == [(0, i) for i in range(6)] + [(1, i) for i in range(3)]
    # The run's first fetch also pays one-off costs (the loader's first iterator, lazy
    # imports, under pytest its warning capture): bounded loosely, the others tightly.
    assert 4 * DATA_S * 0.9 <= recs[0]["wait_s"] <= 2.0, recs[0]
    for r in recs[1:]:
        # the fetch of 4 samples at 12 ms, never a validation run (0.5 s) nor the step
        assert 4 * DATA_S * 0.9 <= r["wait_s"] <= VAL_S / 2, r
    for r in recs:
        assert r["step_s"] >= STEP_S * 0.9 and r["batch"] == 4, r
    # the median fetch holds no step: halfway between a fetch (48 ms) and a fetch and a step
    assert sorted(r["wait_s"] for r in recs)[4] <= 4 * DATA_S + STEP_S / 2, recs
    # validation after steps 2 and 5 of epoch 0 (val_check_interval=3) is in their step_s
    long = [(r["epoch"], r["step"]) for r in recs if r["step_s"] >= VAL_S * 0.9]
    assert (0, 2) in long and (0, 5) in long, recs
    ts = [r["t"] for r in recs]
    assert ts == sorted(ts) and abs(ts[0] - time.time()) < 120
    s = cb.summary()
    assert s.steps == 9 and s.epochs == 2 and s.samples == 36 and s.lost_lines == 0

    a = analyze(log, warmup=0)
    assert a.format == "own" and a.steps == 9 and a.batch_size == 4
    wait = sum(r["wait_s"] for r in recs)
    wall = wait + sum(r["step_s"] for r in recs)
    assert a.data_time_share == pytest.approx(wait / wall, rel=0.02)
    assert a.loader["num_workers"] == 0


def test_an_iterable_dataset_fetched_ahead_still_times_every_step(tmp_path):
    # Lightning fetches one batch ahead of an IterableDataset (to know the last one):
    # before each step the loop blocks for the batch after it, and before the last for
    # none. The very first fetch, made before Lightning times fetches, is not in the log.
    log = tmp_path / "steps.jsonl"
    _fit(log, iterable=True, max_steps=6)
    _, recs = _records(log)
    assert [r["step"] for r in recs] == list(range(6))
    one = 4 * DATA_S
    assert one * 0.9 <= recs[0]["wait_s"] <= 2.0, recs[0]
    for r in recs[1:5]:
        assert one * 0.9 <= r["wait_s"] <= VAL_S / 2, r
    assert recs[5]["wait_s"] < one / 2, recs[5]
    for r in recs:
        assert r["step_s"] >= STEP_S * 0.9, r
    assert analyze(log, warmup=0).steps == 6


def test_hooks_alone_time_the_gap_between_steps(tmp_path, monkeypatch):
    """A stand-in trainer whose profiler never reports a fetch: the wait is the gap from
    one step's end (or a validation's end) to the next step's start, as documented. The
    callback's clock is a stand-in too, so the figures are exact on any machine (the
    real fits above time real sleeps)."""
    pytest.importorskip("lightning.pytorch", reason="Lightning is not installed")
    import autotune.integrations.lightning as mod
    from autotune.integrations.lightning import InstrumentCallback

    now = [1000.0]
    monkeypatch.setattr(mod, "time", SimpleNamespace(
        perf_counter=lambda: now[0], time=time.time, monotonic=time.monotonic))

    def spend(seconds: float) -> None:
        now[0] += seconds

    log = tmp_path / "s.jsonl"
    trainer = SimpleNamespace(global_rank=1, world_size=2, current_epoch=0, profiler=None,
                              train_dataloader=SimpleNamespace(batch_size=2, num_workers=3))
    cb = InstrumentCallback(log=tmp_path / "s{rank}.jsonl")
    cb.setup(trainer, None, "fit")
    spend(5.0)                                             # before the epoch: not a wait
    cb.on_train_epoch_start(trainer, None)
    for i in range(3):
        spend(0.04)                                        # the data wait
        batch = [[0, 0]]                                   # no tensors: batch from the loader?
        cb.on_train_batch_start(trainer, None, batch, i)
        spend(0.02)                                        # the step
        cb.on_train_batch_end(trainer, None, None, batch, i)
        if i == 1:
            spend(0.1)                                     # a validation run
            cb.on_validation_end(trainer, None)
    spend(0.03)                                            # the fetch that finds the end
    cb.on_train_epoch_end(trainer, None)
    cb.teardown(trainer, None, "fit")
    log = tmp_path / "s1.jsonl"                            # "{rank}": rank 1 of 2
    assert cb.path == str(log)
    headers, recs = _records(log)
    assert headers[0]["wait_from"] == "hooks" and headers[0]["rank"] == 1
    assert headers[0]["world_size"] == 2 and headers[0]["loader"]["num_workers"] == 3
    assert [r["rank"] for r in recs] == [1, 1, 1] and "batch" not in recs[0]
    assert [r["wait_s"] for r in recs] == pytest.approx([0.04, 0.04, 0.04], abs=1e-6), recs
    # a step runs to the next step's request: the validation is in step 1's time, and
    # the last step ends where the epoch ended
    assert [r["step_s"] for r in recs] == pytest.approx([0.02, 0.12, 0.05], abs=1e-6), recs
    assert cb.summary().steps == 3 and cb.summary().samples is None


def test_without_lightning_one_line_names_the_extra():
    code = ("import sys\n"
            "for m in ('lightning', 'lightning.pytorch', 'pytorch_lightning'):\n"
            "    sys.modules[m] = None\n"
            "try:\n"
            "    import autotune.integrations.lightning\n"
            "except ImportError as e:\n"
            "    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout.strip()
    assert "\n" not in out and "pip install 'autotune-loader[lightning]'" in out, out


def test_autotune_dataloader_in_a_real_fit_serves_every_sample_once_an_epoch(tmp_path,
                                                                          monkeypatch):
    """`trainer.fit(model, autotune.DataLoader(...))` as a user writes it, with the release
    of Lightning that pip installs: Lightning iterates autotune's loader as it is (it
    re-creates only torch DataLoaders), the loader starts its workers and tunes, every
    sample is trained on once per epoch, and the callback logs the loader it ran."""
    L = pytest.importorskip("lightning.pytorch", reason="Lightning is not installed "
                            "(pip install 'autotune-loader[lightning]'; scripts/setup does)")
    import torch
    from torch.utils.data import TensorDataset

    import autotune
    from autotune.integrations.lightning import InstrumentCallback

    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path / "cache"))   # not the user's
    seen: list[list[int]] = [[], []]

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(1, 2)

        def training_step(self, batch, batch_idx):
            x, y = batch
            seen[self.current_epoch].extend(int(v) for v in x[:, 0])
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    ds = TensorDataset(torch.arange(48, dtype=torch.float32)[:, None], torch.arange(48) % 2)
    loader = autotune.DataLoader(ds, batch_size=4, shuffle=True, key="lightning-test",
                                 generator=torch.Generator().manual_seed(0))
    log = tmp_path / "steps.jsonl"
    cb = InstrumentCallback(log=log)
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[cb])
    try:
        trainer.fit(Tiny(), loader)
    finally:
        loader.close()
    assert trainer.train_dataloader is loader
    assert [sorted(s) for s in seen] == [list(range(48))] * 2
    assert seen[0] != seen[1]    # shuffled, a new order each epoch
    headers, recs = _records(log)
    h = headers[0]
    assert h["wait_from"] == "fetch" and h["loader"]["type"] == "DataLoader", h
    assert h["loader"]["batch_size"] == 4 and h["loader"]["num_workers"] >= 0
    assert len(recs) == 24 and cb.summary().samples == 96
    assert set(loader.tuned_kwargs) <= {"num_workers", "prefetch_factor", "persistent_workers"}
