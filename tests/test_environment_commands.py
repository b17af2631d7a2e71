"""probe, bench and search say what the job's container allows and what they could not do.

Real commands, real privileges: as the unprivileged user `nobody` (setpriv), with a
read-only /proc/sys and a read-only data mount (a private mount namespace of the test's
own), and inside a real memory cgroup (v1 on this machine). Each asserts the JSON's
`environment` and the line the command prints."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOBODY = 65534

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def world_dataset():
    """200 small JPEGs every user can read (pytest's tmp_path is root's alone)."""
    from autotune.synth import make_image_folder

    d = Path(tempfile.mkdtemp(prefix="autotune-env-ds-", dir="/var/tmp"))
    os.chmod(d, 0o755)
    make_image_folder(d / "train", 200, 4, seed=1, workers=1)
    for p in [d, *d.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    yield d / "train"
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def world_tmp():
    d = Path(tempfile.mkdtemp(prefix="autotune-env-", dir="/var/tmp"))
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _hidden_ancestor(path: str) -> str | None:
    """The topmost directory above `path` that other users cannot enter (a pyenv under
    /root, mode 700), or None."""
    parts = Path(path).parts
    for i in range(2, len(parts) + 1):
        d = os.path.join(*parts[:i])
        if not os.stat(d).st_mode & stat.S_IXOTH:
            return d
    return None


def _namespace(setup: str, argv: list[str], *, user: int | None = None,
               cgroup: Path | None = None, tmp: Path, home: bool = True) -> subprocess.CompletedProcess:
    """Run `argv` in a private mount namespace after the shell `setup`, optionally in a
    memory cgroup and as another user (HOME=`tmp`, or unset without `home`). The
    interpreter's install, when it sits under a directory `user` cannot enter, is bound
    into a tmpfs there (inside the namespace only)."""
    if shutil.which("unshare") is None or shutil.which("setpriv") is None:
        pytest.skip("needs unshare and setpriv (util-linux)")
    pre = []
    if cgroup is not None:
        pre.append(f"echo $$ > {cgroup}/cgroup.procs")
    hold = None
    if user is not None:
        hidden = _hidden_ancestor(sys.base_prefix)
        if hidden is not None:
            if any(str(p).startswith(hidden + "/") for p in (ROOT, sys.prefix)):
                pytest.skip(f"the worktree or venv lies under {hidden}, which {user} cannot read")
            hold = tmp / "base-prefix"
            hold.mkdir()
            pre += [f"mount --bind {sys.base_prefix} {hold}",
                    f"mount -t tmpfs -o mode=755,size=1m autotune-env {hidden}",
                    f"mkdir -p {sys.base_prefix}", f"mount --bind {hold} {sys.base_prefix}"]
    if setup:
        pre.append(setup)
    env = (f"env {f'HOME={tmp}' if home else '-u HOME -u XDG_CACHE_HOME -u AUTOTUNE_CACHE_DIR'} "
           f"PYTHONPATH={ROOT} PATH={os.environ.get('PATH', '/usr/bin:/bin')}")
    run = " ".join(f"'{a}'" for a in argv)
    if user is not None:
        run = f"setpriv --reuid {user} --regid {user} --clear-groups {env} {run}"
    else:
        run = f"{env} {run}"
    script = " && ".join(pre + [f"exec {run}"])
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, cwd=tmp, timeout=120)


def _autotune(*args: str) -> list[str]:
    return [sys.executable, "-m", "autotune", *args]


def _json(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode in (0, 1), r.stderr[-3000:]
    return json.loads(r.stdout)


def _flat(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines at 110 columns


RO_PROC_SYS = "mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys"


def test_probe_as_nobody_says_caches_are_evicted_file_by_file(world_dataset, world_tmp):
    # and /dev/shm is not a tmpfs (a directory of a disk's filesystem bound there)
    shm = world_tmp / "shm"
    shm.mkdir(mode=0o1777)
    r = _namespace(f"mount --bind {shm} /dev/shm", _autotune("probe", str(world_dataset), "--no-fio", "--replay-seconds",
                                 "0.3", "--concurrency", "1,4", "--json", "-"),
                   user=NOBODY, tmp=world_tmp)
    d = _json(r)
    env = d["environment"]
    assert env["root"] is False and env["can_drop_caches"] is False
    assert d["replay"]["cold_method"] == "fadvise"
    out = _flat(r.stderr)
    assert "limitation: caches cannot be dropped (not root): files are evicted one by one " \
           "with posix_fadvise" in out
    assert "memory: " in out and "/dev/shm: " in out
    # probe skips its steady-state pass without drop_caches: it says so, and what the
    # figures are then
    assert d["replay"]["steady"] == []
    assert any(w.startswith("steady-state pass not run: it needs drop_caches")
               for w in d["warnings"])
    assert "warning: steady-state pass not run" in out
    assert env["shm"]["fstype"] not in (None, "tmpfs")
    assert f"/dev/shm is not a tmpfs ({env['shm']['fstype']})" in out


NO_HOME = """
import json, logging
import torch
import autotune
from autotune.errors import AutotuneError, UsageError
from autotune.online import cache
from autotune_converters.objstore.upload import default_work_dir

