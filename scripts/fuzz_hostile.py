"""A longer run of the hostile-input suite (tests/hostile): many more generated cases than
CI's, with the figures a note can quote (cases tried per property, failures found).

    .venv/bin/python -m scripts.fuzz_hostile                 # 2,000 cases per property
    .venv/bin/python -m scripts.fuzz_hostile --examples 300 -k tar
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from scripts._common import ROOT


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=2000, help="cases per property (2000)")
    ap.add_argument("-k", default=None, help="pytest -k expression: only these properties")
    a = ap.parse_args()
    env = dict(os.environ, HYPOTHESIS_PROFILE="long", HOSTILE_EXAMPLES=str(a.examples))
    cmd = [sys.executable, "-m", "pytest", str(ROOT / "tests/hostile"), "-q", "-p",
           "no:cacheprovider", "--hypothesis-show-statistics"] + (["-k", a.k] if a.k else [])
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    out = r.stdout + r.stderr
    tried = failed = 0
    print(f"{'property':<42} {'cases':>7} {'failing':>8}")
    for m in re.finditer(r"test_hostile\.py::(\w+):\n(.*?)(?=\n\S|\Z)", out, re.S):
        body = m.group(2)
        ok = sum(int(x) for x in re.findall(r"(\d+) passing", body))
        bad = sum(int(x) for x in re.findall(r"(\d+) failing", body))
        tried, failed = tried + ok + bad, failed + bad
        print(f"{m.group(1):<42} {ok + bad:>7,} {bad:>8,}")
    summary = out.strip().splitlines()[-1] if out.strip() else ""
    print(f"\n{tried:,} cases, {failed:,} failing, {time.monotonic() - t0:.0f} s; pytest: {summary}")
    if r.returncode:
        print(out[-6000:], file=sys.stderr)
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
