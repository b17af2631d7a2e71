#!/usr/bin/env python3
"""Generate an ImageNet-like image folder (deterministic by seed; resumable).

    .venv/bin/python -m scripts.make_dataset DIR --images 20000 --classes 100 --seed 0
"""

from __future__ import annotations

import argparse
import sys
import time

from autotune.synth import make_image_folder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", help="output folder (created; existing images are kept)")
    ap.add_argument("--images", type=int, default=20000)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    a = ap.parse_args()
    t = time.monotonic()
    try:
        r = make_image_folder(a.root, a.images, a.classes, seed=a.seed, workers=a.workers)
    except ValueError as e:
        print(f"make_dataset: error: {e}", file=sys.stderr)
        return 2
    dt = time.monotonic() - t
    print(f"{r.root}: {r.images} images in {r.classes} classes, {r.bytes / 2**20:.1f} MiB "
          f"(mean {r.bytes / r.images / 1e3:.1f} KB); {r.created} written in {dt:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
