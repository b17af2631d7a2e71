"""autotune.environment: the job's own limits, read once.

cgroup v2 is what most container hosts run, but this machine mounts v1 only: the v2 readers
are tested on synthetic files written in the kernel's format (the layouts a Docker container
with its own cgroup namespace and a Kubernetes pod on a v2 node show), not recordings from a
v2 host; v1 both on such files (memory.stat as this machine's kernel writes it) and on a real
memory cgroup. /dev/shm and a read-only /proc/sys are real: a mount namespace of the test's
own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
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
        # A v2 hierarchy's top always has cgroup.controllers; "memory" where it is bound.
        top = mnt / "cgroup.controllers"
        if not top.exists():
            top.write_text("cpuset cpu io memory pids\n")
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


def _v1_stat(own_inactive: int, total_inactive: int) -> str:
    """A v1 memory.stat in the kernel's order: the cgroup's own counters first, then the
    hierarchical `total_` ones (the shape this machine's kernel writes)."""
    return (f"cache 106496\nrss 1830912\nrss_huge 0\nshmem 0\nmapped_file 0\n"
            f"inactive_anon 1716224\nactive_anon 12288\ninactive_file {own_inactive}\n"
            f"active_file 40960\nunevictable 0\n"
            f"hierarchical_memory_limit 9223372036854771712\ntotal_cache 321957888\n"
            f"total_rss 1830912\ntotal_inactive_anon 1716224\ntotal_active_anon 12288\n"
            f"total_inactive_file {total_inactive}\ntotal_active_file 40960\n"
            f"total_unevictable 0\n")


def test_v1_working_set_subtracts_the_whole_subtrees_inactive_file(tmp_path):
    # usage_in_bytes is hierarchical: its page cache is total_inactive_file (the children's
    # too), not the cgroup's own inactive_file, which the kernel lists first.
    cg, mi = _tree(tmp_path, "v1", "/job", {
        "/job": {"memory.limit_in_bytes": f"{2 * GiB}\n",
                 "memory.usage_in_bytes": f"{400 * 2**20}\n",
                 "memory.stat": _v1_stat(135168, 321851392)}})
    m = read_memory_limit(cgroup_file=cg, mountinfo_file=mi)
    assert m.inactive_file_bytes == 321851392
    assert m.working_set_bytes == 400 * 2**20 - 321851392
    # a v1 memory.stat without the total_ lines (use_hierarchy off on old kernels)
    (tmp_path / "cg/job/memory.stat").write_text("cache 5\ninactive_file 7\n")
    assert read_memory_limit(cgroup_file=cg, mountinfo_file=mi).inactive_file_bytes == 7


def test_an_unreadable_memory_stat_counts_the_page_cache_as_used(tmp_path):
    cg, mi = _tree(tmp_path, "v1", "/job", {
        "/job": {"memory.limit_in_bytes": f"{2 * GiB}\n",
                 "memory.usage_in_bytes": f"{GiB}\n"}})
    (tmp_path / "cg/job/memory.stat").mkdir()   # read_text: IsADirectoryError
    m = read_memory_limit(cgroup_file=cg, mountinfo_file=mi)
    assert m.usage_bytes == GiB and m.working_set_bytes == GiB and m.remaining_bytes == GiB
    assert len(m.notes) == 1, m.notes
    assert "job/memory.stat: unreadable" in m.notes[0]
    assert "page cache counted as used" in m.notes[0]


def test_a_missing_limit_file_on_the_own_cgroup_is_one_line_naming_it(tmp_path):
    cg, mi = _tree(tmp_path, "v1", "/slurm/job_9", {
        "/slurm": {"memory.limit_in_bytes": f"{4 * GiB}\n", "memory.usage_in_bytes": "0\n",
                   "memory.stat": _v1_stat(0, 0)},
        "/slurm/job_9": {"memory.usage_in_bytes": "0\n"}})
    m = read_memory_limit(cgroup_file=cg, mountinfo_file=mi)
    assert m.limit_bytes == 4 * GiB
    assert len(m.notes) == 1, m.notes
    assert "slurm/job_9/memory.limit_in_bytes: missing" in m.notes[0]
    assert "the limits of the cgroups above it are used" in m.notes[0]


def test_a_looser_ancestor_nearly_full_leaves_less_than_the_tightest_limit(tmp_path):
    # The job's own cgroup: 8 GiB, 1 GiB used. Its parent: 10 GiB, 9.5 GiB used by the
    # job and its siblings. Both limits are enforced: 0.5 GiB is what is left.
    cg, mi = _tree(tmp_path, "v1", "/team/job", {
        "/team": {"memory.limit_in_bytes": f"{10 * GiB}\n",
                  "memory.usage_in_bytes": f"{19 * GiB // 2}\n", "memory.stat": _v1_stat(0, 0)},
        "/team/job": {"memory.limit_in_bytes": f"{8 * GiB}\n",
                      "memory.usage_in_bytes": f"{GiB}\n", "memory.stat": _v1_stat(0, 0)}})
    m = read_memory_limit(cgroup_file=cg, mountinfo_file=mi)
    assert m.limit_bytes == 8 * GiB and m.source.endswith("team/job/memory.limit_in_bytes")
    assert m.working_set_bytes == GiB
    assert m.remaining_bytes == GiB // 2
    assert m.least_remaining_source.endswith("team/memory.limit_in_bytes")
    env = read_environment(cgroup_file=cg, mountinfo_file=mi)
    line = next(x for x in env.lines() if x.startswith("memory:"))
    assert "512 MiB left (the least of any limit on the way up: " in line, line
    assert line.endswith("team/memory.limit_in_bytes)"), line


# -- synthetic files in the kernel's v2 format (not recordings: this machine mounts v1) ----

DOCKER_V2_STAT = (
    "anon 52428800\nfile 209715200\nkernel 4194304\nkernel_stack 131072\n"
    "pagetables 520192\nsec_pagetables 0\npercpu 0\nsock 0\nvmalloc 0\nshmem 0\n"
    "zswap 0\nzswapped 0\nfile_mapped 8388608\nfile_dirty 0\nfile_writeback 0\n"
    "swapcached 0\nanon_thp 0\nfile_thp 0\nshmem_thp 0\ninactive_anon 52428800\n"
    "active_anon 0\ninactive_file 167772160\nactive_file 41943040\nunevictable 0\n"
    "slab_reclaimable 2097152\nslab_unreclaimable 1048576\nslab 3145728\n"
    "workingset_refault_anon 0\nworkingset_refault_file 0\npgfault 12345\n"
    "pgmajfault 12\n")


def _docker_v2(tmp: Path, stat: bool = True) -> tuple[Path, Path]:
    """`docker run --memory 1g` on a v2 host with its own cgroup namespace (the default):
    /proc/self/cgroup is `0::/`, cgroup2 is mounted at /sys/fs/cgroup from root `/`, and the
    container's cgroup is that mount's top."""
    mnt = tmp / "sys/fs/cgroup"
    mnt.mkdir(parents=True)
    files = {"cgroup.controllers": "cpuset cpu io memory hugetlb pids rdma misc\n",
             "memory.max": f"{GiB}\n", "memory.high": "max\n",
             "memory.current": f"{262144000}\n", "memory.oom.group": "0\n"}
    if stat:
        files["memory.stat"] = DOCKER_V2_STAT
    for name, text in files.items():
        (mnt / name).write_text(text)
    (tmp / "cgroup").write_text("0::/\n")
    (tmp / "mountinfo").write_text(
        "1184 1175 0:389 / / rw,relatime master:563 - overlay overlay rw,lowerdir=/l,upperdir=/u\n"
        "1185 1184 0:392 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n"
        f"1190 1189 0:27 / {mnt} ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup "
        "rw,nsdelegate,memory_recursiveprot\n"
        "1191 1186 0:394 / /dev/shm rw,nosuid,nodev,noexec,relatime - tmpfs shm rw,size=65536k\n")
    return tmp / "cgroup", tmp / "mountinfo"


def test_a_docker_v2_container_with_its_own_cgroup_namespace(tmp_path):
    cg, mi = _docker_v2(tmp_path)
    m = read_memory_limit(cgroup_file=cg, mountinfo_file=mi)
    assert m.kind == "v2" and m.limit_bytes == GiB
    assert m.source == str(tmp_path / "sys/fs/cgroup/memory.max")
    assert m.usage_bytes == 262144000 and m.inactive_file_bytes == 167772160
    assert m.working_set_bytes == 262144000 - 167772160
    assert m.remaining_bytes == GiB - (262144000 - 167772160)
    assert m.oom_group is False and not m.notes


def test_a_docker_v2_container_without_memory_stat(tmp_path):
    cg, mi = _docker_v2(tmp_path, stat=False)
    m = read_memory_limit(cgroup_file=cg, mountinfo_file=mi)
    assert m.limit_bytes == GiB and m.working_set_bytes == 262144000
    assert len(m.notes) == 1
    assert m.notes[0].startswith(f"{tmp_path / 'sys/fs/cgroup/memory.stat'}: unreadable")
    assert "page cache counted as used" in m.notes[0]


def hybrid(tmp: Path, limit: int | None = 3 * GiB) -> tuple[Path, Path]:
    """A systemd-hybrid host: the unified (v2) hierarchy mounted first at
    /sys/fs/cgroup/unified without the memory controller, memory on v1."""
    base = tmp / "sys/fs/cgroup"
    uni = base / "unified/user.slice/session-3.scope"
    uni.mkdir(parents=True)
    (base / "unified/cgroup.controllers").write_text("\n")
    mem = base / "memory/user.slice/session-3.scope"
    mem.mkdir(parents=True)
    (base / "memory/memory.usage_in_bytes").write_text(f"{5 * GiB}\n")
    if limit is not None:
        (mem / "memory.limit_in_bytes").write_text(f"{limit}\n")
    (mem / "memory.usage_in_bytes").write_text(f"{GiB}\n")
    (mem / "memory.stat").write_text(_v1_stat(0, GiB // 4))
    (base / "memory/user.slice/memory.limit_in_bytes").write_text("9223372036854771712\n")
    (tmp / "cgroup").write_text("12:pids:/user.slice/session-3.scope\n"
                                "4:memory:/user.slice/session-3.scope\n"
                                "1:name=systemd:/user.slice/session-3.scope\n"
                                "0::/user.slice/session-3.scope\n")
    (tmp / "mountinfo").write_text(
        f"25 24 0:22 / {base} ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755\n"
        f"26 25 0:23 / {base}/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 "
        "cgroup2 rw,nsdelegate\n"
        f"27 25 0:24 / {base}/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup "
        "cgroup rw,xattr,name=systemd\n"
        f"31 25 0:28 / {base}/memory rw,nosuid,nodev,noexec,relatime shared:15 - cgroup "
        "cgroup rw,memory\n")
    return tmp / "cgroup", tmp / "mountinfo"


def test_a_hybrid_host_reads_v1_memory_and_no_spurious_line_for_unified(tmp_path):
    cg, mi = hybrid(tmp_path)
    m = read_memory_limit(cgroup_file=cg, mountinfo_file=mi)
    assert m.kind == "v1" and m.limit_bytes == 3 * GiB
    assert m.working_set_bytes == GiB - GiB // 4
    assert not m.notes, m.notes


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



def test_a_read_only_data_mount_is_a_limitation_only_where_fio_runs():
    """bench runs no fio: it printed probe's "fio cannot write its scratch file there ...
    take --scratch" for a read-only dataset, an option bench does not have."""
    import dataclasses

    ro = dataclasses.replace(read_environment(ROOT), data_path="/data", data_read_only=True)
    assert any("/data is on a read-only mount: fio cannot" in x for x in ro.limitations())
    bench = dataclasses.replace(ro, runs_fio=False)
    assert not any("read-only mount" in x for x in bench.limitations())
    assert bench.to_dict()["data_read_only"] is True  # still said in the JSON


# -- real: a memory cgroup, a 64 MiB /dev/shm, a read-only /proc/sys ----------------------

PROBE = ("import json,sys; from autotune.environment import read_environment; "
         "print(json.dumps(read_environment().to_dict()))")


def _need_root():
    if os.geteuid() != 0:
        pytest.skip("needs root: a memory cgroup / a mount namespace of the test's own")


def test_a_real_v1_memory_cgroup_binds_the_budget(memory_cgroup):
    with memory_cgroup(512 * 2**20, "autotune-envtest") as d:
        code = f"import os; open('{d}/cgroup.procs','w').write(str(os.getpid())); " + PROBE
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, cwd=ROOT).stdout
    env = json.loads(out)
    assert env["memory"]["limit_bytes"] == 512 * 2**20
    assert env["memory"]["source"] == str(d / "memory.limit_in_bytes")
    assert env["memory_budget_bytes"] <= 512 * 2**20
    assert env["memory"]["usage_bytes"] > 0


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


def test_search_max_memory_over_the_cgroup_limit_is_a_warning_naming_both(tmp_path,
                                                                          memory_cgroup):
    """search --max-memory above the job's cgroup limit warns, as autotune.DataLoader's
    memory_budget= does: the environment is read from a real memory cgroup of 512 MiB."""
    code = ("import os, json, sys, types\n"
            "open(sys.argv[1] + '/cgroup.procs','w').write(str(os.getpid()))\n"
            "from autotune.search.session import Session\n"
            "from autotune.environment import read_environment\n"
            "said = []\n"
            "for mib in (4096, 200, None):\n"
            "    s = Session.__new__(Session)\n"
            "    s.env, s.say = read_environment(), said.append\n"
            "    s.opts = types.SimpleNamespace(max_memory_mib=mib)\n"
            "    s.space = types.SimpleNamespace(notes=[])\n"
            "    s.max_mem_source = '--max-memory'\n"
            "    s._decide_max_memory()\n"
            "    print(json.dumps([mib, s.max_mem, s.space.notes, said]))\n"
            "    said.clear()\n")
    with memory_cgroup(512 * 2**20, "autotune-envfix") as d:
        out = subprocess.run([sys.executable, "-c", code, str(d)], capture_output=True,
                             text=True, check=True, cwd=ROOT).stdout.splitlines()
    over, under, unset = (json.loads(x) for x in out)
    assert over[1] == 4096 and len(over[2]) == 1 and over[3] == ["warning: " + over[2][0]]
    assert over[2][0].startswith("--max-memory 4,096 MiB is over this job's cgroup memory "
                                 "limit of 512 MiB")
    assert str(d / "memory.limit_in_bytes") in over[2][0]
    assert under[2] == [] and under[3] == []
    assert unset[1] == 256 and unset[2] == []     # half the limit, no warning


def test_search_max_memory_default_is_halved_again_under_oom_group():
    """Under memory.oom.group=1 the whole job dies at the limit (no recovery): the search's
    default bound per configuration is divided as autotune.DataLoader's budgets are."""
    import types

    from autotune.search.session import Session

    for group, want in ((False, 256.0), (True, 128.0)):
        env = types.SimpleNamespace(memory=types.SimpleNamespace(oom_group=group),
                                    memory_total=lambda: 512 * 2**20,
                                    memory_total_source=lambda: "the cgroup's 512 MiB limit")
        s = Session.__new__(Session)
        s.env, s.say = env, print
        s.opts = types.SimpleNamespace(max_memory_mib=None)
        s._decide_max_memory()
        assert s.max_mem == want, (group, s.max_mem)
        assert ("memory.oom.group=1" in s.max_mem_source) is group, s.max_mem_source
