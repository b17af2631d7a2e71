"""A small Lightning fit for the analysis set-ups: a tiny CNN on the CPU over generated
JPEGs, a training and a validation DataLoader with persistent_workers (as Lightning users
set them), validation every epoch and `num_sanity_val_steps` batches of it before
training starts, the step log written by autotune's InstrumentCallback (to
$AUTOTUNE_STEPS_LOG under `autotune monitor`).

    python tests/analyze/lightning_loop.py --dataset D --workers 2 --val-workers 2 --epochs 6
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's autotune

import lightning  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from autotune.data import build_transform, load_preset, open_source  # noqa: E402
from autotune.data.torchds import ImageDataset  # noqa: E402
from autotune.integrations.lightning import InstrumentCallback  # noqa: E402


class Tiny(lightning.LightningModule):
    def __init__(self, step_s: float) -> None:
        super().__init__()
        self.step_s = step_s
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2)
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, size=32)               # a cheap step, whatever the crop
        return self.fc(F.adaptive_avg_pool2d(F.relu(self.conv(x)), 1).flatten(1))

    def training_step(self, batch, i):
        if self.step_s:
            time.sleep(self.step_s)                 # the emulated accelerator's step
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch, i):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _loader(path: str, preset: str, workers: int, batch: int, shuffle: bool) -> DataLoader:
    ds = ImageDataset(open_source(path), build_transform(load_preset(preset).transform))
    return DataLoader(ds, batch_size=batch, shuffle=shuffle, num_workers=workers,
                      persistent_workers=workers > 0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--val-workers", type=int, default=2)
    ap.add_argument("--sanity", type=int, default=2, help="num_sanity_val_steps")
    ap.add_argument("--preset", default="heavy-augment")
    ap.add_argument("--val-preset", default="decode-only")
    ap.add_argument("--step-ms", type=float, default=0.0)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--cpus", type=int, default=0, help="run on the first N usable CPUs")
    ap.add_argument("--devices", type=int, default=1,
                    help="ranks on this node (over 1: DDP, Lightning running this script "
                         "again for each further rank)")
    a = ap.parse_args()
    if a.cpus:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:a.cpus])  # workers inherit it
    torch.set_num_threads(1)
    torch.manual_seed(0)
    train = _loader(a.dataset, a.preset, a.workers, a.batch_size, True)
    val = _loader(a.dataset, a.val_preset, a.val_workers, a.batch_size, False)
    trainer = lightning.Trainer(max_epochs=a.epochs, accelerator="cpu", devices=a.devices,
                                strategy="ddp" if a.devices > 1 else "auto",
                                logger=False, enable_checkpointing=False,
                                num_sanity_val_steps=a.sanity, limit_val_batches=4,
                                enable_progress_bar=False, callbacks=[InstrumentCallback()])
    trainer.fit(Tiny(a.step_ms / 1000.0), train, val)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
