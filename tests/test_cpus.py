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
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from autotune.cpus import cgroup_quotas, cpu_limit

REPO = Path(__file__).resolve().parents[1]
V1_CPU_MOUNTS = ("/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu")

# What a process inside the cgroup reports, through every caller that sizes workers or
# the decode ceiling.
REPORT = """\
import json
from autotune import cpus
from autotune.data import presets
from autotune.search import ceilings
from autotune.cli import convert
print(json.dumps({"limit": cpus.cpu_limit().to_dict(), "usable": cpus.usable_cores(),
                  "convert": convert._default_workers(),
                  "presets": presets.usable_cores(), "effective": ceilings.effective_cores(),
                  "quota": ceilings.cpu_quota_cores(),
                  "cgroup": open("/proc/self/cgroup").read()}))
"""


def _own_v1_cpu_dir() -> Path | None:
    """This process's cgroup directory in the v1 cpu hierarchy, found independently of
    the code under test (the conventional mount points)."""
    own = None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            own = path
    if own is None:
        return None
    for mnt in V1_CPU_MOUNTS:
        d = Path(mnt) / own.lstrip("/")
        if (d / "cpu.cfs_quota_us").is_file():
            return d
    return None


CgroupMaker = Callable[[Path, float | None], Path]


@pytest.fixture
def cpu_cgroup() -> Iterator[tuple[Path, CgroupMaker]]:
    """(own cgroup dir, make(parent, cores)): make creates a child cgroup with a quota of
    `cores` (None: no quota). All are removed afterwards, deepest first, once the
    processes started in them have exited."""
    base = _own_v1_cpu_dir()
    if base is None:
        pytest.skip("no cgroup v1 cpu controller mounted at "
                    f"{' or '.join(V1_CPU_MOUNTS)} (cpu.cfs_quota_us)")
    made: list[Path] = []

    def make(parent: Path, cores: float | None) -> Path:
        d = parent / f"autotune-test-{uuid.uuid4().hex[:8]}"
        d.mkdir()
        made.append(d)
        if cores is not None:
            period = int((d / "cpu.cfs_period_us").read_text())
            (d / "cpu.cfs_quota_us").write_text(f"{round(cores * period)}\n")
        return d

    yield base, make
    left = []
    for d in reversed(made):
        deadline = time.monotonic() + 10
        while (d / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.05)  # a process that just exited may still be listed
        try:
            d.rmdir()
        except OSError as e:
            left.append(f"{d}: {e}")
    assert not left, f"cgroups left behind: {left}"


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
