"""The figures behind issue 13 ("measurement truth"), each measured for real, one run.

    .venv/bin/python -m scripts.bench_truth --dataset /var/tmp/ds20k [--only NAME,...]

cap-compute        a search behind a 300-IOPS cap with a 600 ms step per batch of 64
                   (demand 107 images/s): the verdict should be compute, AU >= 0.85
whole-vs-median    one cold bench behind the 300-IOPS cap: the whole window's images/s
                   against the sub-windows' median (a bursty cap flatters a median)
conversion-ceiling the dataset converted to WebDataset on the local disk: its storage
                   ceiling in samples/s (read through its reader, cold) against what the
                   loader delivers from it (a cold bench, decode included)
batch-space        a grid over batch sizes 64 and 128 (2 workers, cold, 250 ms per 64):
                   the step scales with the batch, so the larger batch is not free
small-dataset      4,000 images in batches of 256 (15 per cold pass): refused up front
                   (exit 2) instead of a decision from a drained prefetch queue
Needs root (cap, drop_caches). Prints a Markdown table and writes JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from autotune.emulate.setups import enter_setup, own_disk
from scripts._common import ROOT, config_label, copy_images, log

PY = sys.executable


def cap_compute(ds: Path, out: Path, iops: int) -> dict:
    from autotune.search import SearchOptions, run_search

    with ExitStack() as st:
        work = Path(tempfile.mkdtemp(prefix="autotune-truth-", dir="/var/tmp"))
        st.callback(shutil.rmtree, work, True)
        src = own_disk(st, ds, work)
        path, mon, cap = enter_setup(st, "cap", src, iops=iops, delay_ms=0, name="truth")
        opts = SearchOptions(preset="resnet50", batch_size=64, compute_ms=600, seconds=8,
                             space="small", trials=4, out=str(out / "cap-compute"),
                             probe_fio=False, monitor_path=mon, throttle=cap)
        t = time.monotonic()
        r = run_search(path, opts, progress=lambda m: log(f"[cap-compute] {m}"))
    rec = r.recommended
    return {"verdict": r.verdict.bottleneck if r.verdict else None,
            "summary": r.verdict.summary if r.verdict else None,
            "recommended": config_label(rec.params) if rec else None,
            "images_per_s": rec.images_per_s if rec else None, "au": rec.au if rec else None,
            "ceilings": r.ceilings.to_dict(), "seconds": time.monotonic() - t}


def whole_vs_median(ds: Path, out: Path, iops: int) -> dict:
    from autotune.bench import BenchConfig, run_bench

    rows = []
    with ExitStack() as st:
        work = Path(tempfile.mkdtemp(prefix="autotune-truth-", dir="/var/tmp"))
        st.callback(shutil.rmtree, work, True)
        src = own_disk(st, ds, work)
        path, mon, cap = enter_setup(st, "cap", src, iops=iops, delay_ms=0, name="truth")
        for w in (2, 4, 8):
            cfg = BenchConfig.from_preset("resnet50", num_workers=w, batch_size=64,
                                          compute_ms=0, seconds=15)
            r = run_bench(path, cfg, throttle=cap, monitor_path=mon)
            sp = r.images_per_s_spread or {}
            rows.append({"workers": w, "whole": r.images_per_s, "median": sp.get("median"),
                         "windows": sp.get("windows"), "failed": r.reason})
            log(f"[whole-vs-median] w{w}: whole {r.images_per_s} median {sp.get('median')}")
    return {"rows": rows}


def conversion_ceiling(ds: Path, out: Path) -> dict:
    from autotune.bench import BenchConfig, run_bench
    from autotune.probe import probe
    from autotune_converters import ConvertOptions, convert

    work = Path(tempfile.mkdtemp(prefix="autotune-truth-", dir="/var/tmp"))
    try:
        dst = work / "wds"
        convert(ds, dst, ConvertOptions(format="wds", workers=2))
        p = probe(dst, run_fio=False, replay_seconds=5, concurrency=(1, 4, 16))
        best = p.samples.best
        cfg = BenchConfig.from_preset("resnet50", num_workers=2, batch_size=64, compute_ms=0,
                                      seconds=15)
        b = run_bench(dst, cfg)
        return {"ceiling_samples_per_s": best.samples_per_s, "ceiling_readers": best.concurrency,
                "ceiling_mib_s": best.mib_per_s, "loader_images_per_s": b.images_per_s,
                "ratio": best.samples_per_s / b.images_per_s if b.images_per_s else None,
                "file_replay_files_per_s": p.replay.ceiling[0].files_per_s if p.replay else None}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def batch_space(ds: Path, out: Path) -> dict:
    from autotune.search import SearchOptions, run_search

    out.mkdir(parents=True, exist_ok=True)
    sp = out / "batch-space.yaml"
    sp.write_text("num_workers: {choices: [2]}\nprefetch_factor: {choices: [2]}\n"
                  "persistent_workers: {choices: [false]}\npin_memory: {choices: [false]}\n"
                  "batch_size: {choices: [64, 128]}\n")
    opts = SearchOptions(preset="resnet50", batch_size=64, compute_ms=250, seconds=10,
                         space=str(sp), grid=True, trials=2, out=str(out / "batch-space"),
                         probe_fio=False)
    r = run_search(ds, opts, progress=lambda m: log(f"[batch-space] {m}"))
    return {"trials": [{"batch_size": t.params.get("batch_size"), "state": t.state,
                        "images_per_s": t.images_per_s, "step_ms": t.step_ms,
                        "au": t.au} for t in r.trials],
            "demand": r.ceilings.demand, "notes": [w for w in r.warnings if "batch" in w]}


def small_dataset(ds: Path, out: Path) -> dict:
    sub = Path(tempfile.mkdtemp(prefix="autotune-truth-4k-", dir="/var/tmp")) / "train"
    try:
        copy_images(sorted(ds.rglob("*.jpg"))[:4000], sub)
        r = subprocess.run([PY, "-m", "autotune", "-q", "search", str(sub), "--trials", "12",
                            "--batch-size", "256", "--compute-ms", "0", "--no-fio",
                            "--out", str(out / "small")],
                           capture_output=True, text=True, timeout=900, cwd=ROOT)
        return {"exit": r.returncode, "stderr": r.stderr.strip()[-600:]}
    finally:
        shutil.rmtree(sub.parent, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--iops", type=int, default=300)
    ap.add_argument("--only", default="cap-compute,whole-vs-median,conversion-ceiling,"
                                       "batch-space,small-dataset")
    ap.add_argument("--out", default=str(ROOT / "out" / "bench_truth"))
    a = ap.parse_args()
    ds, out = Path(a.dataset).absolute(), Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {}
    for name in a.only.split(","):
        log(f"{name} ...")
        fn = {"cap-compute": lambda: cap_compute(ds, out, a.iops),
              "whole-vs-median": lambda: whole_vs_median(ds, out, a.iops),
              "conversion-ceiling": lambda: conversion_ceiling(ds, out),
              "batch-space": lambda: batch_space(ds, out),
              "small-dataset": lambda: small_dataset(ds, out)}[name]
        res[name] = fn()
        (out / "truth.json").write_text(json.dumps(res, indent=1, default=str))
        print(f"## {name}\n```\n{json.dumps(res[name], indent=1, default=str)[:3000]}\n```",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
