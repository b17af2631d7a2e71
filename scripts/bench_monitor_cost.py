#!/usr/bin/env python3
"""The task sampler's own cost: what sampling a real DataLoader job's threads costs the
monitor, in % of one core, and the rate it achieves.

The job: a real torch DataLoader with 8 worker processes over a small synthetic dataset
(each worker starts a small intra-op thread pool, so the tree holds >= 30 threads), with a
100 ms emulated step. The sampler (autotune.monitor.tasks.TaskSampler) runs in this
process, as in `autotune monitor`, and is asked for a budget every 0.5 s (the monitor's
interval). Printed: the sampler thread's CPU (time.thread_time of its own thread) and the
take() calls' CPU, as % of one core over the window, the achieved Hz, the threads seen.
Target: under 1 % of a core.

    PYTHONPATH=. .venv/bin/python -m scripts.bench_monitor_cost [--seconds 20] [--workers 8]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

JOB = r"""
import sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class Synthetic(Dataset):
    def __len__(self): return 1 << 20
    def __getitem__(self, i):
        x = torch.rand(3, 32, 32)
        return x * 2, i % 10

def init(_):
    torch.set_num_threads(int(sys.argv[2]))
    torch.ones(256, 256) @ torch.ones(256, 256)      # start the intra-op pool's threads

loader = DataLoader(Synthetic(), batch_size=32, num_workers=int(sys.argv[1]),
                    worker_init_fn=init, persistent_workers=True, prefetch_factor=2)
for n, batch in enumerate(loader):
    if n == 0:
        print("ready", flush=True)
    time.sleep(0.1)                                   # the step
"""


def tree_threads(pid: int) -> tuple[int, int]:
    from autotune.runqueue import descendants

    procs = descendants(pid)
    return len(procs), sum(len(os.listdir(f"/proc/{p}/task")) for p in procs
                           if os.path.isdir(f"/proc/{p}/task"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--worker-threads", type=int, default=3)
    ap.add_argument("--interval", type=float, default=0.5)
    args = ap.parse_args()

    from autotune.monitor.tasks import TaskSampler

    job = subprocess.Popen([sys.executable, "-c", JOB, str(args.workers),
                            str(args.worker_threads)], stdout=subprocess.PIPE,
                           start_new_session=True)
    try:
        assert job.stdout is not None
        if job.stdout.readline().strip() != b"ready":
            print("the job did not start (is torch installed in this python?)",
                  file=sys.stderr)
            return 1
        time.sleep(1.0)
        procs, threads = tree_threads(job.pid)
        sampler = TaskSampler(job.pid).start()
        t0, take_cpu, samples, seen = time.monotonic(), 0.0, 0, 0
        while time.monotonic() - t0 < args.seconds:
            time.sleep(args.interval)
            c = time.thread_time()
            b = sampler.take()
            take_cpu += time.thread_time() - c
            if b is not None:
                samples += b.samples
                seen = max(seen, sum(x.threads for x in b.classes.values()))
        wall = time.monotonic() - t0
        sampler.stop()
    finally:
        os.killpg(job.pid, 9)
        job.wait()
    print(f"job: {procs} processes, {threads} threads ({seen} seen by the sampler)")
    print(f"sampler thread: {sampler.cpu_s / wall * 100:.2f} % of one core; take(): "
          f"{take_cpu / wall * 100:.2f} %; together "
          f"{(sampler.cpu_s + take_cpu) / wall * 100:.2f} % (target < 1 %)")
    print(f"achieved {samples / wall:.1f} Hz ({samples} sweeps in {wall:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
