"""Search quality (issue 4): the recommended configuration against the --grid best, side
by side in one run, per storage set-up: unthrottled, a read-IOPS cap, a FUSE delay.

    .venv/bin/python -m scripts.bench_search --images 20000 [--iops 300] [--delay-ms 5]
        [--trials 8] [--seconds 8] [--space small] [--setups unthrottled,cap,fuse]

For each set-up: a TPE search (--trials, then its confirmation phase) and a grid search of
the same space, each in its own study; the grid's best is confirmed the same way (the
best of 49 short windows is flattered by its noise), but its confirmation is not counted
in the grid's time. Then the recommended configuration, the grid's best and the
rule-of-thumb baseline are measured again side by side, alternating, --rounds times each
in the same longer window; the table gives their medians, the recommended's share of the
grid best, and the search's share of the grid's wall time. Root for cap/FUSE.
Run it on a quiet machine: another process dropping the page cache (any cold benchmark or
test) makes this one re-read its own libraries through the cap mid-window.
"""

from __future__ import annotations

import argparse
import json
import statistics
import shutil
import time
from contextlib import ExitStack
from pathlib import Path

from autotune.bench import BenchConfig, run_bench
from autotune.emulate.setups import enter_setup
from autotune.search import SearchOptions, run_search
from autotune.search.recommend import confirm_window
from autotune.synth import make_image_folder
from scripts._common import ROOT, config_label, log, workload_args


def _grid_seconds(mdir: Path, setup: str, old_rows: list[dict]) -> float:
    """Seconds the grid has spent measuring so far (a ledger beside its study; an older
    run of this script kept it in its bench_search.json rows)."""
    ledger = mdir / "grid_seconds.json"
    if not (mdir / "study.db").is_file():
        return 0.0  # no study: nothing measured, whatever a stale ledger says
    if ledger.is_file():
        return json.loads(ledger.read_text())["seconds"]
    for r in old_rows:
        if r.get("setup") == setup and r.get("grid_s"):
            return float(r["grid_s"])
    return 0.0


