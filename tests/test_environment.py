"""autotune.environment: the job's own limits, read once.

cgroup v2 is what most container hosts run, but this machine mounts v1 only: the v2 readers
are tested on recorded v2 files (the layout a Kubernetes pod on a v2 node shows), v1 both
on recorded files and on a real memory cgroup. /dev/shm and a read-only /proc/sys are real:
a mount namespace of the test's own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from autotune.environment import read_environment, read_memory_limit, read_shm

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30


def _tree(tmp: Path, kind: str, own: str, files: dict[str, dict[str, str]]):
    """A recorded cgroup tree under tmp/cg, with /proc/self/cgroup and mountinfo for it."""
    mnt = tmp / "cg"
    for rel, content in files.items():
        d = mnt / rel.lstrip("/")
        d.mkdir(parents=True, exist_ok=True)
        for name, text in content.items():
            (d / name).write_text(text)
    if kind == "v2":
        cg = f"0::{own}\n"
        mi = f"30 23 0:26 / {mnt} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    else:
        cg = f"4:memory:{own}\n3:cpu,cpuacct:/\n"
        mi = f"35 31 0:32 / {mnt} rw,relatime - cgroup cgroup rw,memory\n"
    (tmp / "cgroup").write_text(cg)
    (tmp / "mountinfo").write_text(mi)
    return tmp / "cgroup", tmp / "mountinfo"


V2_STAT = "anon 734003200\nfile 3221225472\nactive_file 1073741824\ninactive_file 2147483648\n"


def test_v2_tightest_limit_on_the_way_up_and_working_set(tmp_path):
    # A pod limited to 16 GiB, its container to max, memory.high at 12 GiB on the pod.
    cg, mi = _tree(tmp_path, "v2", "/kubepods/pod1/ctr", {
        "/": {"cgroup.controllers": "cpu memory\n"},
        "/kubepods": {"memory.max": "max\n", "memory.high": "max\n"},
        "/kubepods/pod1": {"memory.max": f"{16 * GiB}\n", "memory.high": f"{12 * GiB}\n",
                           "memory.current": f"{4 * GiB}\n", "memory.stat": V2_STAT,
                           "memory.oom.group": "1\n"},
        "/kubepods/pod1/ctr": {"memory.max": "max\n", "memory.high": "max\n",
                               "memory.current": "1\n", "memory.stat": V2_STAT},
    })
    m = read_memory_limit(cgroup_file=cg, mountinfo_file=mi)
    assert m.kind == "v2"
    assert m.limit_bytes == 12 * GiB
    assert m.source.endswith("kubepods/pod1/memory.high")
    # the binding cgroup's usage, less its inactive file pages (the page cache)
    assert m.usage_bytes == 4 * GiB
    assert m.working_set_bytes == 2 * GiB
    assert m.remaining_bytes == 10 * GiB
    assert m.oom_group is True
    assert not m.notes


def test_v2_max_everywhere_is_no_limit(tmp_path):
    cg, mi = _tree(tmp_path, "v2", "/user.slice", {
        "/user.slice": {"memory.max": "max\n", "memory.high": "max\n"}})
    m = read_memory_limit(cgroup_file=cg, mountinfo_file=mi)
    assert m.limit_bytes is None and m.source == "no cgroup limit"


def test_v1_unlimited_value_and_ancestor_limit(tmp_path):
    cg, mi = _tree(tmp_path, "v1", "/slurm/uid_0/job_7", {
        "/slurm": {"memory.limit_in_bytes": "9223372036854771712\n"},
        "/slurm/uid_0": {"memory.limit_in_bytes": f"{8 * GiB}\n"},
        "/slurm/uid_0/job_7": {"memory.limit_in_bytes": "9223372036854771712\n",
                               "memory.usage_in_bytes": "100\n",
                               "memory.stat": "cache 5\ntotal_inactive_file 40\n"},
    })
    m = read_memory_limit(cgroup_file=cg, mountinfo_file=mi)
    assert m.kind == "v1"
    assert m.limit_bytes == 8 * GiB
    assert "uid_0/memory.limit_in_bytes" in m.source


def test_unreadable_limit_file_is_a_note_naming_it_and_the_others_still_count(tmp_path):
    cg, mi = _tree(tmp_path, "v2", "/a/b", {
        "/a": {"memory.max": f"{2 * GiB}\n", "memory.current": "10\n",
               "memory.stat": V2_STAT},
        "/a/b": {"memory.max": "garbage\n"}})
    m = read_memory_limit(cgroup_file=cg, mountinfo_file=mi)
    assert m.limit_bytes == 2 * GiB
    assert len(m.notes) == 1 and "a/b/memory.max" in m.notes[0]


def test_missing_proc_files_fall_back_to_the_host_with_a_note(tmp_path):
    env = read_environment(cgroup_file=tmp_path / "nope", mountinfo_file=tmp_path / "nope2")
    assert env.memory.limit_bytes is None
    assert any("nope" in n for n in env.memory.notes)
    assert env.memory_budget() == env.host_available_bytes > 0


def test_missing_shm_is_one_line_naming_it(tmp_path):
    s = read_shm(str(tmp_path / "no-shm"))
    assert s.total_bytes is None and "no-shm" in s.note


def test_the_environment_is_json_and_has_a_header():
    env = read_environment(ROOT)
    d = json.loads(json.dumps(env.to_dict()))
    assert d["cpu"]["cores"] >= 1
    assert d["data_read_only"] is False
    assert any(line.startswith("memory:") for line in env.lines())


# -- real: a memory cgroup, a 64 MiB /dev/shm, a read-only /proc/sys ----------------------

V1_MEMORY = Path("/sys/fs/cgroup/memory")
PROBE = ("import json,sys; from autotune.environment import read_environment; "
         "print(json.dumps(read_environment().to_dict()))")


def _need_root():
    if os.geteuid() != 0:
        pytest.skip("needs root: a memory cgroup / a mount namespace of the test's own")


def test_a_real_v1_memory_cgroup_binds_the_budget():
    _need_root()
    if not (V1_MEMORY / "memory.limit_in_bytes").exists():
        pytest.skip("no cgroup v1 memory hierarchy on this machine")
    d = V1_MEMORY / f"autotune-envtest-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    try:
        (d / "memory.limit_in_bytes").write_text(str(512 * 2**20))
        code = f"import os; open('{d}/cgroup.procs','w').write(str(os.getpid())); " + PROBE
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, cwd=ROOT).stdout
        env = json.loads(out)
        assert env["memory"]["limit_bytes"] == 512 * 2**20
        assert env["memory"]["source"] == str(d / "memory.limit_in_bytes")
        assert env["memory_budget_bytes"] <= 512 * 2**20
        assert env["memory"]["usage_bytes"] > 0
    finally:
        for _ in range(50):
            try:
                d.rmdir()
                break
            except OSError:
                import time
                time.sleep(0.1)


def _in_namespace(script: str) -> dict:
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1)")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_64_mib_dev_shm_in_a_container_is_seen():
    _need_root()
    env = _in_namespace("mount -t tmpfs -o size=64m tmpfs /dev/shm && "
                        f"{sys.executable} -c \"{PROBE}\"")
    assert env["shm"]["fstype"] == "tmpfs"
    assert env["shm"]["total_bytes"] == 64 * 2**20
    assert env["shm_budget_bytes"] <= 64 * 2**20


def test_a_read_only_proc_sys_means_no_cache_drop_and_says_so():
    _need_root()
    env = _in_namespace("mount --bind /proc/sys /proc/sys && "
                        "mount -o remount,bind,ro /proc/sys && "
                        f"{sys.executable} -c \"{PROBE}\"")
    assert env["root"] is True
    assert env["can_drop_caches"] is False
    assert env["can_switch_delayacct"] is False
    assert any("caches cannot be dropped (/proc/sys is read-only)" in x
               for x in env["limitations"])


def test_a_missing_cgroup_file_and_a_missing_shm_are_printed_by_the_commands(tmp_path):
    """The header probe, bench and search print carries each bad-input note, one line
    naming the file."""
    from rich.console import Console

    from autotune.cli.tables import environment_texts

    env = read_environment(ROOT, shm_path=str(tmp_path / "no-shm"),
                           cgroup_file=tmp_path / "no-cgroup", mountinfo_file=tmp_path / "mi")
    con = Console(width=400, record=True)
    for t in environment_texts(env.to_dict()):
        con.print(t)
    lines = con.export_text().splitlines()
    assert sum(f"{tmp_path / 'no-cgroup'}:" in line for line in lines) == 1
    assert any(line.strip().startswith(f"/dev/shm: {tmp_path / 'no-shm'} does not exist")
               for line in lines)
    assert any("limitation:" in line and "no-cgroup" in line for line in lines)