logging.basicConfig(level=logging.INFO)
dl = autotune.DataLoader(torch.utils.data.TensorDataset(torch.arange(64)), batch_size=8)
seen = [sum(len(b) for (b,) in dl) for _ in range(2)]
try:
    cache.store("k", {"num_workers": 1})
    stored = "stored"
except AutotuneError as e:
    stored = str(e)
try:
    work = str(default_work_dir("s3://bucket/train"))
except UsageError as e:
    work = str(e)
print(json.dumps({"seen": seen, "stored": stored, "loaded": cache.load("k"), "work": work}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="setpriv to a uid without a passwd entry needs root")
def test_a_uid_with_no_home_trains_and_leaves_no_folder_named_tilde(world_tmp):
    """A container started with --user 54321 and its environment cleared: no HOME and no
    passwd entry, so ~ stays ~. The start-point cache went to ./~/.cache/autotune in the
    working directory; an upload's conversion folder raised RuntimeError from Path.home()."""
    import pwd

    uid = 54321
    with pytest.raises(KeyError):
        pwd.getpwuid(uid)
    script = world_tmp / "train.py"
    script.write_text(NO_HOME)
    os.chmod(script, 0o644)
    r = _namespace("", [sys.executable, str(script)], user=uid, tmp=world_tmp, home=False)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert d["seen"] == [64, 64] and d["loaded"] is None
    assert d["stored"].startswith("no cache folder: HOME is not set"), d
    assert "--work-dir" in d["work"] and "s3://bucket/train" in d["work"], d
    assert not (world_tmp / "~").exists(), os.listdir(world_tmp)   # its working directory


DATALOADER = """
import json, warnings
import torch
import autotune
from autotune.environment import read_environment
ds = torch.utils.data.TensorDataset(torch.zeros(8, 2))
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    default = autotune.DataLoader(ds, batch_size=4).memory_budget
    autotune.DataLoader(ds, batch_size=4, memory_budget=4 * 2**30)
print(json.dumps({"default": default, "warnings": [str(w.message) for w in seen],
                  "budget": read_environment().memory_budget()}))
"""


def test_dataloader_budget_follows_the_memory_cgroup(world_tmp, memory_cgroup):
    """In a 1 GiB cgroup on a larger host: the default budget is half of what the cgroup
    has left, and a memory_budget over its limit is warned about, naming both figures."""
    with memory_cgroup(2**30, "autotune-env-loader") as cg:
        r = subprocess.run(["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh",
                            sys.executable, "-c", DATALOADER], capture_output=True, text=True,
                           cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT),
                                          "HOME": str(world_tmp)}, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert 0 < d["default"] <= 2**29
    assert abs(d["default"] - d["budget"] // 2) < 64 * 2**20  # the cgroup's usage moves
    over = [w for w in d["warnings"] if "memory_budget=4,294,967,296 bytes" in w]
    assert len(over) == 1
    assert f"cgroup memory limit of {2**30:,} bytes" in over[0]
    assert str(cg / "memory.limit_in_bytes") in over[0]


@pytest.mark.slow
def test_bench_as_nobody_labels_its_cold_figure_and_delay_accounting(world_dataset, world_tmp):
    r = _namespace("", _autotune("bench", str(world_dataset), "--batch-size", "8", "--workers",
                                 "1", "--seconds", "1", "--compute-ms", "0", "--json", "-"),
                   user=NOBODY, tmp=world_tmp)
    d = _json(r)
    env = d["environment"]
    assert env["root"] is False and env["cores"] >= 1  # the child's keys are kept
    assert d["cache"]["method"] == "fadvise"
    if not env["delayacct_on"]:
        assert any(x.startswith("delay accounting is off and cannot be switched on")
                   for x in env["limitations"])
        assert "limitation: delay accounting is off and cannot be switched on" in _flat(r.stderr)
    assert "limitation: caches cannot be dropped (not root)" in _flat(r.stderr)


def test_probe_on_a_read_only_data_mount_names_the_path_and_scratch(world_dataset, world_tmp):
    if shutil.which("fio") is None:
        pytest.skip("fio is not installed")
    ro, scratch = world_tmp / "ro", world_tmp / "scratch"
    ro.mkdir()
    scratch.mkdir()
    setup = f"mount --bind {world_dataset} {ro} && mount -o remount,bind,ro {ro}"
    args = ("probe", str(ro), "--no-replay", "--runtime", "1", "--size", "8M", "--json", "-")
    r = _namespace(setup, _autotune(*args), tmp=world_tmp)
    d = _json(r)
    assert d["environment"]["data_read_only"] is True
    assert d["fio"] is None and "--scratch" in d["fio_error"]
    out = _flat(r.stderr)
    assert (f"limitation: {ro} is on a read-only mount: fio cannot write its scratch file "
            "there and is skipped; probe and search take --scratch DIR") in out
    r = _namespace(setup, _autotune(*args, "--scratch", str(scratch)), tmp=world_tmp)
    d = _json(r)
    assert d["fio"] is not None and d["scratch_dir"] == str(scratch)
    assert f"fio's scratch file goes to {scratch} (--scratch)" in _flat(r.stderr)


@pytest.mark.slow
def test_search_in_a_container_a_memory_cgroup_read_only_proc_sys_and_data(world_dataset,
                                                                          world_tmp,
                                                                          memory_cgroup):
    """One search as a container gives it: a 3 GiB memory cgroup, /proc/sys read-only,
    the dataset on a read-only mount with --scratch (the probe's own use of it is the
    probe test's: a storage probe here would double this test's time)."""
    ro, scratch, out = world_tmp / "ro", world_tmp / "scratch", world_tmp / "out"
    ro.mkdir()
    scratch.mkdir()
    with memory_cgroup(3 * 2**30, "autotune-env-search") as cg:
        setup = (f"{RO_PROC_SYS} && mount --bind {world_dataset} {ro} && "
                 f"mount -o remount,bind,ro {ro}")
        r = _namespace(setup, _autotune(
            "search", str(ro), "--scratch", str(scratch), "--no-probe", "--batch-size", "8",
            "--trials", "1",
            "--confirm", "0", "--seconds", "1", "--compute-ms", "0", "--space", "small",
            "--out", str(out), "--json", "-"), cgroup=cg, tmp=world_tmp)
    d = _json(r)
    env = d["environment"]
    assert env["memory"]["limit_bytes"] == 3 * 2**30
    assert env["root"] is True and env["can_drop_caches"] is False
    # --max-memory follows the cgroup, not the host's RAM, and the header says so
    assert d["max_memory"]["mib"] == 1536
    assert str(cg / "memory.limit_in_bytes") in d["max_memory"]["source"]
    text = _flat(r.stderr)
    assert "memory: cgroup limit 3.0 GiB" in text
    assert "1,536 MiB, half of the cgroup limit 3.0 GiB" in text
    assert "limitation: caches cannot be dropped (/proc/sys is read-only)" in text
    assert d["options"]["scratch"] == str(scratch)
    assert f"fio's scratch file goes to {scratch} (--scratch)" in text
