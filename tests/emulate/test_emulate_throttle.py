"""IoThrottle with real cgroups and the real fio: the cap is what the disk then delivers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from autotune.emulate.throttle import CgroupBackend, IoThrottle
from autotune.errors import NotPermitted, UsageError

pytestmark = pytest.mark.alone  # it judges what it measures: CI runs it alone (.ci/run)

REPO = Path(__file__).resolve().parents[2]
CAP = 500


def fio_randread_iops(scratch: Path, seconds: int, cap: IoThrottle | None = None) -> float:
    cmd = ["fio", "--name=randread", f"--filename={scratch}", "--size=64M", "--readonly",
           "--rw=randread", "--bs=4k", "--direct=1", "--ioengine=libaio", "--iodepth=32",
           f"--runtime={seconds}", "--time_based", "--output-format=json"]
    run = cap.run if cap is not None else subprocess.run
    out = run(cmd, capture_output=True, text=True, check=True, timeout=seconds + 30)
    return float(json.loads(out.stdout)["jobs"][0]["read"]["iops"])


@pytest.mark.root
@pytest.mark.fio
@pytest.mark.slow
@pytest.mark.extended  # the same 500-IOPS cap under fio: tests/probe/test_probe_slow_storage.py
def test_fio_iops_under_cap(disk_dir: Path, backend: CgroupBackend,
                            random_file: Callable[[Path, int], Path]) -> None:
    scratch = random_file(disk_dir / "fio-scratch.bin", 64 << 20)
    free = fio_randread_iops(scratch, 2)
    with IoThrottle(disk_dir, read_iops=CAP, name="test-fio") as cap:
        capped = fio_randread_iops(scratch, 5, cap)
        stats = cap.stats()
    print(f"fio randread 4k qd32 direct: unthrottled {free:.0f} IOPS, cap {CAP}: {capped:.0f}")
    assert abs(capped - CAP) <= 0.25 * CAP, f"{capped:.0f} IOPS under a {CAP}-IOPS cap"
    assert free > 4 * CAP, f"unthrottled only {free:.0f} IOPS: the cap proves nothing here"
    # The cgroup saw the reads itself (fio's figure is not from somewhere else).
    assert stats.read_ios >= 0.7 * CAP * 5


@pytest.mark.root
def test_child_is_in_cgroup_before_exec(disk_dir: Path, backend: CgroupBackend) -> None:
    with IoThrottle(disk_dir, read_iops=CAP) as cap:
        out = cap.run(["cat", "/proc/self/cgroup"], capture_output=True, text=True, check=True)
        assert cap.cgroup is not None and f"/{cap.cgroup.name}" in out.stdout
        limit = (cap.cgroup / ("blkio.throttle.read_iops_device" if backend.version == 1
                               else "io.max")).read_text()
        assert cap.device.majmin in limit


@pytest.mark.root
def test_add_pid_and_cleanup_on_exception(disk_dir: Path, backend: CgroupBackend) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    child = None
    try:
        with pytest.raises(RuntimeError, match="boom"):
            with IoThrottle(disk_dir, read_iops=CAP, read_bps=10 << 20) as cap:
                cg = cap.cgroup
                cap.add_pid(sleeper.pid)
                child = cap.popen(["sleep", "30"])
                assert sorted(cap.pids()) == sorted([sleeper.pid, child.pid])
                raise RuntimeError("boom")
        assert cg is not None and not cg.exists(), f"{cg} left behind"
        # Still-running members were moved back to the parent, not killed.
        assert sleeper.poll() is None and child is not None and child.poll() is None
        assert str(sleeper.pid) in (backend.parent / "cgroup.procs").read_text().split()
    finally:
        for p in (sleeper, child):
            if p is not None:
                p.kill()
                p.wait()
    assert not list(backend.parent.glob(f"autotune-throttle-{os.getpid()}-*"))


def test_no_block_device_is_a_clear_error() -> None:
    path = "/dev/shm" if os.path.isdir("/dev/shm") else "/proc"
    with pytest.raises(UsageError, match=f"{path}: on .*no block device"):
        IoThrottle(path, read_iops=CAP)


def test_needs_a_limit(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="at least one"):
        IoThrottle(tmp_path)


@pytest.mark.root
def test_unprivileged_user_gets_not_permitted(disk_dir: Path, backend: CgroupBackend) -> None:
    # A forked child drops to user nobody (no exec: the venv may be unreadable to nobody).
    throttle = IoThrottle(disk_dir, read_iops=1)  # resolves the disk while still root
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        msg = b"no error"
        try:
            os.setgid(65534)
            os.setuid(65534)
            throttle.__enter__()
        except NotPermitted as e:
            msg = f"NotPermitted: {e}".encode()
        except BaseException as e:  # noqa: BLE001 - report anything to the parent
            msg = repr(e).encode()
        os.write(w, msg)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    os.waitpid(pid, 0)
    assert out.startswith("NotPermitted:") and "needs root" in out, out


@pytest.mark.root
def test_script_passes_exit_status(disk_dir: Path, backend: CgroupBackend) -> None:
    p = subprocess.Popen([str(REPO / "scripts/throttle"), "--path", str(disk_dir),
                          "--read-iops", str(CAP), "--read-bps", "20M", "--",
                          "sh", "-c", "cat /proc/self/cgroup; exit 7"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 7, stderr
    assert f"autotune-throttle-{p.pid}-" in stdout  # the script execs python: same pid
    assert not list(backend.parent.glob(f"autotune-throttle-{p.pid}-*"))


@pytest.mark.root
def test_script_reports_signal_death(disk_dir: Path, backend: CgroupBackend) -> None:
    out = subprocess.run([str(REPO / "scripts/throttle"), "--path", str(disk_dir),
                          "--read-iops", str(CAP), "--", "sh", "-c", "kill -TERM $$"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 128 + signal.SIGTERM, out.stderr


def test_script_usage_errors(tmp_path: Path) -> None:
    script = str(REPO / "scripts/throttle")
    no_cmd = subprocess.run([script, "--path", str(tmp_path), "--read-iops", "5"],
                            capture_output=True, text=True)
    assert no_cmd.returncode == 2 and "missing the command" in no_cmd.stderr
    bad = subprocess.run([script, "--path", str(tmp_path), "--read-iops", "-3", "--", "true"],
                         capture_output=True, text=True)
    assert bad.returncode == 2


@pytest.mark.root
def test_joined_caps_this_process_for_the_body_only(disk_dir: Path, backend: CgroupBackend) -> None:
    import time

    files = []
    for i in range(30):
        f = disk_dir / f"f{i}"
        f.write_bytes(os.urandom(8192))
        files.append(f)
    os.sync()

    def read_cold() -> float:
        t0 = time.monotonic()
        for f in files:
            fd = os.open(f, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # off the page cache
            os.read(fd, 8192)
            os.close(fd)
        return time.monotonic() - t0

    with IoThrottle(disk_dir, read_iops=20) as cap:
        with cap.joined():
            assert os.getpid() in cap.pids()
            child = subprocess.Popen(["sleep", "30"])  # started inside: inherits the cap
            inside = read_cold()
        assert os.getpid() not in cap.pids() and child.pid in cap.pids()
        assert str(os.getpid()) in (backend.parent / "cgroup.procs").read_text().split()
        outside = read_cold()
        child.kill()
        child.wait()
        with pytest.raises(RuntimeError), cap.joined():
            raise RuntimeError("the body failed")
        assert os.getpid() not in cap.pids()
    # 30 reads at 20 IOPS take over a second; uncapped they take milliseconds.
    assert inside > 0.8 and outside < inside / 4, (inside, outside)
