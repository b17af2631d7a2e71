"""The monitor's memory cgroup figures, and analyze naming an OOM kill (a user's walk: a job
the kernel killed at its container's memory limit read as "killed by SIGKILL" with "its
output, with the error, is in train.log", which held no error, and nothing of memory).

Real: `autotune monitor` in a cgroup v1 memory cgroup of its own (root), a job that
passes the limit and one that stays well under it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from autotune.monitor.memcg import oom_kills

ROOT = Path(__file__).resolve().parents[2]
MiB = 2**20

_HOG = """
import sys, time
held = []
for i in range(int(sys.argv[1])):
    b = bytearray(20 * 2**20)
    b[::4096] = b"x" * len(b[::4096])   # touched: the cgroup is charged
    held.append(b)
    print("allocated", (i + 1) * 20, "MiB", flush=True)
    time.sleep(0.05)
"""


def _monitored(cg: Path, out: Path, chunks: int) -> subprocess.CompletedProcess:
    hog = out.parent / "hog.py"
    hog.write_text(_HOG)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        ["sh", "-c", f'echo $$ > "{cg}/cgroup.procs" && exec "$@"', "sh", sys.executable,
         "-m", "autotune", "monitor", "--interval", "0.2", "--no-analysis", "--out", str(out),
         "--", sys.executable, str(hog), str(chunks)],
        capture_output=True, text=True, timeout=180, env=env)


def test_an_oom_kill_at_the_memory_limit_is_counted_and_named(tmp_path, memory_cgroup):
    with memory_cgroup(300 * MiB) as cg:
        r = _monitored(cg, tmp_path / "oom", 40)     # 800 MiB into 300
    run = json.loads((tmp_path / "oom" / "run.json").read_text())
    assert run["returncode"] == 137 and run["signal"] == 9, (run, r.stderr[-2000:])
    mem = run["memory"]
    assert mem["limit_bytes"] == 300 * MiB and mem["oom_kills"] >= 1, mem
    assert mem["limit_file"].endswith("memory.limit_in_bytes"), mem
    samples = [json.loads(line) for line in (tmp_path / "oom" / "metrics.jsonl").open()]
    assert any((s.get("memcg") or {}).get("working_set_bytes", 0) > 100 * MiB
               for s in samples), samples[-1]
    a = subprocess.run([sys.executable, "-m", "autotune", "analyze", str(tmp_path / "oom")],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    said = " ".join(a.stderr.split())
    assert a.returncode == 2, said                # no step logged: the failure is the answer
    assert "the memory limit was the likely cause" in said, said
    assert "OOM killer ended 1 process(es)" in said and "limit 300 MiB" in said, said
    assert "with the error" not in said, said     # the kill printed nothing


def test_a_job_well_under_its_limit_is_told_nothing_of_memory(tmp_path, memory_cgroup):
    with memory_cgroup(600 * MiB) as cg:
        r = _monitored(cg, tmp_path / "ok", 3)        # 60 MiB into 600
    run = json.loads((tmp_path / "ok" / "run.json").read_text())
    assert run["returncode"] == 0, r.stderr[-2000:]
    assert run["memory"]["oom_kills"] == 0 and run["memory"]["limit_bytes"] == 600 * MiB
    assert run["memory"]["peak_working_set_bytes"] < 300 * MiB, run["memory"]


def test_oom_kill_counters_of_both_cgroup_versions(tmp_path):
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    assert oom_kills(tmp_path, "v1") == 3
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\n"
                                            "oom_group_kill 0\n")
    assert oom_kills(tmp_path, "v2") == 2
    assert oom_kills(tmp_path / "missing", "v2") is None
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\n")
    assert oom_kills(tmp_path, "v1") is None      # a kernel before 4.13 does not count


def test_v2_memory_high_is_no_kill_limit_its_max_above_is(tmp_path):
    """A review: under cgroup v2 the tightest limit may be memory.high, which throttles
    and kills nothing; the OOM figures take the memory.max that binds, here or above."""
    from autotune.monitor.memcg import v2_max

    pod = tmp_path / "pod"
    job = pod / "job"
    job.mkdir(parents=True)
    (pod / "memory.max").write_text(f"{800 * MiB}\n")
    (job / "memory.max").write_text("max\n")
    (job / "memory.high").write_text(f"{300 * MiB}\n")
    assert v2_max(job) == (800 * MiB, pod / "memory.max")
    (pod / "memory.max").write_text("max\n")
    assert v2_max(job) is None
