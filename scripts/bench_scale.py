#!/usr/bin/env python3
"""Every command at ImageNet's file count: how time and memory grow with the files.

    .venv/bin/python -m scripts.bench_scale --sizes 20000,200000,1281167 --rounds 3 \\
        --work /var/tmp/autotune-scale --json out/scale.json

For each size: a tree of small distinct JPEGs in 1,000 classes (scripts.make_dataset
--small; its time is reported, not part of the rounds), then per round, each step as its
own process tree, in this order: `probe` (the cold replay only: fio's figure does not
depend on the files), `search` (a few warm trials, no probe), `convert` to WebDataset and
to LMDB, `stage` of the WebDataset, and one epoch through `autotune.open_dataset` (the
staged WebDataset) and through `autotune.DataLoader` (the image folder, map-style), both
with 2 workers: decoded up to --decode-max files, bytes only above (a decoded epoch of
1.28 M files takes about an hour on 2 cores). Each output is deleted once measured.

Before each step the page cache is dropped (root; --warm leaves it), so that every size
starts cold: its data read from the disk once, as a job's first epoch. Per step: wall seconds, files/s, the process tree's peak memory (the command's RSS plus
its descendants' PSS: shared pages counted once across workers, sampled every 0.1 s),
the tree's peak open file descriptors, the bytes written to the disk holding --work during
the step (the disk's own sector count, synced before and after: the whole machine's writes
to that disk, so run it on a quiet machine; /proc/PID/io cannot say it, since a parent's
figures include the children it reaped) and the load average (1 min) before and after. Medians over
rounds. Per-file cost and memory per file are then compared across sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from scripts._common import ROOT, log

EPOCH = r"""
import sys, time, torch
import autotune
from autotune import open_dataset
path, decode, kind = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
import numpy as np
def tf(img):   # decode happened in the reader; a crop and a tensor, as a training transform
    return torch.from_numpy(np.asarray(img.resize((64, 64))))
if not decode:
    tf = None
collate = (lambda b: b) if not decode else None
if kind == "open_dataset":
    ds = open_dataset(path, tf, decode=decode, shuffle=True, drop_last=False)
    dl = torch.utils.data.DataLoader(ds, batch_size=256, num_workers=2, collate_fn=collate)
else:
    ds = open_dataset(path, tf, decode=decode, format="folder")
    dl = autotune.DataLoader(ds, batch_size=256, shuffle=True, num_workers=2, collate_fn=collate)
n = 0
for batch in dl:
    n += len(batch) if collate else len(batch[0])
