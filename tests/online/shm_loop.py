"""A training loop over autotune.DataLoader, run by test_failure.py inside a mount namespace
whose /dev/shm is a small tmpfs; prints one JSON line of what it saw.

    python shm_loop.py MODE SECONDS [N]

MODE: "float" (3x224x224 float32 items, a batch of 64 is 37 MiB), "uint8" (the same as
uint8, 9.2 MiB), "ranks4" (uint8 items of 1x256x256, a batch of 4 MiB, in a gloo process
group with LOCAL_WORLD_SIZE=4: one of four ranks on a CPU node), "full" (the same items
with /dev/shm filled up before the loader is made: no room for any worker), "fill" (uint8 items of 1x256x256 while /dev/shm is filled up behind the
loader's back after its first epoch began: the workers' collate meets a real ENOSPC),
"beside" (the "uint8" items, with a validation loader's whole pass made mid-epoch while
the training loader's batches fill /dev/shm).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

import torch
from torch.utils.data import Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


class Images(Dataset):
    """Item i is a 3x224x224 tensor whose first element is i (float32 or uint8)."""

    def __init__(self, n: int, dtype: torch.dtype, shape: tuple = (3, 224, 224)) -> None:
        self.n, self.dtype, self.shape = n, dtype, shape

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        x = torch.zeros(self.shape, dtype=self.dtype)
        x.view(-1)[0] = i % 256 if self.dtype == torch.uint8 else i
        x.view(-1)[1] = i // 256 if self.dtype == torch.uint8 else 0
        return x


def _index(x: torch.Tensor) -> list[int]:
    flat = x.reshape(x.shape[0], -1)
    return (flat[:, 0].long() + 256 * flat[:, 1].long()).tolist() if x.dtype == torch.uint8 \
        else flat[:, 0].long().tolist()


def main() -> None:
    import autotune

    mode, seconds = sys.argv[1], float(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 640
    events: list[str] = []
    warned: list[str] = []   # the records at WARNING or above: what a user sees unasked

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            events.append(f"{getattr(record, 'autotune_event', '')}: {record.getMessage()}")
            if record.levelno >= logging.WARNING:
                warned.append(events[-1])

    logging.getLogger("autotune.online").addHandler(Keep())
    logging.getLogger("autotune.online").setLevel(logging.INFO)
    if mode == "ranks4":
        import tempfile

        import torch.distributed as dist
        os.environ["LOCAL_WORLD_SIZE"] = "4"
        rdv = os.path.join(tempfile.mkdtemp(), "rendezvous")
        dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=0, world_size=1)
    if mode == "full":
        with open("/dev/shm/autotune-online-full", "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 2**20)
            except OSError:
                pass
    shape = (1, 256, 256) if mode in ("fill", "ranks4", "full") else (3, 224, 224)
    ds = Images(n, torch.float32 if mode == "float" else torch.uint8, shape)
    loader = autotune.DataLoader(ds, batch_size=64, shuffle=True,
                                 generator=torch.Generator().manual_seed(0))
    epochs, workers_seen, ok, filler = 0, set(), True, None
    val: dict = {}
    # Made with the training loader, as a training script does; used mid-epoch.
    val_loader = autotune.DataLoader(Images(640, torch.uint8), batch_size=64) \
        if mode == "beside" else None
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds or epochs == 0 or (
            mode == "beside" and not val and time.perf_counter() - t0 < 120):
        seen = []
        for i, batch in enumerate(loader):
            seen += _index(batch)
            workers_seen.add(loader.num_workers)
            if mode == "fill" and filler is None and loader.num_workers and i >= 2:
                # Leave under one batch of room: the workers' next batches meet ENOSPC.
                free = os.statvfs("/dev/shm")
                room = free.f_bavail * free.f_frsize
                filler = open("/dev/shm/autotune-online-fill", "wb", buffering=0)
                try:
                    filler.write(b"\0" * max(0, room - 2**20))
                except OSError:
                    pass  # full already: the workers' batches took the rest
            if mode == "beside" and not val and loader.num_workers and i >= 6:
                val = _validate(val_loader, events)
            time.sleep(0.02)  # the step
        ok = ok and sorted(seen) == list(range(n))
        epochs += 1
    seconds, tuned = time.perf_counter() - t0, loader.tuned_kwargs
    loader.close()
    # torch's batch files its workers made and never unlinked (/dev/shm is this run's own).
    left = sorted(f for f in os.listdir("/dev/shm") if f.startswith("torch_"))
    print(json.dumps({"epochs": epochs, "every_sample_once": ok,
                      "workers_seen": sorted(workers_seen), "tuned_kwargs": tuned,
                      "events": events, "warned": warned, "seconds": seconds,
                      "shm_left": left, "val": val}))


def _validate(val: Any, events: list[str]) -> dict:
    """A validation loader's whole pass: what it saw and the decisions it took."""
    first = len(events)
    seen = [i for batch in val for i in _index(batch)]
    out = {"in_order": seen == list(range(640)), "workers": val.num_workers,
           "events": events[first:]}
    val.close()
    return out


if __name__ == "__main__":
    main()
