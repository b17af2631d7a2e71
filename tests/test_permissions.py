"""Issue 8, case 12: permission denied on input files and on the output directory, and a
read-only source filesystem, for every command that reads a dataset or writes results.
Real mounts and real permission checks: root sees through permission bits, so the
read-only cases use a read-only bind mount and the unreadable-file case runs as root
without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH (a user the bits apply to, who can still
run this checkout's Python wherever it lives)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root, pytest.mark.slow]


def cli(*args: str, bits_apply: bool = False, **kw) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "autotune", "-q", *args]
    if bits_apply:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("setpriv (util-linux) is not installed")
        cmd = [setpriv, "--bounding-set=-dac_override,-dac_read_search", *cmd]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "HOME": "/tmp"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, **kw)


def one_line(r: subprocess.CompletedProcess) -> str:
    err = r.stderr.strip()
    assert err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.fixture
def ro_mount(work_dir: Path):
    """A function: ro_mount(dir) -> a read-only bind mount of dir (unmounted afterwards)."""
    mounts: list[Path] = []

    def make(src: Path) -> Path:
        ro = work_dir / f"ro-{len(mounts)}"
        ro.mkdir()
        if subprocess.run(["mount", "--bind", str(src), str(ro)]).returncode != 0:
            pytest.skip("cannot bind-mount here")
        mounts.append(ro)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
        return ro

    yield make
    for m in reversed(mounts):
        subprocess.run(["umount", "-l", str(m)])


def test_a_read_only_source_is_read_by_every_command(small_dataset, work_dir, ro_mount):
    src = work_dir / "src"
    shutil.copytree(small_dataset, src / "train")
    ro = ro_mount(src) / "train"
    with pytest.raises(OSError):
        (ro / "x").write_text("x")  # the mount is really read-only
    r = cli("convert", str(ro), str(work_dir / "wds"), "--format", "wds", "--workers", "1")
    assert r.returncode == 0, r.stderr
    r = cli("stage", str(ro), str(work_dir / "staged"), "--workers", "2")
    assert r.returncode == 0, r.stderr
    assert (work_dir / "staged" / "manifest.json").is_file()
    r = cli("bench", str(ro), "--preset", "decode-only", "--batch-size", "8", "--workers", "1",
            "--seconds", "1", "--warm", "--json", "-")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["images_per_s"] > 0
    r = cli("probe", str(ro), "--runtime", "1", "--size", "16M", "--replay-seconds", "1",
            "--scratch", str(work_dir), "--json", "-")
    assert r.returncode == 0, r.stderr  # fio runs on a scratch file in --scratch


def test_fio_skipped_on_a_folder_this_user_cannot_write_says_which_of_the_two(small_dataset,
                                                                            work_dir, ro_mount):
    # It said "(read-only filesystem?)" for a folder the job could not write by its
    # permissions alone (a review: nobody in a container, on root's dataset).
    src = work_dir / "locked"
    shutil.copytree(small_dataset, src)
    src.chmod(0o555)
    try:
        r = cli("probe", str(src), "--replay-seconds", "1", "--json", "-", bits_apply=True)
    finally:
        src.chmod(0o755)
    assert r.returncode == 0, r.stderr
    why = json.loads(r.stdout)["fio_error"]
    assert "its permissions: mode dr-xr-xr-x" in why and "read-only filesystem" not in why, why
    ro = ro_mount(work_dir / "locked")
    r = cli("probe", str(ro), "--replay-seconds", "1", "--json", "-")
    assert r.returncode == 0, r.stderr
    assert "(a read-only filesystem)" in json.loads(r.stdout)["fio_error"]


def test_a_read_only_output_is_one_clear_line_per_command(small_dataset, work_dir, ro_mount):
    out = work_dir / "out"
    out.mkdir()
    ro = ro_mount(out)
    cases = {
        "convert": ("convert", str(small_dataset), str(ro / "wds"), "--format", "wds"),
        "stage": ("stage", str(small_dataset), str(ro / "staged")),
        "search": ("search", str(small_dataset), "--out", str(ro / "search"), "--no-probe",
                   "--trials", "1", "--seconds", "3", "--warm"),
        "bench --json": ("bench", str(small_dataset), "--preset", "decode-only", "--warm",
                         "--seconds", "1", "--batch-size", "8", "--json", str(ro / "b.json")),
    }
    for name, args in cases.items():
        r = cli(*args)
        assert r.returncode in (1, 2), (name, r.returncode, r.stderr)
        err = one_line(r)
        assert str(ro) in err and "read-only" in err.lower(), (name, err)
        assert "you can write" in err, (name, err)   # and the fix: which path to change
    assert not any(ro.iterdir())


def test_an_unreadable_input_file_is_named_not_dropped(small_dataset, work_dir):
    # One image with mode 000 among readable ones, read by a user the bits apply to.
    src = work_dir / "src" / "train"
    shutil.copytree(small_dataset, src)
    bad = sorted(src.rglob("*.jpg"))[3]
    bad.chmod(0)
    dst = work_dir / "dst"
    dst.mkdir()
    rel = str(bad.relative_to(src))
    probe = cli("bench", str(bad.parent.parent), "--help", bits_apply=True)
    assert probe.returncode == 0, probe.stderr

    r = cli("convert", str(src), str(dst / "wds"), "--format", "wds", "--workers", "1",
            "--json", "-", bits_apply=True)
    assert r.returncode == 0, r.stderr  # --on-error skip (the default): listed, the rest done
    d = json.loads(r.stdout)
    skipped = {s["path"]: s["reason"] for s in d["skipped"]}
    assert "Permission denied" in skipped.get(rel, ""), d["skipped"]
    assert d["samples"] == 63

    r = cli("convert", str(src), str(dst / "wds-fail"), "--format", "wds", "--on-error", "fail",
            bits_apply=True)
    assert r.returncode == 1 and rel in one_line(r) and "Permission denied" in r.stderr

    r = cli("stage", str(src), str(dst / "staged"), "--json", "-", bits_apply=True)
    assert r.returncode == 4, r.stderr  # partial: the file is named, the others are staged
    assert rel in r.stdout + r.stderr and "Permission denied" in r.stdout + r.stderr

    r = cli("bench", str(src), "--preset", "decode-only", "--batch-size", "64", "--workers", "1",
            "--seconds", "1", "--warmup-batches", "0", "--warm", "--json", "-", bits_apply=True)
    assert r.returncode == 1
    assert rel in json.loads(r.stdout)["reason"] or rel in r.stderr, (r.stdout[-500:], r.stderr)


# -- other users' locks and leftover folders: never truncated, never removed ----------------

def _hold_flock(path: Path) -> subprocess.Popen:
    """A second process holding an flock on `path` until killed (its pid need not be
    visible to the remover: another pid namespace looks exactly like this)."""
    p = subprocess.Popen([sys.executable, "-c",
                          "import fcntl, sys, time\nf = open(sys.argv[1])\n"
                          "fcntl.flock(f, fcntl.LOCK_EX)\nprint('held', flush=True)\n"
                          "time.sleep(120)", str(path)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_lock_file_of_another_user_is_not_truncated(work_dir):
    from autotune_base.errors import StageError, UsageError
    from autotune_base.fsutil import PidLock

    lock = work_dir / "lock"
    lock.write_text("theirs\n")
    os.chown(lock, 12345, 12345)
    with pytest.raises(UsageError, match=r"not a lock file of this user .*uid 12345"):
        PidLock(lock, StageError).acquire()
    assert lock.read_text() == "theirs\n"


def test_a_leftover_conversion_folder_of_another_user_is_left_alone(work_dir):
    from autotune_converters.workdir import WorkDir

    wd = WorkDir(work_dir / "dst")
    wd.create()
    os.chown(wd.path, 12345, 12345)
    assert not wd.remove_stale() and wd.path.is_dir()


def _bench_scratch(name: str, uid: int | None = None) -> Path:
    import tempfile

    d = Path(tempfile.gettempdir()) / name
    d.mkdir()
    (d / "lock").write_text("")
    if uid is not None:
        os.chown(d, uid, uid)
        os.chown(d / "lock", uid, uid)
    old = time.time() - 3600  # long past any grace period
    os.utime(d, (old, old))
    return d


@pytest.mark.alone
def test_bench_keeps_a_live_runs_scratch_whose_pid_it_cannot_see():
    from autotune.bench.runner import _remove_stale_tmp

    # Locked under a name no bench sweeps, then named as a run's (no such pid here): any
    # bench of this user on the machine (a CI job beside this one) swept it while unlocked.
    staged = _bench_scratch(f"autotune-livetest-{os.getpid()}")
    holder = _hold_flock(staged / "lock")
    d = staged.with_name("autotune-bench-999999999-livetest")
    staged.rename(d)
    old = time.time() - 3600
    os.utime(d, (old, old))
    try:
        _remove_stale_tmp()
        assert d.is_dir()  # its run holds the lock: alive, whatever its pid
        holder.kill()
        holder.wait()
        _remove_stale_tmp()
        assert not d.exists()  # lock free, ours: a killed run's leftovers
    finally:
        holder.kill()
        holder.wait()
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.alone
def test_bench_never_removes_another_users_scratch():
    from autotune.bench.runner import _remove_stale_tmp

    d = _bench_scratch("autotune-bench-999999998-othertest", uid=12345)
    try:
        _remove_stale_tmp()
        assert d.is_dir() and (d / "lock").is_file()
    finally:
        shutil.rmtree(d, ignore_errors=True)


HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(0.2)             # the holder's name comes just after the lock
os.pwrite(fd, b"autotune search pid 4242 on node7\\n", 0)
time.sleep(30)
"""


def test_a_lock_taken_a_moment_ago_names_its_holder(tmp_path):
    # Two requeued jobs started together: the second read the first's lock file before the
    # first had written its name, and said "in use by ?".
    from autotune_base.errors import AutotuneError
    from autotune_base.fsutil import PidLock

    lock = tmp_path / "study.db.lock"
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "locked"
        with pytest.raises(AutotuneError, match="pid 4242 on node7"):
            PidLock(lock, lambda holder: AutotuneError(f"in use by {holder}")).acquire()
    finally:
        p.kill()
        p.wait()
