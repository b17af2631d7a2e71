"""A small training loop for the analysis tests: a real DataLoader with real worker
processes over generated JPEGs, an emulated step (time.sleep: the accelerator is busy, the
CPU is free), instrumented with autotune.instrument (the step log goes where
$AUTOTUNE_STEPS_LOG says: `autotune monitor` sets it).

It also prints pytorch/examples-style progress lines every --print-freq steps, so one
run feeds both the own-format and the imagenet parser.

    python tests/analyze/train_loop.py --dataset D --workers 2 --step-ms 100 --steps 40
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's autotune

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import autotune  # noqa: E402
from autotune.data import build_transform, load_preset, open_source  # noqa: E402
from autotune.data.torchds import ImageDataset  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--prefetch", type=int, default=2)
    ap.add_argument("--step-ms", type=float, default=100.0)
    ap.add_argument("--preset", default="resnet50")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--print-freq", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--val-workers", type=int, default=0,
                    help="also a validation DataLoader with N kept workers (persistent_workers), "
                         "run for 2 batches, then 0.3 s until training starts (as "
                         "Lightning's sanity check does: its training loader forked 0.34 s "
                         "after the validation loader's): its workers then sit idle beside the "
                         "training loader's, as a validation loader's do through each epoch")
    ap.add_argument("--cpus", type=int, default=0,
                    help="run on the first N CPUs of this process's affinity (0: all): the "
                         "set-ups then mean the same on a 2-core VM and a 64-core server")
    a = ap.parse_args()
    if a.cpus:
        import os

        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:a.cpus])  # workers inherit it

    torch.manual_seed(a.seed)
    ds = ImageDataset(open_source(a.dataset), build_transform(load_preset(a.preset).transform))
    kw = {"prefetch_factor": a.prefetch} if a.workers > 0 else {}
    loader = DataLoader(ds, batch_size=a.batch_size, shuffle=True, num_workers=a.workers,
                        drop_last=True, **kw)
    if a.val_workers:
        val = DataLoader(ds, batch_size=a.batch_size, num_workers=a.val_workers,
                         persistent_workers=True)
        for i, _ in enumerate(val):
            if i == 1:
                break
        time.sleep(0.3)
    steps = autotune.instrument(loader)
    done, epoch = 0, 0
    while done < a.steps:
        end = time.time()
        for i, (images, labels) in enumerate(steps):
            data_t = time.time() - end
            time.sleep(a.step_ms / 1000.0)          # the emulated training step
            done += 1
            if i % a.print_freq == 0:
                print(f"Epoch: [{epoch}][{i + 1:3d}/{len(loader)}]\tTime {time.time() - end:6.3f} "
                      f"({0.0:6.3f})\tData {data_t:6.3f} ({0.0:6.3f})\tLoss 0.0e+00 (0.0e+00)",
                      flush=True)
            if done >= a.steps:
                break
            end = time.time()
        epoch += 1
    steps.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
