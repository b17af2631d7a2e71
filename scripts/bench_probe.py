"""Probe figures for the README and the issue notes, side by side in one run:
the work disk unthrottled, under a cgroup read-IOPS cap, and behind a FUSE delay.

    .venv/bin/python -m scripts.bench_probe [--images 2000] [--iops 500] [--delay-ms 5]
        [--runtime 10] [--json out/bench_probe.json]

Needs root for the cap and the FUSE mount (each case says so and is skipped otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from autotune.synth import make_image_folder
from scripts._common import ROOT, write_json


def probe(path: Path, extra: list[str], runner=subprocess.run) -> dict:
    cmd = [sys.executable, "-m", "autotune", "-q", "probe", str(path), "--json", "-", *extra]
    r = runner(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    if r.returncode not in (0, 3):
        raise SystemExit(f"probe failed: {r.stderr.strip()}")
    return json.loads(r.stdout)


def row(name: str, d: dict) -> str:
    f, rp = d.get("fio"), d.get("replay")
    one = rp["by_concurrency"][0] if rp else None
    best = max(rp["by_concurrency"], key=lambda lv: lv["files_per_s"]) if rp else None
    cells = [name, d["filesystem"]["class"] + (f" (like {d['filesystem']['behaves_like']})"
                                              if d["filesystem"].get("behaves_like") else ""),
             f"{f['rand_read']['iops']:,.0f}" if f else "-",
             f"{f['rand_read']['lat_p99_ms']:.2f}" if f else "-",
             f"{f['seq_read']['bw_mib_s']:,.0f}" if f else "-",
             f"{one['files_per_s']:,.0f} / {one['lat_p50_ms']:.2f}" if one else "-",
             f"{best['files_per_s']:,.0f} @ {best['concurrency']}" if best else "-"]
    return "| " + " | ".join(cells) + " |"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--iops", type=int, default=500)
    ap.add_argument("--delay-ms", type=float, default=5.0)
    ap.add_argument("--runtime", type=float, default=10.0)
    ap.add_argument("--dir", default=str(ROOT / "data"), help="where the dataset is made")
    ap.add_argument("--json", default=str(ROOT / "out" / "bench_probe.json"))
    a = ap.parse_args()

    ds = Path(a.dir) / f"probe-ds-{a.images}" / "train"
    make_image_folder(ds, a.images, max(1, a.images // 100), seed=0)
    common = ["--runtime", str(a.runtime), "--size", "1G", "--replay-seconds", "10"]
    results: dict[str, dict] = {}
    results["unthrottled"] = probe(ds, common)
    if os.geteuid() == 0:
        from autotune.cache import drop_caches
        from autotune.emulate import IoThrottle

        with IoThrottle(ds, read_iops=a.iops, name="bench-probe") as cap:
            drop_caches()
            results[f"{a.iops}-IOPS cap"] = probe(ds, common, runner=cap.run)
        from autotune.emulate import SlowMount

        with tempfile.TemporaryDirectory() as t, SlowMount(ds, Path(t) / "mnt", delay_ms=a.delay_ms):
            results[f"{a.delay_ms:g} ms FUSE delay"] = probe(Path(t) / "mnt", common)
    else:
        print("not root: the IOPS-cap and FUSE cases are skipped", file=sys.stderr)

    print(f"dataset: {a.images} generated images, mean "
          f"{results['unthrottled']['replay']['mean_file_bytes'] / 1e3:.0f} KB; fio runtime {a.runtime:g} s/job, 1 GiB scratch file\n")
    print("| storage | class | fio rand 4K IOPS | rand p99 ms | fio seq MiB/s | replay c=1 files/s / p50 ms | replay best files/s |")
    print("|---|---|---|---|---|---|---|")
    for name, d in results.items():
        print(row(name, d))
    write_json(a.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
