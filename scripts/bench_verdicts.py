"""The verdict matrix: a plain PyTorch training script (scripts/verdict_train.py, no
autotune import, pytorch/examples log lines) run under `autotune monitor`, then
`autotune analyze` on what the monitor wrote, in set-ups whose cause is known:

    iops-cap      4 workers, the dataset on a loop disk of its own capped at --iops read
                  IOPS (cgroup blkio), cold                             -> storage
    fuse-latency  2 workers behind a FUSE delay of --delay-ms per open and read, the
                  probe's by-concurrency figures given                   -> loader (latency),
                                                   or storage (latency) beyond the bound
    cpu-heavy     a worker per core, a CPU-heavy augmentation, 10 ms step -> decode
    zero-workers  num_workers=0, 100 ms step                             -> loader
    long-step     2 workers, 600 ms step                                 -> compute

    sudo .venv/bin/python -m scripts.bench_verdicts [--repeat 2] [--only iops-cap,...] [--json FILE]

Root for the cap and the FUSE mount (without it those set-ups are skipped, said so).
Prints a table (set-up, verdict, expected, budget per class, AU) and, with --json, every
run's verdict, budget and AU. The verdict is decided from the monitor's time budget: a
monitor that does not record one yet gives `unknown` (naming the missing budget) for every
input-bound set-up; the table says so in its budget column. Set-up code is shared with the
other benchmarks (autotune.emulate.setups).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from autotune.emulate.setups import enter_setup, own_disk
from scripts._common import ROOT, log

TRAIN = ROOT / "scripts" / "verdict_train.py"   # run as a file: a stranger's job
CPUS = 2   # every set-up runs on 2 CPUs (verdict_train --cpus), whatever the machine has

# name: (storage set-up, train args, expected verdict labels, needs root, probe it)
SETUPS: dict[str, tuple[str, list[str], tuple[str, ...], bool, bool]] = {
    "iops-cap": ("cap", ["--workers", "4", "--step-ms", "20", "--steps", "40"],
                 ("storage",), True, False),
    "fuse-latency": ("fuse", ["--workers", "2", "--step-ms", "20", "--steps", "40"],
                     ("loader (latency)", "storage (latency)"), True, True),
    "cpu-heavy": ("unthrottled", ["--workers", str(CPUS), "--step-ms", "10", "--steps", "24",
                                  "--heavy"], ("decode",), False, False),
    "zero-workers": ("unthrottled", ["--workers", "0", "--step-ms", "100", "--steps", "50"],
                     ("loader",), False, False),
    "long-step": ("unthrottled", ["--workers", "2", "--step-ms", "600", "--steps", "25"],
                  ("compute",), False, False),
}
BATCH = 16


def label(v: dict[str, Any]) -> str:
    """'storage (throughput)', 'loader (latency)', ... from a verdict's summary."""
    s = v.get("summary", "")
    for q in ("(latency)", "(throughput)", "(main process)", "(too few workers: 0)"):
        if q in s.split(":")[0]:
            return f"{v['bottleneck']} {q}"
    return v["bottleneck"]


def budget_cell(metrics: dict[str, Any] | None) -> str:
    """'workers: io 85 % cpu 7 % idle 8 % | main: ...', or why there is none."""
    b = (metrics or {}).get("budget")
    if not b or not b.get("available", True):
        return "missing (the monitor recorded no time budget)"
    out = []
    for name in ("workers", "main"):
        c = (b.get("classes") or {}).get(name)
        if not c or not c.get("process_seconds"):
            continue
        sh = c.get("shares") or {}
        blocked = sh.get("io", 0) + sh.get("storage_wait", 0)
        cpu = sh.get("on_cpu", 0) + sh.get("runnable", 0)
        out.append(f"{name} ({c.get('processes')}): blocked {blocked:.0%} cpu {cpu:.0%} "
                   f"asleep {sh.get('asleep', 0):.0%}")
    return " | ".join(out) or "empty"


