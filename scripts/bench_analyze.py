"""The four verdicts of issue 7, each from a real training loop under `autotune monitor`:
runs tests/analyze/test_setups.py (compute, loader with 0 and 1 workers, decode, storage
behind an IOPS cap and behind a FUSE delay) --repeat times and tabulates what each
analysis said: verdict, AU, data-time share and the evidence lines.

    .venv/bin/python -m scripts.bench_analyze [--repeat 3] [--out out/bench_analyze]

The set-ups are the tests' (one place defines them); root for the cap and FUSE cases.
Prints markdown to stdout; every analysis JSON stays under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from scripts._common import ROOT

TESTS = ROOT / "tests" / "analyze" / "test_setups.py"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each set-up (default 3)")
    ap.add_argument("--out", default=str(ROOT / "out" / "bench_analyze"))
    a = ap.parse_args()
    out = Path(a.out)
    shutil.rmtree(out, ignore_errors=True)
    runs: dict[str, list[dict]] = defaultdict(list)
    for i in range(a.repeat):
        run_dir = out / f"run{i + 1}"
        env = {**os.environ, "AUTOTUNE_SETUPS_OUT": str(run_dir)}
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            str(TESTS)], cwd=ROOT, env=env, capture_output=True, text=True)
        last = (r.stdout.strip().splitlines() or [r.stderr.strip()[-300:]])[-1]
        print(f"run {i + 1}: pytest exit {r.returncode}: {last}", file=sys.stderr, flush=True)
        for f in sorted(run_dir.glob("*.json")):
            runs[f.stem].append(json.loads(f.read_text()))
    print(f"tests/analyze/test_setups.py, {a.repeat} runs; each row: one set-up, its verdicts\n")
    print("| set-up (test) | verdicts | AU (runs) | data-time share (runs) | expected |")
    print("|---|---|---|---|---|")
    expected = {"compute": "compute", "loader": "loader", "decode": "decode", "storage": "storage"}
    for name, ds in runs.items():
        want = next((v for k, v in expected.items() if f"_{k}_" in f"_{name}_"), "?")
        verdicts = [d["verdict"]["bottleneck"] for d in ds]
        au = ", ".join("-" if d.get("au") is None else format(d["au"], ".2f") for d in ds)
        share = ", ".join("-" if d.get("data_time_share") is None else
                          format(d["data_time_share"], ".2f") for d in ds)
        print(f"| {name.removeprefix('test_')} | {', '.join(verdicts)} | {au} | {share} | {want} |")
    print("\nEvidence (first run of each set-up):\n")
    for name, ds in runs.items():
        v = ds[0]["verdict"]
        print(f"**{name.removeprefix('test_')}** — {v['bottleneck']}: {v['summary']}")
        for e in v["evidence"]:
            print(f"- {e}")
        print(f"- next: `{v['next_command']}`\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
