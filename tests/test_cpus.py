"""CPU limit of the process's own cgroup (issue #13 item 9).

The real tests create cgroup v1 cpu cgroups with a quota, start a Python process inside
and ask it what it may use. The parser tests on fake /proc files in tmp_path are in
addition to them (cgroup v2 and container mount roots, which this machine cannot show).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.cpus import CpuStat, cgroup_quotas, cpu_limit, parse_cpu_stat, quota_of

REPO = Path(__file__).resolve().parents[1]

# What a process inside the cgroup reports, through every caller that sizes workers or
# the decode ceiling.
REPORT = """\
import json
from autotune import cpus
from autotune.data import presets
from autotune.search import ceilings
from autotune.cli import convert
from autotune import instrumentation
print(json.dumps({"header": instrumentation._usable_cores(), "limit": cpus.cpu_limit().to_dict(), "usable": cpus.usable_cores(),
                  "convert": convert._default_workers(),
                  "presets": presets.usable_cores(), "effective": ceilings.effective_cores(),
                  "quota": ceilings.cpu_quota_cores(),
                  "cgroup": open("/proc/self/cgroup").read()}))
"""


def _report_in(cg: Path) -> dict:
    """Start a process that moves itself into `cg` before Python starts, and its report."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run(["sh", "-c", f'echo $$ > "{cg}/cgroup.procs" && exec "$@"', "sh",
                        sys.executable, "-c", REPORT], capture_output=True, text=True,
                       timeout=60, env=env, check=False)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    own = [ln for ln in d["cgroup"].splitlines() if "cpu" in ln.split(":")[1].split(",")]
    path = own[0].split(":", 2)[2].rstrip("/") + "/" if own else "?"
    assert f"{cg}/".endswith(path), d["cgroup"]  # it really ran in there
    return d


def _needs_two_cpus() -> int:
    n = len(os.sched_getaffinity(0))
    if n < 2:
        pytest.skip("1 CPU in the affinity mask: a 1-core quota could not be told apart")
    return n


@pytest.mark.root
def test_one_core_quota_on_own_cgroup(cpu_cgroup):
    n = _needs_two_cpus()
    base, make = cpu_cgroup
    outside = _report_in(base)  # control: the same process without a quota
    assert outside["usable"] == outside["presets"] == outside["effective"] == n
    assert outside["convert"] == min(8, n)
    assert outside["header"] == n and isinstance(outside["header"], int)
    cg = make(base, 1.0)
    d = _report_in(cg)
    assert d["usable"] == d["presets"] == d["effective"] == d["convert"] == 1
    assert d["quota"] == pytest.approx(1.0)
    assert d["limit"]["source"].startswith(f"cgroup CPU quota {cg}/cpu.cfs_quota_us")


@pytest.mark.root
def test_ancestor_quota_binds_a_child_without_one(cpu_cgroup):
    _needs_two_cpus()
    base, make = cpu_cgroup
    parent = make(base, 1.0)
    child = make(parent, None)  # a job step in a limited job: no quota of its own
    d = _report_in(child)
    assert d["usable"] == d["presets"] == d["effective"] == 1
    assert str(parent / "cpu.cfs_quota_us") in d["limit"]["source"]


@pytest.mark.root
def test_fractional_quota_and_the_smaller_of_two(cpu_cgroup):
    """1.5 cores: 1 whole core for workers, 1.5 for the decode ceiling. Under it a child
    with 1 core: the smaller one binds. (cgroup v1 refuses a child quota above its
    parent's with EINVAL, so the larger-child case is the v2 parser test below.)"""
    _needs_two_cpus()
    base, make = cpu_cgroup
    parent = make(base, 1.5)
    d = _report_in(parent)
    assert d["limit"]["cores"] == pytest.approx(1.5) and d["limit"]["whole"] == 1
    assert d["usable"] == d["effective"] == d["convert"] == 1 and d["quota"] == pytest.approx(1.5)
    # The step log's header says the quota as the kernel enforces it, not a whole core.
    assert d["header"] == pytest.approx(1.5)
    child = make(parent, 1.0)
    d = _report_in(child)
    assert d["limit"]["cores"] == pytest.approx(1.0)
    assert str(child / "cpu.cfs_quota_us") in d["limit"]["source"]
    assert len(d["limit"]["quotas"]) == 2


# ---------------------------------------------------------------- parser, fake /proc

