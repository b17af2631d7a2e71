#!/usr/bin/env python3
"""search and bench in Docker's default 64 MiB /dev/shm (issue 30, item 2): figures for the note.

Each command runs as root in a private mount namespace whose /dev/shm is a fresh 64 MiB
tmpfs (`unshare -m`, `mount -t tmpfs -o size=64m`), as `docker run` without --shm-size:

1. float32 batches (the resnet50 preset, batch 64: 36.8 MiB): `search DS --preset
   resnet50 --batch-size 64 --compute-ms 250 --space small --trials 5`, with the code of
   each --tree (main before, this branch after): exit status, seconds, recommendation;
2. uint8 batches (the same pipeline with `output: uint8`, 9.2 MiB; normalised on the
   accelerator), the same search with --tree's last tree; then `bench` of plain DataLoader
   settings (num_workers 0, 1, 2 at torch's default prefetch 2) and of the recommendation,
   each in the same window, so the recommendation is set against the best plain setting
   that fits.

    python3 -m scripts.bench_shm /var/tmp/data/train --tree /var/tmp/main-copy --tree . \\
        --out /var/tmp/shm-figures

Prints one line per run and writes OUT/summary.json. A benchmark, not a test: timings
depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

PY = sys.executable


def in_64mib_shm(cmd: list[str], tree: Path, log: Path) -> tuple[int, float]:
    """Run `cmd` with `tree` first on the path, in a namespace with a 64 MiB /dev/shm."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t = time.monotonic()
    with open(log, "w") as f:
        rc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                             'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$@"', "sh",
                             *cmd], env=env, stdout=f, stderr=subprocess.STDOUT, cwd=tree).returncode
    return rc, time.monotonic() - t


def uint8_preset(tree: Path, out: Path) -> Path:
    """resnet50 with uint8 output (no normalisation): what a job that normalises on the
    accelerator loads."""
    src = (tree / "configs" / "presets" / "resnet50.yaml").read_text()
    src = src.replace("name: resnet50", "name: resnet50-uint8")
    src = src.replace("output: float32", "output: uint8").replace("normalize: true", "normalize: false")
    p = out / "resnet50-uint8.yaml"
    p.write_text(src)
    return p


def search(ds: str, tree: Path, out: Path, tag: str, preset: str, a: argparse.Namespace) -> dict:
    o = out / tag
    cmd = [PY, "-m", "autotune", "-q", "search", ds, "--preset", preset, "--batch-size",
           str(a.batch_size), "--compute-ms", str(a.compute_ms), "--space", "small",
           "--trials", str(a.trials), "--out", str(o), "--json", f"{o}.json"]
    rc, secs = in_64mib_shm(cmd, tree, out / f"{tag}.log")
    row = {"run": tag, "tree": str(tree), "preset": preset, "rc": rc, "seconds": round(secs, 1)}
    try:
        d = json.loads(Path(f"{o}.json").read_text())
    except (OSError, ValueError):
        return row
    rec = d.get("recommended") or {}
    row.update(recommended=rec.get("config"), images_per_s=rec.get("images_per_s"),
               stop_reason=d.get("stop_reason"), verdict=(d.get("verdict") or {}).get("summary"),
               shm={k: (d.get("shm") or {}).get(k) for k in
                    ("batch_bytes", "budget_bytes", "skipped", "space_configurations",
                     "skipped_trials", "limit")} if d.get("shm") else None,
               trials=[(t["params"].get("num_workers"), t["params"].get("prefetch_factor"),
                        t["state"], (t.get("reason") or "")[:90]) for t in d.get("trials", [])])
    return row


def bench(ds: str, tree: Path, out: Path, tag: str, preset: str, params: dict,
          a: argparse.Namespace) -> dict:
    cmd = [PY, "-m", "autotune", "-q", "bench", ds, "--preset", preset, "--batch-size",
           str(a.batch_size), "--compute-ms", str(a.compute_ms), "--seconds", str(a.seconds),
           "--workers", str(params.get("num_workers") or 0), "--json", str(out / f"{tag}.json")]
    if params.get("num_workers"):
        cmd += ["--prefetch-factor", str(params.get("prefetch_factor") or 2)]
        cmd += ["--persistent-workers" if params.get("persistent_workers") else "--no-persistent-workers"]
    cmd += ["--pin-memory" if params.get("pin_memory") else "--no-pin-memory"]
    rc, secs = in_64mib_shm(cmd, tree, out / f"{tag}.log")
    row = {"run": tag, "params": params, "rc": rc, "seconds": round(secs, 1)}
    try:
        d = json.loads((out / f"{tag}.json").read_text())
        row.update(images_per_s=d.get("images_per_s"), failed=d.get("failed"),
                   reason=d.get("reason"))
    except (OSError, ValueError):
        pass
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset")
    ap.add_argument("--tree", action="append", required=True,
                    help="a source tree to run (give main's first, this branch's last)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--compute-ms", type=float, default=250)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=10, help="bench window of the uint8 runs")
    ap.add_argument("--skip-float32", action="store_true")
    ap.add_argument("--skip-uint8", action="store_true")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_shm: needs root (a mount namespace with its own /dev/shm)", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    ds = str(Path(a.dataset).absolute())
    trees = [Path(t).absolute() for t in a.tree]
    rows = []
    if not a.skip_float32:
        for i, tree in enumerate(trees):
            rows.append(search(ds, tree, out, f"float32-{i}", "resnet50", a))
            print(json.dumps(rows[-1]), flush=True)
    after = trees[-1]
    if a.skip_uint8:
        (out / "summary.json").write_text(json.dumps(rows, indent=1))
        return 0
    preset = str(uint8_preset(after, out))
    s = search(ds, after, out, "uint8-search", preset, a)
    rows.append(s)
    print(json.dumps(s), flush=True)
    plain = [{"num_workers": 0, "pin_memory": False}] + [
        {"num_workers": w, "prefetch_factor": 2, "persistent_workers": False, "pin_memory": False}
        for w in (1, 2)]
    if s.get("recommended"):
        plain.append(s["recommended"])
    for i, p in enumerate(plain):
        rows.append(bench(ds, after, out, "uint8-rec" if i == len(plain) - 1 and s.get("recommended")
                          else f"uint8-plain-w{p['num_workers']}", preset, p, a))
        print(json.dumps(rows[-1]), flush=True)
    (out / "summary.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
