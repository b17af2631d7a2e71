#!/usr/bin/env python3
"""A plain training script for scripts/bench_online.py: a sleep step per batch (the
accelerator's time; the CPU stays free) over a dataset of files, each read from storage
and then decoded at a fixed CPU cost (--cost-ms, a busy loop: about the resnet50 preset's
cost per image on one core), through one of:

    --loader plain     torch.utils.data.DataLoader with the user's settings (num_workers=0)
    --loader online    autotune.DataLoader with the same arguments (nothing else given)
    --loader W:P       torch's DataLoader, num_workers=W, prefetch_factor=P, persistent

Prints one JSON line: the batch times, the waits, and for `online` its decisions.
`files_dataset` is also the `--dataset-factory` that `autotune search` measures, so the
search, the plain loader and autotune.DataLoader read the same dataset the same way.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset


class Files(Dataset):
    """Item i: file i's bytes read, then `cost_s` of CPU; returns (its size, 0)."""

    def __init__(self, root: str, cost_s: float) -> None:
        self.root = root
        self.files = sorted(str(p) for p in Path(root).rglob("*") if p.is_file())
        self.cost_s = cost_s

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        with open(self.files[i], "rb") as f:
            n = len(f.read())
        end = time.perf_counter() + self.cost_s
        while time.perf_counter() < end:
            pass
        return torch.tensor(n), 0


def files_dataset(path: str) -> Files:
    """The search's dataset factory (cost from $ONLINE_COST_MS, default 2.4 ms)."""
    return Files(path, float(os.environ.get("ONLINE_COST_MS", "2.4")) / 1000)


class _Events(logging.Handler):
    def __init__(self, t0: list[float]) -> None:
        super().__init__()
        self.t0, self.events = t0, []

    def emit(self, record: logging.LogRecord) -> None:
        ev = getattr(record, "autotune_event", None)
        if ev:
            self.events.append({"t": time.perf_counter() - self.t0[0], "event": ev,
                                "msg": record.getMessage(),
                                "bottleneck": (getattr(record, "autotune", {}) or {}).get("bottleneck")})


def micro(n: int) -> dict:
    """next()'s added cost: autotune.DataLoader against torch's, both num_workers=0 (given:
    the meter and the controller's windows still run), a dataset that costs nothing."""
    import autotune

    class Nothing(Dataset):
        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int) -> int:
            return i
    out = {}
    for name, make in (("torch", torch.utils.data.DataLoader), ("autotune", autotune.DataLoader)):
        best = None
        for _ in range(3):
            loader = make(Nothing(), batch_size=None, num_workers=0)
            t = time.perf_counter()
            for _ in loader:
                pass
            dt = (time.perf_counter() - t) / n
            best = dt if best is None else min(best, dt)
        out[name] = best
    out["added_us"] = (out["autotune"] - out["torch"]) * 1e6
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data")
    ap.add_argument("--loader", default="plain")
    ap.add_argument("--step-ms", type=float, default=250.0)
    ap.add_argument("--cost-ms", type=float, default=2.4)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--micro", type=int, help="only the next() microbenchmark, N calls")
    a = ap.parse_args()
    if a.micro:
        print(json.dumps(micro(a.micro)))
        return 0
    t0 = [time.perf_counter()]
    events = _Events(t0)
    log = logging.getLogger("autotune.online")
    log.addHandler(events)
    log.setLevel(logging.INFO)
    ds = Files(a.data, a.cost_ms / 1000)
    torch.manual_seed(0)
    if a.loader == "plain":
        loader = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, shuffle=True)
    elif a.loader == "online":
        import autotune
        loader = autotune.DataLoader(ds, batch_size=a.batch_size, shuffle=True)
    else:
        w, p = (int(x) for x in a.loader.split(":"))
        loader = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, shuffle=True,
                                             num_workers=w, prefetch_factor=p if w else None,
                                             persistent_workers=bool(w))
    cpu0 = time.process_time()
    t0[0] = time.perf_counter()
    marks, waits = [], []
    done = False
    while not done:
        it = iter(loader)
        while True:
            t = time.perf_counter()
            try:
                next(it)
            except StopIteration:
                break
            now = time.perf_counter()
            waits.append(now - t)
            marks.append(now - t0[0])
            if now - t0[0] >= a.seconds:
                done = True
                break
            time.sleep(a.step_ms / 1000)
    wall = time.perf_counter() - t0[0]
    out = {"loader": a.loader, "batch_size": a.batch_size, "wall_s": wall, "marks": marks,
           "waits": waits, "main_cpu_s": time.process_time() - cpu0, "events": events.events}
    if a.loader == "online":
        out["tuned"] = loader.tuned_kwargs
        out["overhead_s"] = loader.overhead_s
        out["summary"] = loader.summary
        loader.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