print(n)
"""


def _kib(path: str, field: bytes) -> int:
    """The figure after `field` in a /proc file of `FIELD: N kB` lines."""
    try:
        with open(path, "rb") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Watch:
    """Samples a process tree until it exits: peak memory and open descriptors."""

    def __init__(self, pid: int, period: float = 0.1):
        self.pid, self.period = pid, period
        self.peak_kib = self.peak_fds = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        from autotune.monitor.proctree import read_rss_bytes
        from autotune.runqueue import descendants

        while not self._stop.is_set():
            pids = descendants(self.pid)
            mem = read_rss_bytes(self.pid) // 1024
            mem += sum(_kib(f"/proc/{p}/smaps_rollup", b"Pss:") for p in pids[1:])
            fds = 0
            for p in pids:
                try:
                    fds += len(os.listdir(f"/proc/{p}/fd"))
                except OSError:
                    pass
            self.peak_kib, self.peak_fds = max(self.peak_kib, mem), max(self.peak_fds, fds)
            self._stop.wait(self.period)

    def stop(self) -> None:
        self._stop.set()
        self._t.join()


def _sectors_written(path: Path) -> int:
    """The disk holding `path`: sectors written since boot (/sys/dev/block/M:m/stat)."""
    st = os.stat(path)
    f = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat")
    return int(f.read_text().split()[6])


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def run_step(name: str, cmd: list[str], files: int, disk: Path, cold: bool = True) -> dict:
    """Run one step as its own process tree; its figures, or SystemExit naming the failure.
    cold: the page cache dropped first (root), so that every size starts alike: a tree
    just generated is in the cache, one a probe or another job dropped is not."""
    os.sync()
    if cold:
        from autotune.cache import drop_caches

        drop_caches(3)
    sect0, load0, t0 = _sectors_written(disk), _load(), time.monotonic()
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    w = Watch(p.pid)
    out_f, err_f = p.stdout, p.stderr
    out, err = [], []
    readers = [threading.Thread(target=lambda f=f, b=b: b.append(f.read()), daemon=True)
               for f, b in ((out_f, out), (err_f, err))]
    for r in readers:
        r.start()
    _, status, _ = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    os.sync()   # the step's dirty pages, written out before the disk's counter is read
    written = (_sectors_written(disk) - sect0) * 512
    w.stop()
    for r in readers:
        r.join()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"{name} exited {p.returncode}: {' '.join(cmd)}\n{''.join(err)[-3000:]}")
    return {"step": name, "files": files, "wall_s": round(wall, 2),
            "files_per_s": round(files / wall, 1), "peak_mib": round(w.peak_kib / 1024, 1),
            "peak_fds": w.peak_fds, "written_mib": round(written / 2**20, 1),
            "load_before": load0, "load_after": _load(), "stdout": "".join(out)[-200:]}


def steps(size: int, data: Path, work: Path, decode: bool, trials: int) -> list[tuple]:
    """(name, command, output to delete after) in run order."""
    at = [sys.executable, "-m", "autotune"]
    py = [sys.executable, "-c", EPOCH]
    return [
        ("probe", at + ["probe", str(data), "--no-fio", "--json", str(work / "probe.json")],
         work / "probe.json"),
        ("search", at + ["search", str(data), "--trials", str(trials), "--warm", "--no-probe",
                         "--batch-size", "64", "--out", str(work / "search")],
         work / "search"),
        ("convert wds", at + ["convert", str(data), str(work / "wds"), "--format", "wds"], None),
        ("convert lmdb", at + ["convert", str(data), str(work / "lmdb"), "--format", "lmdb"],
         work / "lmdb"),
        ("stage wds", at + ["stage", str(work / "wds"), str(work / "staged")], work / "wds"),
        ("epoch open_dataset" + ("" if decode else " (bytes)"),
         py + [str(work / "staged"), "1" if decode else "0", "open_dataset"], work / "staged"),
        ("epoch autotune.DataLoader" + ("" if decode else " (bytes)"),
         py + [str(data), "1" if decode else "0", "DataLoader"], None),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="20000,200000,1281167")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--decode-max", type=int, default=200000,
                    help="decode in the epochs up to this many files, bytes only above")
    ap.add_argument("--only", default="", help="comma-separated step names to run (prefixes)")
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/autotune-scale"))
    ap.add_argument("--keep-data", action="store_true", help="keep each size's tree")
    ap.add_argument("--warm", action="store_true",
                    help="leave the page cache as it is (default: dropped before each step, "
                         "as root)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    only = [s for s in a.only.split(",") if s]
    results = []
    for size in (int(s) for s in a.sizes.split(",")):
        data = a.work / f"tree-{size}"
        t0 = time.monotonic()
        gen = subprocess.run([sys.executable, "-m", "scripts.make_dataset", str(data),
                              "--images", str(size), "--classes", str(min(1000, size)),
                              "--small"], cwd=ROOT, capture_output=True, text=True)
        if gen.returncode != 0:
            raise SystemExit(f"make_dataset exited {gen.returncode}: {gen.stderr[-2000:]}")
        log(f"{size}: {gen.stdout.strip()} ({time.monotonic() - t0:.0f} s)")
        for rnd in range(a.rounds):
            work = a.work / f"out-{size}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            for name, cmd, gone in steps(size, data, work, size <= a.decode_max, a.trials):
                if only and not any(name.startswith(o) for o in only):
                    continue
                r = run_step(name, cmd, size, a.work, cold=not a.warm)
                r["cache"] = "warm" if a.warm else "cold"
                r.update(size=size, round=rnd)
                results.append(r)
                log(f"{size} r{rnd} {name}: {r['wall_s']} s, {r['files_per_s']:.0f} files/s, "
                    f"peak {r['peak_mib']} MiB, {r['peak_fds']} fds, wrote {r['written_mib']} MiB,"
                    f" load {r['load_before']}->{r['load_after']}")
                if gone is not None:
                    shutil.rmtree(gone, ignore_errors=True) if gone.is_dir() else gone.unlink(
                        missing_ok=True)
            shutil.rmtree(work, ignore_errors=True)
        if not a.keep_data:
            shutil.rmtree(data, ignore_errors=True)
    table = summarize(results)
    print(table)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"rounds": results, "table": table}, indent=1))
    return 0


def summarize(results: list[dict]) -> str:
    """A Markdown table of medians per (step, size), with per-file cost against the smallest."""
    keys = sorted({(r["step"], r["size"]) for r in results},
                  key=lambda k: ([r["step"] for r in results].index(k[0]), k[1]))
    base: dict[str, tuple[float, float, int]] = {}
    rows = ["| step | files | wall s | files/s | µs/file (x smallest) | peak MiB "
            "(+B/file) | fds | written MiB | load |", "|" + "---|" * 9]
    for step, size in keys:
        rs = [r for r in results if (r["step"], r["size"]) == (step, size)]
        med = {k: statistics.median(r[k] for r in rs)
               for k in ("wall_s", "files_per_s", "peak_mib", "peak_fds", "written_mib")}
        load = statistics.median(r["load_before"] for r in rs)
        us = med["wall_s"] / size * 1e6
        b = base.setdefault(step, (us, med["peak_mib"], size))
        extra = ((med["peak_mib"] - b[1]) * 2**20 / (size - b[2])) if size > b[2] else 0.0
        rows.append(f"| {step} | {size:,} | {med['wall_s']:.1f} | {med['files_per_s']:,.0f} | "
                    f"{us:.0f} ({us / b[0]:.2f}x) | {med['peak_mib']:.0f} ({extra:+.0f}) | "
                    f"{med['peak_fds']:.0f} | {med['written_mib']:.0f} | {load:.1f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    raise SystemExit(main())
