"""The probe's storage ceiling behind a read-IOPS cap beside a plain reader's figure.

A dataset (made, or --dataset) is copied onto an ext4 loop disk of its own (as
scripts/demo does) capped with a cgroup (autotune.emulate.IoThrottle); `autotune probe`
(replay only) and scripts/plain_reader.py (no autotune import: open + one read of each
file) both run inside the capped cgroup, at the same concurrency, window and drop_caches
level (1: page cache dropped, inodes kept), over the same files, each read once before
(uncapped) as a run's earlier epochs have read them. Root only.

    .venv/bin/python -m scripts.bench_probe_cap [--images 3000] [--iops 100]
        [--concurrency 16] [--seconds 20] [--dataset DIR] [--json out/bench_probe_cap.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from autotune.emulate import IoThrottle
from autotune.synth import make_image_folder
from scripts._common import ROOT, du, write_json


def loop_disk(src: Path, work: Path) -> Path:
    """A copy of `src` on an ext4 image of its own, mounted at work/hdd (the demo's sizing)."""
    mib = du(src) * 13 // 10 // 2**20 + 64
    img, mnt = work / "hdd.img", work / "hdd"
    with open(img, "wb") as f:
        f.truncate(mib * 2**20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True)
    mnt.mkdir()
    subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True)
    subprocess.run(["cp", "-a", str(src), str(mnt / "train")], check=True)
    # Read every file once, uncapped, as a run's earlier epochs have: the first read after
    # a write updates the atime (relatime), which a plain reader would otherwise pay here.
    for p in (mnt / "train").rglob("*"):
        if p.is_file():
            p.read_bytes()
    os.sync()
    return mnt / "train"


def measure(data: Path, iops: int, conc: int, seconds: float) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    n = sum(1 for p in data.rglob("*") if p.is_file())
    with IoThrottle(data, read_iops=iops, name="bench-probe-cap") as cap:
        r = cap.run([sys.executable, "-m", "autotune", "-q", "probe", str(data), "--no-fio",
                     "--concurrency", str(conc), "--replay-seconds", str(seconds),
                     "--replay-files", str(n), "--json", "-"],
                    capture_output=True, text=True, env=env, timeout=1800)
        if r.returncode not in (0, 3):
            raise SystemExit(f"probe failed: {r.stderr.strip()}")
        probe = json.loads(r.stdout)
        p = cap.run([sys.executable, str(ROOT / "scripts" / "plain_reader.py"), str(data),
                     "--threads", str(conc), "--drop-caches", "1", "--seconds", str(seconds)],
                    capture_output=True, text=True, timeout=1800, check=True)
    plain = float(re.match(r"([\d.]+) files/s", p.stdout).group(1))
    ceil = probe["replay"]["ceiling"]
    return {"files": n, "iops_cap": iops, "concurrency": conc, "seconds": seconds,
            "probe_files_per_s": round(ceil["files_per_s"], 1),
            "probe_ios_per_file": ceil["ios_per_file"], "probe_method": ceil["method"],
            "plain_files_per_s": plain, "plain_line": p.stdout.strip(),
            "ratio": round(ceil["files_per_s"] / plain, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=3000)
    ap.add_argument("--iops", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--dataset", type=Path, help="an image folder to copy (default: make one)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_probe_cap: needs root (a loop disk, a cgroup cap, drop_caches)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="autotune-probe-cap.", dir="/var/tmp"))
    try:
        src = a.dataset
        if src is None:
            src = work / "src"
            make_image_folder(src, a.images, 20, seed=0)
        res = measure(loop_disk(src, work), a.iops, a.concurrency, a.seconds)
    finally:
        subprocess.run(["umount", "-l", str(work / "hdd")], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    print(f"| files | cap (read IOPS) | threads | probe files/s (I/Os per file) | plain reader files/s | ratio |")
    print(f"| {res['files']:,} | {res['iops_cap']} | {res['concurrency']} | "
          f"{res['probe_files_per_s']:.1f} ({res['probe_ios_per_file'] or float('nan'):.2f}) | "
          f"{res['plain_files_per_s']:.1f} | {res['ratio']:.2f} |")
    print(f"probe: {res['probe_method']}\nplain: {res['plain_line']}")
    if a.json:
        write_json(a.json, res, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
