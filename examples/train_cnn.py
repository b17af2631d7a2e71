"""A short real training job: a small CNN on an image folder, fed by the DataLoader
settings a search recommended, its data wait recorded by `autotune.instrument`.

    autotune search DATA --out OUT                       # writes OUT/search.json
    python examples/train_cnn.py DATA --search-json OUT/search.json --steps 200
    autotune analyze steps.jsonl                         # what the loop waited for

Its training step is also what `autotune bench` can measure in place of the emulated one:

    autotune bench DATA --step examples/train_cnn.py:step --batch-size 64

`step(batch)` takes `(images float32 [B, 3, H, W], labels int64 [B])`, as the bench's
presets make them, and creates the model and optimizer on its first call (the bench
imports this file before it measures). It runs on CUDA where there is one (copies with
`non_blocking=True`, which overlap only from pinned memory: `pin_memory=True`), else on
the CPU (with half the torch threads: the workers need cores too);
TRAIN_CNN_DEVICE=cpu|cuda forces one, TRAIN_CNN_THREADS=N sets the threads.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

NUM_CLASSES = 1000   # ImageNet's; a folder's class index is always below it
DEVICE_ENV = "TRAIN_CNN_DEVICE"
THREADS_ENV = "TRAIN_CNN_THREADS"   # torch threads of a CPU step (default: half the cores)


class SmallCNN(nn.Module):
    """Three convolutions and a linear layer: any image size (global average pool)."""

    def __init__(self, classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 5, stride=4, padding=2), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


_STATE: dict[str, Any] = {}   # model, optimizer, device: made on the first step


def _device() -> torch.device:
    want = os.environ.get(DEVICE_ENV, "auto")
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(want)


def _state() -> dict[str, Any]:
    if not _STATE:
        dev = _device()
        if dev.type == "cpu":
            # On the CPU the step's threads share the cores with the DataLoader workers,
            # and oversubscribed they spin waiting for each other (measured here: a 10 ms
            # step took 8-200 ms with 2 threads on 2 busy cores). Half the threads.
            torch.set_num_threads(int(os.environ.get(THREADS_ENV) or 0)
                                  or max(1, torch.get_num_threads() // 2))
        torch.manual_seed(0)
        model = SmallCNN().to(dev).train()
        _STATE.update(device=dev, model=model,
                      opt=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    return _STATE


def step(batch: Any) -> float:
    """One training step on `(images, labels)`; returns the loss. `.item()` waits for the
    device, so the step's time is the real one on CUDA too."""
    images, labels = batch[0], batch[1]
    s = _state()
    dev = s["device"]
    nb = dev.type == "cuda"   # asynchronous host-to-device copies (from pinned memory)
    images = images.to(dev, non_blocking=nb)
    labels = labels.to(dev, non_blocking=nb)
    s["opt"].zero_grad(set_to_none=True)
    loss = F.cross_entropy(s["model"](images), labels)
    loss.backward()
    s["opt"].step()
    return float(loss.item())


def loader_kwargs_from(path: str | os.PathLike[str], batch_size: int | None = None
                       ) -> dict[str, Any]:
    """DataLoader keywords (batch_size included) from a search's search.json; the batch
    size is `batch_size` when given (a search that measured the preset's asks for it)."""
    import autotune

    try:
        return dict(autotune.loader_kwargs(path, batch_size))
    except autotune.AutotuneError as e:   # the file, what is wrong, the fix: one line
        raise SystemExit(str(e)) from None


def build_loader(root: str, kwargs: dict[str, Any], size: int
                 ) -> tuple[torch.utils.data.DataLoader, dict[str, Any]]:
    """The image folder, conversion or staged copy at `root` (autotune.open_dataset),
    torchvision's training transform on the encoded bytes; and the DataLoader's keywords."""
    import autotune
    from autotune.data import ImagenetTrainTransform

    ds = autotune.open_dataset(root, ImagenetTrainTransform(size), decode=False,
                               num_workers=kwargs.get("num_workers"))
    # A training loader's order is ours to choose: shuffled. Streamed shards shuffle
    # themselves (DataLoader refuses shuffle= for them).
    order = {} if isinstance(ds, torch.utils.data.IterableDataset) else {"shuffle": True}
    kw = {"batch_size": kwargs.get("batch_size"), **order, **kwargs}
    return torch.utils.data.DataLoader(ds, **kw), kw


def main(argv: list[str] | None = None) -> int:
    import autotune

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="image folder (or an `autotune convert` output)")
    p.add_argument("--search-json", metavar="FILE",
                   help="take the DataLoader settings from a search's search.json")
    p.add_argument("--steps", type=int, default=50, help="training steps (default 50)")
    p.add_argument("--batch-size", type=int, help="your batch size (needed with a search.json whose batch size was the preset's)")
    p.add_argument("--workers", type=int, help="override num_workers")
    p.add_argument("--size", type=int, default=224, help="crop size (default 224)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--log", default="steps.jsonl", help="step log (default steps.jsonl)")
    a = p.parse_args(argv)

    os.environ[DEVICE_ENV] = a.device
    kw = (loader_kwargs_from(a.search_json, a.batch_size) if a.search_json
          else {"batch_size": a.batch_size or 64, "num_workers": 2})
    if a.workers is not None:
        kw["num_workers"] = a.workers
        if a.workers == 0:   # worker-only settings are refused without workers
            for k in ("prefetch_factor", "persistent_workers"):
                kw.pop(k, None)
    if _device().type == "cuda":
        kw.setdefault("pin_memory", True)
    built, kw = build_loader(a.data, kw, a.size)
    print(f"DataLoader({', '.join(f'{k}={v!r}' for k, v in kw.items())}) on {_device()}")
    loader = autotune.instrument(built, log=a.log)
    done, t0, loss = 0, time.perf_counter(), float("nan")
    while done < a.steps:
        for batch in loader:
            loss = step(batch)
            done += 1
            if done % 10 == 0 or done == a.steps:
                print(f"step {done}/{a.steps}  loss {loss:.3f}")
            if done >= a.steps:
                break
    wall = time.perf_counter() - t0
    s = loader.summary()
    print(f"{done} steps, {s.samples} images in {wall:.1f} s = {s.samples / wall:.1f} images/s; "
          f"data wait {s.data_wait_fraction:.0%} of the loop; step log {loader.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
