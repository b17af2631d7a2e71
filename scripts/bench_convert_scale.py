#!/usr/bin/env python3
"""The conversions' cost per file as the tree grows, with the storage taken out or kept in.

    .venv/bin/python -m scripts.bench_convert_scale --sizes 200000,1281167 --where ram
    .venv/bin/python -m scripts.bench_convert_scale --sizes 200000,1281167 --where disk \\
        --work /var/tmp/convscale --formats lmdb

For each size a tree from `scripts.make_dataset --small` (1,000 classes of small distinct
JPEGs), then each format converted by the library (`autotune_converters.ranks.convert`,
--workers processes, its default batches), each phase timed from its progress callback,
in a child process of its own (its peak RSS from getrusage), the output on --work's disk.

--where ram: the tree on a tmpfs (root; no swap here, so nothing of it is reclaimed): the
code's own cost per file, no disk, no page-cache reclaim. --where disk: the tree on
--work's disk, the page cache dropped before each step (root), and beside each
conversion `scripts.plain_reader` over the tree (every file read once in a seeded shuffle
across it, as the plan's order is, --readers threads): the storage's own cost per file,
which the conversion cannot go below. Each tree is deleted once measured.

Results go to stdout as JSON lines, progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts._common import ROOT, drop_caches, loadavg, log

CONVERT = r"""
import json, resource, sys, time
from autotune_converters.conversion import ConvertOptions
from autotune_converters.ranks import convert
src, dst, fmt, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
phases = {}
t0 = time.monotonic()
def progress(p):
    phases.setdefault(p.phase, round(time.monotonic() - t0, 2))
convert(src, dst, ConvertOptions(format=fmt, workers=workers), progress)
wall = time.monotonic() - t0
rss = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
          resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
print(json.dumps({"wall_s": round(wall, 2), "phases": phases, "peak_rss_mib": rss // 1024}))
"""


def plain_read(root: Path, threads: int) -> dict:
    """scripts.plain_reader over the tree: every file opened and read once, in a seeded
    shuffle, `threads` at a time, the whole page cache dropped first; no autotune import."""
    r = subprocess.run([sys.executable, "-m", "scripts.plain_reader", str(root), "--threads",
                        str(threads), "--drop-caches", "3", "--seconds", "1e9"],
                       capture_output=True, text=True, cwd=ROOT)
    m = re.match(r"([\d.]+) files/s \((\d+) files in ([\d.]+) s", r.stdout)
    if r.returncode != 0 or m is None:
        raise SystemExit(f"plain read failed:\n{r.stdout}{r.stderr[-3000:]}")
    rate, files, wall = float(m[1]), int(m[2]), float(m[3])
    return {"step": f"plain read, {threads} threads", "files": files, "wall_s": wall,
            "us_per_file": round(1e6 / rate)}


def convert(src: Path, work: Path, fmt: str, workers: int, files: int) -> dict:
    dst = work / f"out-{fmt}"
    shutil.rmtree(dst, ignore_errors=True)
    load = loadavg()
    r = subprocess.run([sys.executable, "-c", CONVERT, str(src), str(dst), fmt, str(workers)],
                       capture_output=True, text=True, cwd=ROOT)
    shutil.rmtree(dst, ignore_errors=True)
    if r.returncode != 0:
        raise SystemExit(f"convert {fmt} failed:\n{r.stderr[-3000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out.update(step=f"convert {fmt}", files=files, load=load,
               us_per_file=round(out["wall_s"] / files * 1e6))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="200000,1281167")
    ap.add_argument("--where", choices=("ram", "disk"), default="ram")
    ap.add_argument("--formats", default="lmdb,wds")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--readers", type=int, default=2, help="threads of the plain read (disk)")
    ap.add_argument("--work", default="/var/tmp/autotune-convscale",
                    help="the conversions' output (and, with --where disk, the trees)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_convert_scale needs root: a tmpfs (--where ram) or "
                         "drop_caches (--where disk).")
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    mnt = None
    if a.where == "ram":
        mnt = Path(tempfile.mkdtemp(prefix="convscale-ram-"))
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16g", "tmpfs", str(mnt)], check=True)
    try:
        for n in [int(s) for s in a.sizes.split(",")]:
            tree = (mnt or work) / f"ds{n}"
            t0 = time.monotonic()
            subprocess.run([sys.executable, "-m", "scripts.make_dataset", str(tree), "--images",
                            str(n), "--classes", "1000", "--small"], check=True, cwd=ROOT,
                           stdout=subprocess.DEVNULL)
            log(f"{n:,} files written in {time.monotonic() - t0:.0f} s ({a.where})")
            try:
                for fmt in a.formats.split(","):
                    if a.where == "disk":
                        r = plain_read(tree, a.readers)
                        r.update(size=n, where=a.where)
                        print(json.dumps(r), flush=True)
                        drop_caches()
                    r = convert(tree, work, fmt, a.workers, n)
                    r.update(size=n, where=a.where)
                    print(json.dumps(r), flush=True)
                    log(f"{r['step']} {n:,}: {r['wall_s']} s, {r['us_per_file']} us a file")
            finally:
                shutil.rmtree(tree, ignore_errors=True)
    finally:
        if mnt is not None:
            subprocess.run(["umount", str(mnt)], check=False)
            mnt.rmdir()
    log(f"peak RSS of this script {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
