"""A container's CPU quota, end to end: a real training loop (2 DataLoader workers decoding
generated JPEGs, autotune.instrument) run under `autotune monitor` inside a cgroup v1 cpu
cgroup with a 0.5-CPU quota (monitor and job both in it, as in a `docker run --cpus 0.5`
container), then analysed. A review saw this set-up read "runnable 145 %" for the main
process and a main-process verdict, with no word of the quota.

What noise cannot move: 2 workers that decode without pause want 2 CPUs, the quota gives
0.5, so the quota runs out in nearly every period it runs (the verdict's line is half of
them). The control runs the same loop in a cgroup without a quota: nothing is throttled,
and the verdict must not name a quota (which verdict it gives is the machine's).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.alone, pytest.mark.slow, pytest.mark.root]
REPO = Path(__file__).resolve().parents[2]
TRAIN_LOOP = Path(__file__).resolve().parent / "train_loop.py"


def _monitored_in(cg: Path, data: Path, out: Path) -> dict:
    cmd = ["sh", "-c", f'echo $$ > "{cg}/cgroup.procs" && exec "$@"', "sh",
           sys.executable, "-m", "autotune", "monitor", "--out", str(out), "--data", str(data),
           "--interval", "0.25", "--no-gpu", "--json", str(out / "analysis.json"), "--",
           sys.executable, str(TRAIN_LOOP), "--dataset", str(data), "--workers", "2",
           "--step-ms", "10", "--steps", "30", "--batch-size", "8"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    print(r.stdout[r.stdout.find("Verdict:"):])   # shown with -s, and on a failure
    d = json.loads((out / "analysis.json").read_text())
    d["_run"] = json.loads((out / "run.json").read_text())
    d["_header"] = json.loads((out / "steps.jsonl").read_text().splitlines()[0])
    return d


def _explain(d: dict) -> str:
    v = d["verdict"]
    return f"{v['bottleneck']}: {v['summary']}\n" + "\n".join(v["evidence"])


def test_a_half_cpu_quota_is_named_with_its_fix(cpu_cgroup, an_dataset, tmp_path):
    base, make = cpu_cgroup
    cg = make(base, 0.5)
    d = _monitored_in(cg, an_dataset, tmp_path / "run")
    q = d["metrics"]["cpu_quota"]
    assert q["cores"] == pytest.approx(0.5) and q["quota_file"] == f"{cg}/cpu.cfs_quota_us"
    assert q["throttled_share"] >= 0.5, q
    assert d["_run"]["cpu_quota"]["throttled_share"] >= 0.5, d["_run"]["cpu_quota"]
    assert d["_header"]["cores"] == pytest.approx(0.5)      # not a whole core
    v = d["verdict"]
    assert v["summary"].startswith("decode-bound (a CPU quota): the job's cgroup allows 0.5 "
                                   f"CPU ({cg}/cpu.cfs_quota_us)"), _explain(d)
    assert "docker run --cpus" in v["advice"][0] and "py-spy" not in " ".join(v["advice"])


def test_the_same_loop_without_a_quota_names_none(cpu_cgroup, an_dataset, tmp_path):
    base, make = cpu_cgroup
    cg = make(base, None)
    d = _monitored_in(cg, an_dataset, tmp_path / "run")
    q = d["metrics"]["cpu_quota"]
    assert q["cores"] is None and q["throttled"] == 0, q
    assert "quota" not in d["verdict"]["summary"].lower(), _explain(d)
    assert not any("CPU quota" in e for e in d["verdict"]["evidence"]), _explain(d)
