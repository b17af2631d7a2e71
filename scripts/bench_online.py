#!/usr/bin/env python3
"""autotune.DataLoader against a plain DataLoader and the best fixed configuration, one
training loop each, side by side.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_online.py [--step-ms 250] [--cost-ms 2.4]
        [--batch-size 64] [--seconds 60] [--fixed 1:2,2:2,2:4,3:2]

The loop: a sleep step per batch (the accelerator's time; the CPU stays free) over a
synthetic dataset whose items cost --cost-ms of CPU each (about the resnet50 preset's decode
on one core here). Each arm runs in a fresh process, started cold (the online arm with an
empty settings cache): `plain` is torch's DataLoader with the user's settings (num_workers=0),
`online` is autotune.DataLoader with the same arguments, `W:P` a fixed num_workers W,
prefetch_factor P. Reported: samples in the run (exploration included), the rate over the
last third, AU there, and for the online arm when it settled. A sketch of the issue's
benchmark: no NFS-like or IOPS-capped storage, no `autotune search` arm.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class Burn:
    """n items, each --cost-ms of CPU (a busy loop: decode is CPU, not sleep)."""

    def __init__(self, n: int, cost_s: float) -> None:
        self.n, self.cost_s = n, cost_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import torch
        end = time.perf_counter() + self.cost_s
        while time.perf_counter() < end:
            pass
        return torch.tensor([i])


def _arm(a: argparse.Namespace) -> dict:
    import torch
    import autotune
    settled: list[float] = []

    class _Settle(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if getattr(record, "autotune_event", None) == "settle":
                settled.append(time.perf_counter())
    logging.getLogger("autotune.online").addHandler(_Settle())
    logging.getLogger("autotune.online").setLevel(logging.INFO)
    ds = Burn(10**6, a.cost_ms / 1000)
    if a.arm == "plain":
        loader = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, shuffle=True)
    elif a.arm == "online":
        loader = autotune.DataLoader(ds, batch_size=a.batch_size, shuffle=True)
    else:
        w, p = (int(x) for x in a.arm.split(":"))
        loader = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, shuffle=True,
                                             num_workers=w, prefetch_factor=p,
                                             persistent_workers=True)
    t0 = time.perf_counter()
    marks, waited = [], []
    it = iter(loader)
    while time.perf_counter() - t0 < a.seconds:
        t = time.perf_counter()
        next(it)
        waited.append(time.perf_counter() - t)
        marks.append(time.perf_counter())
        time.sleep(a.step_ms / 1000)
    wall = time.perf_counter() - t0
    tail = [i for i, m in enumerate(marks) if m - t0 >= 2 * a.seconds / 3]
    tail_s = marks[-1] - marks[tail[0]] if len(tail) > 1 else 0.0
    out = {"arm": a.arm, "samples": len(marks) * a.batch_size, "wall_s": wall,
           "tail_rate": (len(tail) - 1) * a.batch_size / tail_s if tail_s else None,
           "tail_au": 1 - sum(waited[i] for i in tail[1:]) / tail_s if tail_s else None,
           "settled_s": settled[0] - t0 if settled else None}
    if a.arm == "online":
        out["tuned"] = loader.tuned_kwargs
        loader.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--step-ms", type=float, default=250.0)
    ap.add_argument("--cost-ms", type=float, default=2.4)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--fixed", default="1:2,2:2,2:4,3:2", help="fixed arms, W:P each")
    ap.add_argument("--arm", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.arm:
        print(json.dumps(_arm(a)))
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as cache_dir:
        env = dict(os.environ, AUTOTUNE_CACHE_DIR=cache_dir,
                   PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        for arm in ["plain", "online", *a.fixed.split(",")]:
            cmd = [sys.executable, __file__, "--arm", arm, "--step-ms", str(a.step_ms),
                   "--cost-ms", str(a.cost_ms), "--batch-size", str(a.batch_size),
                   "--seconds", str(a.seconds)]
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    best = max((r for r in rows if ":" in r["arm"]), key=lambda r: r["samples"])
    print(f"step {a.step_ms:g} ms per {a.batch_size}, {a.cost_ms:g} ms CPU per item, "
          f"{a.seconds:g} s per arm; best fixed: {best['arm']}")
    print(f"{'arm':8} {'samples':>8} {'vs best':>8} {'tail/s':>8} {'vs best':>8} "
          f"{'tail AU':>8} {'settled':>8}")
    for r in rows:
        tr, br = r["tail_rate"] or 0, best["tail_rate"] or 1
        st = "-" if r["settled_s"] is None else f"{r['settled_s']:.1f} s"
        print(f"{r['arm']:8} {r['samples']:8d} {r['samples'] / best['samples']:7.2f}x "
              f"{tr:8.0f} {tr / br:7.2f}x {r['tail_au'] or 0:8.2f} {st:>8}"
              + (f"  tuned {r['tuned']}" if "tuned" in r else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
