"""The user's own job (issue 14): a search over a Dataset autotune did not write, and the
answer checked the way a user would use it.

    .venv/bin/python -m scripts.bench_factory --dataset /var/tmp/ds20k [--images 4000,20000]

For each dataset size (the first N images of --dataset, copied to the root disk):
1. `autotune search DIR --dataset-factory tests/search/user_dataset.py:make` (grayscale,
   blur, 192-pixel crop, float16 dict samples: not autotune's pipeline), cold;
2. a fresh Python process started after `drop_caches` that builds the same dataset and runs
   `DataLoader(ds, **autotune.loader_kwargs(search.json))` with the same emulated step,
   warm-up and window as the search's confirmation: its images/s against the search's
   figure (target: within +-20 %);
3. the same search with --procs-per-node 2: both ranks' figures and the per-rank worker
   count against the node's cores.
Needs root (drop_caches). Prints Markdown and writes JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from scripts._common import ROOT, config_label, copy_images, drop_caches, log

PY = sys.executable
FACTORY = ROOT / "tests" / "search" / "user_dataset.py"

# The user's loop: their dataset (user_dataset.py's folder on its PYTHONPATH), the
# handed-back kwargs, a step of the search's length.
PLAIN = r"""
import json, sys, time
import torch, torch.utils.data
import autotune
from user_dataset import make
root, out, step_s, warmup, seconds = sys.argv[1], sys.argv[2], *map(float, sys.argv[3:6])
torch.set_num_threads(1)
kw = autotune.loader_kwargs(out)
it = iter(torch.utils.data.DataLoader(make(root), shuffle=True, **kw))   # as the search measured
n = batches = 0
for _ in range(int(warmup)):
    next(it); time.sleep(step_s)
t0 = time.perf_counter()
for b in it:
    n += len(b["label"]); batches += 1
    time.sleep(step_s)
    if time.perf_counter() - t0 >= seconds:
        break
dt = time.perf_counter() - t0
print(json.dumps({"kwargs": kw, "images_per_s": n / dt, "batches": batches, "seconds": dt}))
"""


def subset(ds: Path, n: int, work: Path) -> Path:
    files = sorted(ds.rglob("*.jpg"))
    if len(files) < n:
        raise SystemExit(f"{ds} holds {len(files)} images, fewer than the {n} asked for")
    if len(files) == n:
        return ds
    dst = work / f"ds{n}"
    copy_images(files[:n], dst)
    return dst


def search(ds: Path, out: Path, a: argparse.Namespace, *extra: str) -> dict:
    cmd = [PY, "-m", "autotune", "-q", "search", str(ds), "--dataset-factory", f"{FACTORY}:make",
           "--batch-size", str(a.batch_size), "--compute-ms", str(a.compute_ms),
           "--seconds", str(a.seconds), "--trials", str(a.trials), "--space", "small",
           "--no-fio", "--out", str(out), "--json", "-", *extra]
    log(" ".join(cmd[2:]))
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"search failed ({r.returncode}): {r.stderr.strip()[-800:]}")
    return json.loads(r.stdout)


def plain_loader(ds: Path, out: Path, d: dict, a: argparse.Namespace) -> dict:
    rec = d["recommended"]
    cfg = rec["config"]
    warm = max(5, (cfg["num_workers"] or 0) * (cfg.get("prefetch_factor") or 0))
    seconds = (rec.get("window") or {}).get("seconds") or a.seconds
    drop_caches()
    path = os.pathsep.join(filter(None, [str(FACTORY.parent), os.environ.get("PYTHONPATH")]))
    r = subprocess.run([PY, "-c", PLAIN, str(ds), str(out),
                        str(a.compute_ms / 1000), str(warm), str(seconds)],
                       capture_output=True, text=True, cwd=ROOT, timeout=900,
                       env={**os.environ, "PYTHONPATH": path})
    if r.returncode != 0:
        raise SystemExit(f"plain DataLoader failed: {r.stderr.strip()[-800:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--images", default="4000,20000")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--compute-ms", type=float, default=250.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--no-ranks", action="store_true", help="skip the --procs-per-node 2 search")
    ap.add_argument("--out", default=str(ROOT / "out" / "bench_factory"))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict = {"cores": os.cpu_count(), "batch_size": a.batch_size,
                 "compute_ms": a.compute_ms, "runs": []}
    work = Path(tempfile.mkdtemp(prefix="autotune-factory-", dir="/var/tmp"))
    try:
        for n in map(int, a.images.split(",")):
            ds = subset(Path(a.dataset).absolute(), n, work)
            d = search(ds, out / f"{n}", a)
            rec = d["recommended"]
            plain = plain_loader(ds, out / f"{n}", d, a)
            row = {"images": n, "recommended": config_label(rec["config"]),
                   "search_images_per_s": rec["images_per_s"], "au": rec.get("au"),
                   "verdict": (d.get("verdict") or {}).get("bottleneck"),
                   "loader_kwargs": d.get("loader_kwargs"),
                   "plain_images_per_s": plain["images_per_s"],
                   "plain_seconds": plain["seconds"],
                   "ratio": plain["images_per_s"] / rec["images_per_s"]}
            if not a.no_ranks and n == min(map(int, a.images.split(","))):
                d2 = search(ds, out / f"{n}-ranks", a, "--procs-per-node", "2")
                r2 = d2["recommended"]
                row["ranks"] = {"recommended": config_label(r2["config"]),
                                "node_images_per_s": r2["images_per_s"],
                                "per_rank": r2.get("per_rank"),
                                "workers_per_rank": r2["config"]["num_workers"],
                                "notes": [w for w in d2.get("warnings", []) if "rank" in w]}
            res["runs"].append(row)
            log(json.dumps(row, default=str))
            (out / "factory.json").write_text(json.dumps(res, indent=1, default=str))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"cores {res['cores']}, batch {a.batch_size}, step {a.compute_ms:g} ms\n")
    print("| images | recommended | search images/s | plain DataLoader images/s | ratio |")
    print("|---|---|---|---|---|")
    for r in res["runs"]:
        print(f"| {r['images']:,} | {r['recommended']} | {r['search_images_per_s']:.1f} "
              f"| {r['plain_images_per_s']:.1f} | {r['ratio']:.3f} |")
    for r in res["runs"]:
        if "ranks" in r:
            k = r["ranks"]
            per = ", ".join(f"rank {p['rank']} {p['images_per_s']:.1f}" for p in k["per_rank"] or [])
            print(f"\n--procs-per-node 2 on {r['images']:,}: {k['recommended']} per rank, "
                  f"node {k['node_images_per_s']:.1f} images/s ({per})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