def _fake(tmp_path: Path, mounts: list[str], cgroup: str,
          files: dict[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        f = tmp_path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    mi = tmp_path / "mountinfo"
    mi.write_text("".join(f"{30 + i} 1 0:{40 + i} {m.format(tmp=tmp_path)}\n"
                          for i, m in enumerate(mounts)))
    cg = tmp_path / "cgroup"
    cg.write_text(cgroup)
    return {"cgroup_file": cg, "mountinfo_file": mi}


def test_v2_slurm_step_minimum_wins_and_rounds_down(tmp_path):
    files = _fake(tmp_path, ["/ {tmp}/v2 rw,nosuid - cgroup2 cgroup2 rw,nsdelegate"],
                  "0::/slurm/job_7/step_0\n",
                  {"v2/slurm/cpu.max": "max 100000\n",
                   "v2/slurm/job_7/cpu.max": "150000 100000\n",
                   "v2/slurm/job_7/step_0/cpu.max": "400000 100000\n"})  # v2 allows more
    lim = cpu_limit(**files, affinity=8)
    assert lim.cores == pytest.approx(1.5) and lim.whole == 1
    assert lim.quota is not None and lim.quota.file == str(tmp_path / "v2/slurm/job_7/cpu.max")
    assert [q.cores for q in lim.quotas] == [4.0, 1.5]  # own cgroup first


def test_v1_cpu_cpuacct_slice_with_quota_above_own(tmp_path):
    files = _fake(tmp_path, ["/ {tmp}/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct",
                             "/ {tmp}/cpuset rw - cgroup cgroup rw,cpuset",
                             "/ {tmp}/cpuacct rw - cgroup cgroup rw,cpuacct"],
                  "5:cpuset:/\n3:cpu,cpuacct:/system.slice/train.service\n",
                  {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
                   "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
                   "cpu,cpuacct/system.slice/cpu.cfs_quota_us": "250000\n",
                   "cpu,cpuacct/system.slice/cpu.cfs_period_us": "100000\n",
                   "cpu,cpuacct/system.slice/train.service/cpu.cfs_quota_us": "-1\n",
                   "cpu,cpuacct/system.slice/train.service/cpu.cfs_period_us": "100000\n",
                   "cpuset/cpu.cfs_quota_us": "1\n", "cpuacct/cpu.cfs_quota_us": "1\n"})
    lim = cpu_limit(**files, affinity=16)
    assert lim.cores == pytest.approx(2.5) and lim.whole == 2
    assert "system.slice/cpu.cfs_quota_us" in lim.source


def test_container_mount_root_maps_to_the_mountpoint(tmp_path):
    # No cgroup namespace: /proc/self/cgroup names the host path, and the container's
    # mount shows that cgroup as its root.
    files = _fake(tmp_path, ["/docker/abc {tmp}/cpu rw - cgroup cgroup rw,cpu"],
                  "4:cpu:/docker/abc\n",
                  {"cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n"})
    lim = cpu_limit(**files, affinity=4)
    assert lim.cores == pytest.approx(0.5) and lim.whole == 1  # at least one process runs


def test_affinity_binds_below_the_quota_and_no_quota_is_the_mask(tmp_path):
    files = _fake(tmp_path, ["/ {tmp}/v2 rw - cgroup2 cgroup2 rw"], "0::/job\n",
                  {"v2/job/cpu.max": "300000 100000\n"})
    assert cpu_limit(**files, affinity=2).cores == 2.0
    assert "affinity mask" in cpu_limit(**files, affinity=2).source
    assert cpu_limit(**files, affinity=4).cores == pytest.approx(3.0)
    (tmp_path / "v2/job/cpu.max").write_text("max 100000\n")
    lim = cpu_limit(**files, affinity=3)
    assert (lim.cores, lim.whole, lim.quota) == (3.0, 3, None)


def test_unreadable_proc_falls_back_to_the_mask(tmp_path):
    assert cgroup_quotas(cgroup_file=tmp_path / "none", mountinfo_file=tmp_path / "none") == []
    assert cpu_limit(cgroup_file=tmp_path / "none", affinity=5).whole == 5


# ---------------------------------------------------------------- cpu.stat, a job's quota

V1_STAT = "nr_periods 120\nnr_throttled 100\nthrottled_time 4500000000\nnr_bursts 0\nburst_time 0\n"
V2_STAT = ("usage_usec 905871\nuser_usec 800000\nsystem_usec 105871\nnr_periods 40\n"
           "nr_throttled 33\nthrottled_usec 1650000\nnr_bursts 0\nburst_usec 0\n")


def test_cpu_stat_v1_and_v2():
    assert parse_cpu_stat(V1_STAT) == CpuStat(120, 100, pytest.approx(4.5))
    assert parse_cpu_stat(V2_STAT) == CpuStat(40, 33, pytest.approx(1.65))
    # A v2 root (no bandwidth control there) and an empty read: no counters, not zeros.
    assert parse_cpu_stat("usage_usec 57232309015\nuser_usec 49517038217\n") is None
    assert parse_cpu_stat("") is None


def test_a_jobs_quota_and_the_cpu_stat_that_counts_it(tmp_path):
    """The binding quota of another process (the monitored job) sits on an ancestor: its
    throttling is counted in that cgroup's cpu.stat, not the job's own."""
    files = _fake(tmp_path, ["/ {tmp}/v2 rw,nosuid - cgroup2 cgroup2 rw,nsdelegate"],
                  "0::/kubepods/pod1/ctr\n",
                  {"v2/kubepods/pod1/cpu.max": "50000 100000\n",
                   "v2/kubepods/pod1/ctr/cpu.max": "max 100000\n",
                   "v2/kubepods/pod1/cpu.stat": V2_STAT})
    q, stat = quota_of(1, **files)
    assert q is not None and q.cores == pytest.approx(0.5)
    assert stat == tmp_path / "v2/kubepods/pod1/cpu.stat"
    files = _fake(tmp_path / "none", ["/ {tmp}/v2 rw - cgroup2 cgroup2 rw"], "0::/a\n",
                  {"v2/a/cpu.max": "max 100000\n"})
    assert quota_of(1, **files) == (None, tmp_path / "none/v2/a/cpu.stat")
