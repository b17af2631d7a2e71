#!/usr/bin/env python3
"""Search quality (issue 4): the recommended configuration against the --grid best, side
by side in one run, per storage set-up: unthrottled, a read-IOPS cap, a FUSE delay.

    .venv/bin/python scripts/bench_search.py --images 20000 [--iops 300] [--delay-ms 5]
        [--trials 8] [--seconds 8] [--space small] [--setups unthrottled,cap,fuse]

For each set-up: a TPE search (--trials) and a grid search of the same space, each in
its own study; prints recommended/grid-best images/s, the search's share of the grid's
wall time, and the recommended against the rule-of-thumb baseline. Root for cap/FUSE.
Run it on a quiet machine: another process dropping the page cache (any cold benchmark or
test) makes this one re-read its own libraries through the cap mid-window.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.search import SearchOptions, run_search  # noqa: E402
from autotune.synth import make_image_folder  # noqa: E402
from _setups import enter_setup  # noqa: E402  (scripts/_setups.py)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=20000)
    ap.add_argument("--iops", type=int, default=300)
    ap.add_argument("--delay-ms", type=float, default=5.0)
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--space", default="default")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--compute-ms", type=float, default=150.0)
    ap.add_argument("--setups", default="unthrottled,cap,fuse")
    ap.add_argument("--dir", default=str(ROOT / "data"))
    ap.add_argument("--dataset", help="an existing image folder (default: DIR/benchN/train, made)")
    ap.add_argument("--out", default=str(ROOT / "out" / "bench_search"))
    ap.add_argument("--fresh-search", action="store_true",
                    help="measure the TPE search again from scratch (the grid's study resumes: "
                         "configurations it measured are not measured again; its time adds up)")
    a = ap.parse_args()
    if a.dataset:
        ds = Path(a.dataset)
    else:
        ds = Path(a.dir) / f"bench{a.images}" / "train"
        make_image_folder(ds, a.images, 100, seed=0)
    rows = []
    for setup in a.setups.split(","):
        with ExitStack() as st:
            path, mon, cap = enter_setup(st, setup, ds, iops=a.iops, delay_ms=a.delay_ms,
                                         name="bench-search")
            res = {}
            for mode in ("search", "grid"):
                mdir = Path(f"{a.out}/{setup}-{mode}")
                if mode == "search" and a.fresh_search:
                    shutil.rmtree(mdir, ignore_errors=True)
                # A grid resumed from an earlier run of this script: its time so far counts.
                before = (json.loads((mdir / "search.json").read_text())["seconds"]
                          if (mdir / "search.json").is_file() else 0.0)
                t = time.monotonic()
                r = run_search(path, SearchOptions(
                    preset="resnet50", batch_size=a.batch_size, compute_ms=a.compute_ms,
                    seconds=a.seconds, space=a.space, trials=a.trials, grid=mode == "grid",
                    out=f"{a.out}/{setup}-{mode}", probe_fio=False, monitor_path=mon, throttle=cap,
                    early_stop=mode == "search", baseline=mode == "search"))
                res[mode] = (r, before + time.monotonic() - t)
            (s, ts), (g, tg) = res["search"], res["grid"]
            rec, best, base = s.recommended, g.best, s.baseline
            rows.append({"setup": setup, "recommended": rec.params if rec else None,
                         "recommended_ips": rec.images_per_s if rec else None,
                         "grid_best": best.params if best else None,
                         "grid_best_ips": best.images_per_s if best else None,
                         "ratio": (rec.images_per_s / best.images_per_s) if rec and best else None,
                         "time_share": ts / tg, "search_s": ts, "grid_s": tg,
                         "baseline_ips": base.images_per_s if base and base.ok else None,
                         "verdict": s.verdict.bottleneck if s.verdict else None})
    n = sum(1 for _ in ds.rglob("*.jpg"))
    print(f"dataset: {ds} ({n} images); step {a.compute_ms:g} ms per batch of {a.batch_size}; "
          f"{a.seconds:g} s windows; space {a.space}; TPE trials {a.trials}\n")
    print("| set-up | recommended | rec img/s | grid best | grid img/s | rec/grid | time share | baseline img/s | verdict |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        def cfg(p):
            return "-" if not p else f"w{p['num_workers']} pf{p.get('prefetch_factor') or '-'}"
        print(f"| {r['setup']} | {cfg(r['recommended'])} | {r['recommended_ips'] or 0:,.0f} | "
              f"{cfg(r['grid_best'])} | {r['grid_best_ips'] or 0:,.0f} | {r['ratio'] or 0:.2f} | "
              f"{r['time_share']:.0%} | {r['baseline_ips'] or 0:,.0f} | {r['verdict']} |")
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "bench_search.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