def run_one(name: str, i: int, ds: Path, cap_ds: Path | None, out: Path,
            a: argparse.Namespace) -> dict[str, Any]:
    kind, args, expect, _, probe_it = SETUPS[name]
    run_dir = out / f"{name}-{i + 1}"
    py = sys.executable
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with ExitStack() as st:
        src = cap_ds if kind == "cap" and cap_ds is not None else ds
        path, watch, cap = enter_setup(st, kind, src, iops=a.iops, delay_ms=a.delay_ms,
                                       name=f"verdicts-{name}")
        if cap is not None:
            from autotune.cache import evict_files

            evict_files(p for p in Path(path).rglob("*.jpg"))   # cold: from the capped disk
        probe = None
        if probe_it:
            probe = run_dir / "probe.json"
            run_dir.mkdir(parents=True, exist_ok=True)
            # --warm: no machine-wide drop_caches (neighbours); FUSE opens pay the delay anyway.
            subprocess.run([py, "-m", "autotune", "probe", str(path), "--no-fio", "--warm",
                            "--replay-files", "200", "--replay-seconds", "2", "--concurrency",
                            "1,2,8,32", "--json", str(probe), "-q"], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
            probe = probe if probe.is_file() else None
        cmd = [py, "-m", "autotune", "monitor", "--out", str(run_dir), "--data",
               str(watch or path), "--interval", "0.25", "--no-gpu", "--no-analysis", "-q",
               "--", py, str(TRAIN), "--data", str(path), "--batch-size", str(BATCH),
               "--cpus", str(CPUS), *args]
        runner = cap.run if cap is not None else subprocess.run
        r = runner(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    if r.returncode != 0:
        return {"setup": name, "run": i + 1, "error": (r.stdout + r.stderr)[-2000:]}
    an = run_dir / "analysis.json"
    acmd = [py, "-m", "autotune", "analyze", str(run_dir), "--batch-size", str(BATCH), "-q",
            "--json", str(an)] + (["--probe", str(probe)] if probe else [])
    r = subprocess.run(acmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    if r.returncode != 0 or not an.is_file():
        return {"setup": name, "run": i + 1, "error": (r.stdout + r.stderr)[-2000:]}
    d = json.loads(an.read_text())
    v = d["verdict"]
    lab = label(v)
    return {"setup": name, "run": i + 1, "verdict": lab, "expected": list(expect),
            "right": any(lab.startswith(e) for e in expect), "au": d.get("au"),
            "budget": (d.get("metrics") or {}).get("budget"),
            "budget_cell": budget_cell(d.get("metrics")), "summary": v["summary"],
            "evidence": v["evidence"], "dir": str(run_dir)}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| set-up | run | verdict | expected | right | AU | budget (per class) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['setup']} | {r['run']} | failed | - | no | - | "
                         f"{r['error'].strip().splitlines()[-1] if r['error'].strip() else '?'} |")
            continue
        au = "-" if r["au"] is None else f"{r['au']:.2f}"
        lines.append(f"| {r['setup']} | {r['run']} | {r['verdict']} | {' or '.join(r['expected'])} "
                     f"| {'yes' if r['right'] else 'NO'} | {au} | {r['budget_cell']} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each set-up (default 2)")
    ap.add_argument("--only", default="", help="comma-separated set-ups (default: all)")
    ap.add_argument("--iops", type=int, default=100, help="the cap's read IOPS (default 100)")
    ap.add_argument("--delay-ms", type=float, default=30.0, help="FUSE delay (default 30 ms)")
    ap.add_argument("--images", type=int, default=800, help="generated JPEGs (default 800)")
    ap.add_argument("--out", default=str(ROOT / "out" / "bench_verdicts"))
    ap.add_argument("--json", default=None, help="write every run's figures to FILE")
    a = ap.parse_args()
    names = [n for n in (a.only.split(",") if a.only else SETUPS) if n]
    bad = [n for n in names if n not in SETUPS]
    if bad:
        raise SystemExit(f"unknown set-up(s) {', '.join(bad)}: use {', '.join(SETUPS)}")
    root = os.geteuid() == 0
    out = Path(a.out)
    rows: list[dict[str, Any]] = []
    with ExitStack() as st:
        work = Path(st.enter_context(tempfile.TemporaryDirectory(prefix="verdicts-", dir="/var/tmp")))
        ds = work / "train"
        log(f"generating {a.images} JPEGs under {ds}")
        subprocess.run([sys.executable, str(TRAIN), "--data", str(ds), "--make", str(a.images)],
                       check=True)
        cap_ds = None
        if root and any(SETUPS[n][0] == "cap" for n in names):
            (work / "own").mkdir()
            cap_ds = own_disk(st, ds, work / "own")   # a disk of its own: the cap slows it alone
        for n in names:
            if SETUPS[n][3] and not root:
                log(f"{n}: skipped (needs root: a cgroup cap or a FUSE mount)")
                continue
            for i in range(a.repeat):
                log(f"{n}, run {i + 1} of {a.repeat}")
                r = run_one(n, i, ds, cap_ds, out, a)
                log(f"  -> {r.get('verdict', 'failed')}")
                rows.append(r)
    print(table(rows))
    if any(r.get("budget") is None and "error" not in r for r in rows):
        print("\nbudget 'missing': the monitor recorded no time budget, so every input-bound "
              "verdict is unknown, naming it (the verdict is decided from the budget).")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0 if rows and all(r.get("right") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
