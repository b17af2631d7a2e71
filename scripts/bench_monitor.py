#!/usr/bin/env python3
"""Measure the system monitor: its CPU overhead at 0.5 s and its agreement with iostat.

    .venv/bin/python -m scripts.bench_monitor [--seconds 20] [--dir /tmp] [--json out.json]

1. Overhead: the monitor watches a disk, a process tree (a parent with 8 idle children,
   like DataLoader workers) and NVML for --seconds while this process sleeps. Reported two
   ways: the sampler thread's own CPU time (time.thread_time), and this process's CPU time
   with the monitor minus an idle baseline without it.
2. Cross-check: fio reads a scratch file this script creates (random 4 KiB, then
   sequential 1 MiB, direct=1) while iostat -x, a one-shot diskstats pair and the monitor
   measure the same 3 s; prints r/s and rMB/s of each and monitor/iostat ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from autotune.monitor import SystemMonitor, iostat_crosscheck, resolve_disk

WORKERS = """
import subprocess, sys, time
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(8)]
print("ready", flush=True)
time.sleep(600)
"""


def _cpu_s() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


def measure_overhead(path: str, seconds: float, interval: float) -> dict:
    parent = subprocess.Popen([sys.executable, "-c", WORKERS], stdout=subprocess.PIPE, text=True)
    try:
        parent.stdout.readline()   # children started
        idle_s = min(5.0, seconds / 2)
        c0 = _cpu_s()
        time.sleep(idle_s)
        idle_rate = (_cpu_s() - c0) / idle_s
        c0, t0 = _cpu_s(), time.monotonic()
        with SystemMonitor(path=path, pid=parent.pid, interval=interval, gpu=True) as mon:
            time.sleep(seconds)
        wall = time.monotonic() - t0
        proc_rate = (_cpu_s() - c0) / wall
        oh = mon.overhead()
        recs = mon.records
        return {
            "interval_s": interval, "seconds": round(wall, 2), "samples": len(recs),
            "tree_processes": getattr(recs[-1].proc, "processes", None) if recs else None,
            "gpu": recs[-1].gpu.to_dict() if recs else None,
            "thread_cpu_s": oh["cpu_s"],
            "thread_startup_cpu_s": oh["startup_cpu_s"],
            "thread_pct_of_core": oh["pct_of_core"],
            "thread_steady_pct_of_core": oh["steady_pct_of_core"],
            "per_sample_ms": oh["per_sample_ms"],
            "process_pct_of_core_minus_idle": (proc_rate - idle_rate) * 100.0,
            "idle_baseline_pct_of_core": idle_rate * 100.0,
        }
    finally:
        for k in psutil.Process(parent.pid).children(recursive=True):
            k.kill()
        parent.kill()
        parent.wait()


def _write_scratch(path: Path, size: int) -> None:
    chunk = os.urandom(1 << 20)
    with open(path, "xb") as f:   # "x": fio only ever gets a file we just created
        for _ in range(size >> 20):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


def crosscheck(scratch_dir: Path, job: list[str], seconds: int) -> dict:
    scratch = scratch_dir / "fio-scratch.bin"
    cmd = ["fio", "--name=bench-monitor", f"--filename={scratch}", "--direct=1",
           "--ioengine=libaio", "--time_based", f"--runtime={seconds + 3}",
           f"--size={scratch.stat().st_size}", "--output-format=terse", *job]
    fio = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(1.0)
        if fio.poll() is not None:
            raise SystemExit(f"fio failed: {fio.stderr.read().decode().strip()}")
        res = iostat_crosscheck(scratch_dir, seconds=seconds)
    finally:
        fio.terminate()
        fio.wait()
    res["fio_job"] = job
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0, help="overhead window (default 20)")
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--dir", default=tempfile.gettempdir(),
                    help="filesystem for the scratch file (a fresh subdirectory is made)")
    ap.add_argument("--rate-iops", type=int, default=20000,
                    help="fio rate cap for the random job, 0 = none (others share the disk)")
    ap.add_argument("--rate-mib", type=int, default=300,
                    help="MiB/s cap for the sequential job, 0 = none")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args()

    scratch_dir = Path(tempfile.mkdtemp(prefix="autotune-bench-monitor-", dir=args.dir))
    out: dict = {}
    try:
        dev = resolve_disk(scratch_dir)
        print(f"device: {getattr(dev, 'name', None) or dev}")
        oh = measure_overhead(str(scratch_dir), args.seconds, args.interval)
        out["overhead"] = oh
        print(f"overhead at {oh['interval_s']} s over {oh['seconds']} s ({oh['samples']} "
              f"samples, tree of {oh['tree_processes']} processes, gpu: {oh['gpu']}):")
        print(f"  sampler thread CPU: {oh['thread_pct_of_core']:.3f} % of one core in all; "
              f"{oh['thread_steady_pct_of_core']:.3f} % without the one-time start "
              f"({oh['thread_startup_cpu_s'] * 1000:.1f} ms), "
              f"{oh['per_sample_ms']:.2f} ms per sample")
        print(f"  process CPU minus idle baseline: {oh['process_pct_of_core_minus_idle']:.3f} % "
              f"of one core (idle baseline {oh['idle_baseline_pct_of_core']:.3f} %)")
        if shutil.which("fio") is None or shutil.which("iostat") is None:
            print("cross-check skipped: fio and iostat (sysstat) are needed")
        elif not hasattr(dev, "name"):
            print(f"cross-check skipped: {dev}")
        else:
            _write_scratch(scratch_dir / "fio-scratch.bin", 256 << 20)
            rand = ["--rw=randread", "--bs=4k", "--iodepth=16"]
            if args.rate_iops:
                rand.append(f"--rate_iops={args.rate_iops}")
            seq = ["--rw=read", "--bs=1m", "--iodepth=4"]
            if args.rate_mib:
                seq.append(f"--rate={args.rate_mib}m")
            out["crosscheck"] = []
            for job in (rand, seq):
                r = crosscheck(scratch_dir, job, seconds=3)
                out["crosscheck"].append(r)
                print(f"cross-check on {r['device']} over {r['seconds']} s, "
                      f"fio {' '.join(job)}:")
                io, mo, one = r["iostat"], r["monitor"], r["oneshot"]
                for k, label in (("reads_per_s", "r/s"), ("read_mib_s", "rMB/s (MiB)")):
                    print(f"  {label:12s} iostat {io[k]:10.1f}  monitor {mo[k]:10.1f}"
                          f"  one-shot {one[k]:10.1f}  monitor/iostat {r['ratio'][k]:.4f}")
                for k, label in (("r_await_ms", "r_await ms"), ("aqu_sz", "aqu-sz"),
                                 ("util_pct", "%util")):
                    print(f"  {label:12s} iostat {io[k]:10.2f}  monitor {mo[k]:10.2f}")
    finally:
        shutil.rmtree(scratch_dir, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