def side_by_side(path: Path, configs: dict[str, dict], a, mon, cap) -> dict[str, dict]:
    """Each configuration measured --rounds times, alternating, in one window long enough
    for the deepest prefetch queue among them: median and all figures per name."""
    step_s = a.compute_ms / 1000
    win = max(confirm_window(p, a.seconds, step_s) for p in configs.values())
    figs: dict[str, list[float]] = {k: [] for k in configs}
    for rnd in range(a.rounds):
        for name, p in configs.items():
            cfg = BenchConfig.from_preset("resnet50", batch_size=a.batch_size,
                                          compute_ms=a.compute_ms, seconds=win, **p).validate()
            r = run_bench(path, cfg, throttle=cap, monitor_path=mon)
            ok = not r.failed and r.images_per_s
            log(f"  side by side, round {rnd + 1}: {name} {config_label(p)}: "
                + (f"{r.images_per_s:,.0f} images/s" if ok else f"failed: {r.reason}"))
            if ok:
                figs[name].append(r.images_per_s)
    return {k: {"config": configs[k], "window_s": win, "images_per_s": v,
                "median": statistics.median(v) if v else None} for k, v in figs.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=20000)
    workload_args(ap, trials=8, compute_ms=250.0, space="default", iops=300)
    ap.add_argument("--setups", default="unthrottled,cap,fuse")
    ap.add_argument("--rounds", type=int, default=3,
                    help="side-by-side measurements of each configuration (default 3)")
    ap.add_argument("--dir", default=str(ROOT / "data"))
    ap.add_argument("--dataset", help="an existing image folder (default: DIR/benchN/train, made)")
    ap.add_argument("--out", default=str(ROOT / "out" / "bench_search"))
    ap.add_argument("--mount", help="FUSE mount point (default a new temporary one); the grid "
                    "study measured behind FUSE names its mount point, so give the same one "
                    "to resume it")
    ap.add_argument("--fresh-search", action="store_true",
                    help="measure the TPE search again from scratch (the grid's study resumes: "
                         "configurations it measured are not measured again; its time adds up)")
    a = ap.parse_args()
    if a.dataset:
        ds = Path(a.dataset)
    else:
        ds = Path(a.dir) / f"bench{a.images}" / "train"
        make_image_folder(ds, a.images, 100, seed=0)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    # Read before this run rewrites it: an older run's grid times live there.
    old_rows = (json.loads((out / "bench_search.json").read_text())
                if (out / "bench_search.json").is_file() else [])

    rows = []
    for setup in a.setups.split(","):
        with ExitStack() as st:
            path, mon, cap = enter_setup(st, setup, ds, iops=a.iops, delay_ms=a.delay_ms,
                                         name="bench-search",
                                         mount=Path(a.mount) if a.mount else None)

            def search(mode: str, **kw):
                return run_search(path, SearchOptions(
                    preset="resnet50", batch_size=a.batch_size, compute_ms=a.compute_ms,
                    seconds=a.seconds, space=a.space, trials=a.trials, grid=mode == "grid",
                    out=str(out / f"{setup}-{mode}"), probe_fio=False, monitor_path=mon,
                    throttle=cap, early_stop=mode == "search", baseline=mode == "search", **kw),
                    progress=lambda m: log(f"{setup} {mode}: {m}"))

            sdir, gdir = out / f"{setup}-search", out / f"{setup}-grid"
            if a.fresh_search:
                shutil.rmtree(sdir, ignore_errors=True)
            t = time.monotonic()
            s = search("search")
            ts = time.monotonic() - t
            # The grid: its measurements timed (and resumable); its confirmation apart.
            tg = _grid_seconds(gdir, setup, old_rows)
            t = time.monotonic()
            g0 = search("grid", confirm=0)
            tg += time.monotonic() - t
            gdir.mkdir(parents=True, exist_ok=True)
            (gdir / "grid_seconds.json").write_text(json.dumps({"seconds": tg}))
            if g0.stop_reason != "grid complete":  # Ctrl-C: the rest would go untimed
                raise SystemExit(f"{setup}: the grid stopped ({g0.stop_reason}); rerun to resume it")
            g = search("grid")
            rec, best, base = s.recommended, g.best, s.baseline
            if rec is None or best is None:
                raise SystemExit(f"{setup}: nothing to compare (search: {s.stop_reason}; "
                                 f"grid: {g.stop_reason}); see {out}")
            configs = {"recommended": rec.params, "grid best": best.params}
            if base is not None and base.ok:
                configs["baseline"] = base.params
            sbs = side_by_side(path, configs, a, mon, cap)
            med = {k: v["median"] for k, v in sbs.items()}
            rows.append({
                "setup": setup, "recommended": rec.params, "recommended_chosen_ips": rec.images_per_s,
                "grid_best": best.params, "grid_best_chosen_ips": best.images_per_s,
                "side_by_side": sbs,
                "ratio": (med["recommended"] / med["grid best"]
                          if med["recommended"] and med["grid best"] else None),
                "vs_baseline": (med["recommended"] / med["baseline"]
                                if med.get("baseline") and med["recommended"] else None),
                "time_share": ts / tg if tg else None, "search_s": ts, "grid_s": tg,
                "search_trials": len([t for t in s.trials if t.state != "duplicate"]),
                "confirmed": len(s.confirmations),
                "verdict": s.verdict.bottleneck if s.verdict else None})
            (out / "bench_search.json").write_text(json.dumps(rows, indent=1))
    n = sum(1 for _ in ds.rglob("*.jpg"))
    print(f"dataset: {ds} ({n} images); step {a.compute_ms:g} ms per batch of {a.batch_size}; "
          f"{a.seconds:g} s windows; space {a.space}; TPE trials {a.trials}; side by side: "
          f"{a.rounds} rounds, medians\n")
    print("| set-up | recommended | grid best | side-by-side window | recommended img/s | grid best img/s "
          "| rec / grid best | search time / grid time | baseline img/s | rec / baseline | verdict |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        sb = r["side_by_side"]
        def m(k):
            v = sb.get(k, {}).get("median")
            return "-" if v is None else f"{v:,.0f}"
        print(f"| {r['setup']} | {config_label(r['recommended'])} | {config_label(r['grid_best'])} | "
              f"{sb['recommended']['window_s']:g} s | {m('recommended')} | {m('grid best')} | "
              f"{r['ratio'] or 0:.2f} | {r['search_s']:,.0f} / {r['grid_s']:,.0f} s = "
              f"{r['time_share'] or 0:.0%} | {m('baseline')} | {r['vs_baseline'] or 0:.2f} | "
              f"{r['verdict']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
