#!/usr/bin/env python3
"""Files/s a plain reader gets: open + one read of each whole file, as a DataLoader worker does.
No autotune import: the independent figure the probe's storage ceiling is checked against.
    python -m scripts.plain_reader DIR_OR_LIST --threads 16 --drop-caches 1 --seconds 20"""
import argparse, itertools, os, random, threading, time

ap = argparse.ArgumentParser()
ap.add_argument("files", help="a directory (walked) or a file listing one path a line")
ap.add_argument("--threads", type=int, default=16)
ap.add_argument("--drop-caches", type=int, default=1, choices=(0, 1, 3), help="0: keep the cache")
ap.add_argument("--seconds", type=float, default=20.0)
a = ap.parse_args()
if os.path.isdir(a.files):
    paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(a.files) for f in fs)
else:
    paths = open(a.files).read().split("\n")
paths = [p for p in paths if p]
random.Random(0).shuffle(paths)
for p in paths:  # a run has listed its files: their inodes are loaded (level 1 keeps them)
    os.stat(p)
if a.drop_caches:
    os.sync()
    open("/proc/sys/vm/drop_caches", "w").write(f"{a.drop_caches}\n")
nxt, done, t0 = itertools.count(), [], time.monotonic()

def work():
    n = 0
    while time.monotonic() - t0 < a.seconds and (i := next(nxt)) < len(paths):
        with open(paths[i], "rb") as f:
            f.read()
        n += 1
    done.append((n, time.monotonic()))

ts = [threading.Thread(target=work) for _ in range(a.threads)]
[t.start() for t in ts]; [t.join() for t in ts]
n, end = sum(k for k, _ in done), max(e for _, e in done)
print(f"{n / (end - t0):.1f} files/s ({n} files in {end - t0:.1f} s, {a.threads} threads, drop_caches={a.drop_caches})")
