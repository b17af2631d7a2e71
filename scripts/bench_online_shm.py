"""Benchmark: autotune.DataLoader in a small /dev/shm (Docker's 64 MiB), against the best plain
torch DataLoader setting that fits there. A benchmark, not a test (figures vary with load).

    sudo python -m scripts.bench_online_shm [--seconds 60] [--shm 64m] [--trial-s 10]

Re-runs itself in a private mount namespace whose /dev/shm is a tmpfs of --shm (root and
`unshare` needed). Two cases, one JSON line each and a table:

1. float32 3x224x224 items, batch 64 (37 MiB a batch), shuffle=True: autotune.DataLoader
   for --seconds; whether it ran without a crash and every sample came once per epoch.
2. uint8 3x224x224 items (9.2 MiB a batch, several fit), --item-ms of CPU per item (a
   decode): every plain torch setting (num_workers x prefetch_factor) whose live batches
   fit (autotune.shmfit) for --trial-s each, the best of them against autotune.DataLoader
   over --seconds (its tuning included, and its last half alone). samples/s = samples
   delivered / seconds, first batches (warm-up, worker start) excluded for plain torch.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import shutil
import subprocess
import sys
import time

from scripts._common import ROOT


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--trial-s", type=float, default=10.0)
    p.add_argument("--shm", default="64m")
    p.add_argument("--item-ms", type=float, default=2.0)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--n", type=int, default=2048, help="uint8 items")
    p.add_argument("--float-n", type=int, default=512, help="float32 items (8 batches)")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args()


def _reexec(a: argparse.Namespace) -> int:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        sys.exit("bench_online_shm.py: needs root and unshare for a private /dev/shm; rerun "
                 "with sudo.")
    inner = " ".join([sys.executable, "-m", "scripts.bench_online_shm", "--inner"]
                     + [f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items()
                        if k != "inner"])
    cmd = f"mount -t tmpfs -o size={a.shm} tmpfs /dev/shm && exec {inner}"
    # The inner run imports this checkout and the tests' loop (tests/online/shm_loop.py).
    path = [str(ROOT), str(ROOT / "tests" / "online"), os.environ.get("PYTHONPATH")]
    return subprocess.call(["unshare", "-m", "--propagation", "private", "sh", "-c", cmd],
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))})


def _busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


def main() -> None:
    a = _args()
    if not a.inner:
        sys.exit(_reexec(a))
    import torch
    from torch.utils.data import DataLoader as TorchLoader

    import autotune
    from autotune.environment import read_environment
    from autotune.shmfit import needed_bytes, shm_budget
    from shm_loop import Images, _index

    class Decoded(Images):
        def __getitem__(self, i: int) -> torch.Tensor:
            _busy(a.item_ms)
            return super().__getitem__(i)

    budget = shm_budget(read_environment()).budget_bytes or 0
    out: dict = {"shm": a.shm, "shm_budget_bytes": budget, "cores": os.cpu_count()}

    events: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            events.append(record.getMessage())

    logging.getLogger("autotune.online").addHandler(Keep())
    logging.getLogger("autotune.online").setLevel(logging.INFO)

    # 1. float32, 37 MiB a batch: autotune.DataLoader for --seconds.
    n = a.float_n
    loader = autotune.DataLoader(Images(n, torch.float32), batch_size=64, shuffle=True,
                                 generator=torch.Generator().manual_seed(0))
    t0, samples, epochs, once, crash = time.perf_counter(), 0, 0, True, None
    try:
        while time.perf_counter() - t0 < a.seconds:
            seen: list[int] = []
            for b in loader:
                seen += _index(b)
                samples += len(b)
                time.sleep(a.step_ms / 1000)
                if time.perf_counter() - t0 >= a.seconds:
                    break
            else:
                epochs += 1
                once = once and sorted(seen) == list(range(n))
    except Exception as e:  # noqa: BLE001 (the figure is whether it crashed)
        crash = f"{type(e).__name__}: {e}"
    wall = time.perf_counter() - t0
    out["float32"] = {"seconds": round(wall, 1), "crash": crash, "epochs": epochs,
                      "every_sample_once": once, "samples_per_s": round(samples / wall, 1),
                      "tuned_kwargs": loader.tuned_kwargs, "log": events[:]}
    loader.close()
    del events[:]

    # 2. uint8, several batches fit: the plain settings that fit, then autotune's.
    n = a.n
    ds = Decoded(n, torch.uint8)
    bb = 64 * 3 * 224 * 224
    plain = []
    for w in [0, 1, 2, 3, 4, 6, 8, 12, 16]:
        if w > (os.cpu_count() or 1):
            break
        for pf in ([None] if w == 0 else [1, 2, 4]):
            if w and needed_bytes(w, pf, bb) > budget:
                continue
            kw = {"num_workers": w} | ({"prefetch_factor": pf, "persistent_workers": True}
                                       if w else {})
            it_loader = TorchLoader(ds, batch_size=64, shuffle=True, **kw)
            got, start = 0, None
            t_end = time.perf_counter() + a.trial_s + 30
            while start is None or time.perf_counter() - start < a.trial_s:
                for i, b in enumerate(it_loader):
                    if start is None and i >= 2:
                        start = time.perf_counter()  # warm-up: worker start, first batches
                    elif start is not None:
                        got += len(b)
                    time.sleep(a.step_ms / 1000)
                    if (start is not None and time.perf_counter() - start >= a.trial_s) \
                            or time.perf_counter() > t_end:
                        break
            rate = got / (time.perf_counter() - start) if start else 0.0
            b = None  # the last batch lives in /dev/shm while referenced
            plain.append({"num_workers": w, "prefetch_factor": pf, "samples_per_s": round(rate, 1)})
            it = getattr(it_loader, "_iterator", None)
            if it is not None and hasattr(it, "_shutdown_workers"):
                it._shutdown_workers()  # its batches out of /dev/shm before the next
            del it_loader, it
            gc.collect()
    best = max(plain, key=lambda r: r["samples_per_s"])
    loader = autotune.DataLoader(ds, batch_size=64, shuffle=True)
    t0, samples, half, t_half = time.perf_counter(), 0, 0, None
    while time.perf_counter() - t0 < a.seconds:
        for b in loader:
            samples += len(b)
            now = time.perf_counter()
            if now - t0 >= a.seconds / 2:
                if t_half is None:
                    t_half = now
                else:
                    half += len(b)
            time.sleep(a.step_ms / 1000)
            if time.perf_counter() - t0 >= a.seconds:
                break
    wall = time.perf_counter() - t0
    ours = {"samples_per_s": round(samples / wall, 1),
            "last_half_samples_per_s": round(half / (time.perf_counter() - t_half), 1)
            if t_half else None, "tuned_kwargs": loader.tuned_kwargs, "log": events[:]}
    loader.close()
    out["uint8"] = {"plain_fitting": plain, "best_plain": best, "autotune": ours,
                    "ratio_whole": round(ours["samples_per_s"] / best["samples_per_s"], 3),
                    "ratio_last_half": round((ours["last_half_samples_per_s"] or 0)
                                             / best["samples_per_s"], 3)}
    print(json.dumps(out))
    f, u = out["float32"], out["uint8"]
    print(f"float32 3x224x224, batch 64, /dev/shm {a.shm}: {f['seconds']} s, crash: "
          f"{f['crash'] or 'none'}, {f['epochs']} epochs, every sample once: "
          f"{f['every_sample_once']}, {f['samples_per_s']} samples/s, {f['tuned_kwargs']}")
    print("autotune's log (uint8):\n  " + "\n  ".join(ours["log"]))
    print(f"uint8: best plain torch that fits {best}; autotune {ours}; ratio "
          f"{u['ratio_whole']} (whole run), {u['ratio_last_half']} (last half)")


if __name__ == "__main__":
    main()
