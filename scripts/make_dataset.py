#!/usr/bin/env python3
"""Generate an ImageNet-like image folder (deterministic by seed; resumable).

    .venv/bin/python -m scripts.make_dataset DIR --images 20000 --classes 100 --seed 0

At ImageNet's count (1,281,167 files, 1,000 classes) real-sized images would be about
140 GB; --small writes distinct JPEGs of about 3 KiB each (a pool of rendered images, each
file with its index in a JPEG comment), about 5 GB on disk, in minutes:

    .venv/bin/python -m scripts.make_dataset DIR --images 1281167 --classes 1000 --small
"""

from __future__ import annotations

import argparse
import sys
import time

from autotune.synth import make_image_folder, make_scale_folder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", help="output folder (created; existing images are kept)")
    ap.add_argument("--images", type=int, default=20000)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    ap.add_argument("--small", action="store_true",
                    help="small distinct JPEGs (about 3 KiB) for file-count scale runs")
    a = ap.parse_args()
    t = time.monotonic()
    try:
        make = make_scale_folder if a.small else make_image_folder
        r = make(a.root, a.images, a.classes, seed=a.seed, workers=a.workers)
    except ValueError as e:
        print(f"make_dataset: error: {e}", file=sys.stderr)
        return 2
    dt = time.monotonic() - t
    if a.small:  # make_scale_folder counts only the bytes it wrote now
        print(f"{r.root}: {r.images} images in {r.classes} classes; {r.created} written now "
              f"({r.bytes / 2**20:.1f} MiB, mean {r.bytes / max(1, r.created) / 1e3:.1f} KB) "
              f"in {dt:.1f} s")
        return 0
    print(f"{r.root}: {r.images} images in {r.classes} classes, {r.bytes / 2**20:.1f} MiB "
          f"(mean {r.bytes / r.images / 1e3:.1f} KB); {r.created} written in {dt:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
