"""Why a plain loop and `bench` disagreed by 1.24x on a busy machine: the scheduler's
autogroups. A benchmark, not a test: it prints figures and asserts nothing.

    .venv/bin/python -m scripts.bench_autogroup [--rounds 3] [--seconds 3] [--hogs 2]

With kernel.sched_autogroup_enabled=1 (Debian's default) the CFS scheduler shares the
CPUs between sessions first, then between the tasks of a session. bench's measurement
process starts a session of its own (start_new_session: so the whole process group can be
killed), as a job started from its own terminal or by a batch system does. A loop run in a
busy session (the test process, with CPU-bound neighbours in the same session) shares that
session's share. This script runs the same plain loop (scripts/bench_agreement.py's) in
both ways, interleaved, with --hogs busy loops started in this script's session, then
without them: where the two ways differ only with the hogs, the cause is the autogroup.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from scripts._common import ROOT
from scripts.bench_agreement import _HAND  # the same loop, word for word


def loop(ds: Path, cfg: dict, own_session: bool) -> float:
    out = subprocess.run([sys.executable, "-c", _HAND, str(ds), json.dumps(cfg)],
                         capture_output=True, text=True, check=True,
                         start_new_session=own_session,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    return json.loads(out.stdout.strip().splitlines()[-1])["images_per_s"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--hogs", type=int, default=2)
    args = ap.parse_args()
    from autotune.bench.config import BenchConfig
    from autotune.synth import make_image_folder

    try:
        enabled = Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()
    except OSError:
        enabled = "absent"
    tmp = Path(tempfile.mkdtemp(prefix="autotune-autogroup-", dir="/var/tmp"))
    try:
        ds = tmp / "train"
        make_image_folder(ds, 400, 4, seed=7, workers=1)
        cfg = BenchConfig.from_preset("decode-only", num_workers=2, batch_size=16,
                                      prefetch_factor=2, persistent_workers=True,
                                      seconds=args.seconds).to_dict()
        cfg["effective_warmup_batches"] = 4
        rows = []
        for hogs in (args.hogs, 0):
            procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                     for _ in range(hogs)]  # this session: no start_new_session
            try:
                same, own = [], []
                for _ in range(args.rounds):
                    same.append(loop(ds, cfg, False))
                    own.append(loop(ds, cfg, True))
            finally:
                for p in procs:
                    p.kill()
                    p.wait()
            rows.append((hogs, statistics.median(same), statistics.median(own)))
        print(f"kernel.sched_autogroup_enabled = {enabled}; {os.cpu_count()} CPUs; "
              f"400 images, decode-only, 2 workers, batch 16, {args.seconds:g} s windows, "
              f"median of {args.rounds}")
        print(f"{'busy loops in this session':>27} | {'loop in this session':>20} | "
              f"{'loop in its own session':>23} | own / this")
        for hogs, same, own in rows:
            print(f"{hogs:>27} | {same:>14,.0f} img/s | {own:>17,.0f} img/s | {own / same:.2f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
