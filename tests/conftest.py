"""Shared fixtures and the skip policy for hardware- and privilege-dependent tests.

A test marked `root`, `fio` or `fuse` is skipped, with the reason, only where this
machine cannot do that case; everything else still runs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from autotune.bench.procs import group_members

# A test suite started in the background by a non-interactive shell (`cmd &`, nohup, some
# CI runners) inherits SIGINT ignored, and so would every process it starts: the Ctrl-C
# tests would send a signal nobody receives. A user's Ctrl-C reaches a foreground
# process with the default disposition; give the processes under test that one.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _fuse_reason() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    if not shutil.which("fusermount3"):
        return "fusermount3 missing (apt-get install fuse3)"
    try:
        import pyfuse3  # noqa: F401
    except ImportError:
        return "pyfuse3 not importable (needs libfuse3-dev; scripts/setup installs it as root)"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("root") and os.geteuid() != 0:
        pytest.skip("needs root (drop_caches, cgroup blkio, FUSE mounts)")
    if item.get_closest_marker("fio") and not shutil.which("fio"):
        pytest.skip("fio is not installed (apt-get install fio)")
    if item.get_closest_marker("fuse"):
        reason = _fuse_reason()
        if reason:
            pytest.skip(reason)


@pytest.fixture(scope="session", autouse=True)
def _each_image_rendered_once(tmp_path_factory: pytest.TempPathFactory):
    """The session's image folders share their renders: image (seed, i) is the same bytes
    in every fixture that asks for it (autotune.synth), and one render costs ~28 ms here;
    the datasets of seeds 1 and 3 overlap by ~1,100 images. Forked pool workers inherit
    the cache; a process started afresh renders as before."""
    import autotune.synth as synth

    cache = tmp_path_factory.mktemp("rendered")
    real = synth.render_jpeg

    def render_jpeg(seed: int, index: int) -> tuple[bytes, int]:
        path = cache / f"{seed}-{index}.jpg"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            data = real(seed, index)[0]
            tmp = cache / f"{seed}-{index}.{os.getpid()}.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return data, len(data)

    synth.render_jpeg = render_jpeg
    try:
        yield
    finally:
        synth.render_jpeg = real


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """64 ImageNet-like JPEGs in 4 classes, made once per test session."""
    from autotune.synth import make_image_folder

    root = tmp_path_factory.mktemp("ds") / "train"
    make_image_folder(root, 64, 4, seed=1, workers=1)
    return root


@pytest.fixture(scope="session")
def small_images_ds() -> Path:
    """400 small (96 px) JPEGs in 4 classes on the root disk: a loader that decodes them
    is far faster than a 100 ms step even on a busy machine, yet each file still costs a
    disk read when cold."""
    import tempfile

    import numpy as np
    from PIL import Image

    d = Path(tempfile.mkdtemp(prefix="autotune-bench-small-", dir="/var/tmp")) / "train"
    rng = np.random.default_rng(7)
    for i in range(400):
        cls = d / f"c{i % 4}"
        cls.mkdir(parents=True, exist_ok=True)
        arr = rng.integers(0, 256, size=(96, 96, 3), dtype=np.uint8)
        Image.fromarray(arr).save(cls / f"{i:04d}.jpg", quality=85)
    yield d
    shutil.rmtree(d.parent, ignore_errors=True)


@pytest.fixture
def work_dir() -> Path:
    """A temporary directory on the root disk (/var/tmp), not tmpfs: block-device tests
    need a real disk behind the path, and /tmp may be tmpfs on some machines."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="autotune-test-", dir="/var/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


# `autotune convert` (the real CLI) with a Ctrl-C of its own as unit UNIT's record is written:
# the units before it are done (WebDataset: their shards published), the rest are not.
_CTRL_C_AT_UNIT = """
import os, signal, sys
real = os.replace
def replace(a, b, **kw):
    if os.path.basename(os.fsdecode(b)) == "unit-%06d.json":
        os.kill(os.getpid(), signal.SIGINT)
    return real(a, b, **kw)
os.replace = replace
from autotune.cli import main
raise SystemExit(main())
"""


@pytest.fixture
def convert_ctrl_c():
    """convert_ctrl_c(*args, unit=3): `autotune convert -q *args` interrupted (Ctrl-C) as
    unit `unit`'s record is written (3: the 4th), at the same point every time. Give it
    --workers 1: the records are then written by the process the Ctrl-C reaches."""
    import subprocess
    import sys

    def run(*args: object, unit: int = 3) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", _CTRL_C_AT_UNIT % unit, "convert", "-q",
                               *map(str, args)], capture_output=True, text=True, timeout=120,
                              cwd=Path(__file__).resolve().parents[1])
    return run


@pytest.fixture
def tiny_shm():
    """A `popen=` that starts a process in a private mount namespace whose /dev/shm holds
    256 KiB: DataLoader batches cannot fit (root and unshare needed)."""
    import subprocess

    if not shutil.which("unshare"):
        pytest.skip("unshare (util-linux) is not installed")

    def popen(cmd, **kw):
        return subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             'mount -t tmpfs -o size=256k tmpfs /dev/shm && exec "$@"', "sh", *cmd], **kw)

    return popen


def measurement_processes(search_pid: int | None = None) -> list[psutil.Process]:
    """Live descendants of this test process that run the bench child (or its workers,
    which are forks of it and share its command line); with `search_pid`, the bench
    processes that search process started (their spec lives in a scratch directory named
    after it), wherever they were reparented."""
    if search_pid is not None:
        tag, procs = f"autotune-bench-{search_pid}-", psutil.process_iter()
    else:
        tag, procs = "autotune.bench.child", psutil.Process().children(recursive=True)
    out = []
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE and tag in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            continue
    return out


def assert_no_leftovers(res) -> None:
    """Nothing of the measurement's process group remains, not even a zombie."""
    pgid = res.process["pid"]
    assert pgid, res.process
    assert group_members(pgid) == [], f"left in group {pgid}: {group_members(pgid)}"
    assert measurement_processes() == []
    assert res.process["stray"] == []


@pytest.fixture
def no_leftovers():
    """The assert_no_leftovers check, as a fixture (test modules here are not a package)."""
    return assert_no_leftovers


@pytest.fixture
def live_measurements():
    """measurement_processes, as a fixture."""
    return measurement_processes


@contextlib.contextmanager
def _v1_memory_cgroup(limit_bytes: int, name: str = "autotune-test") -> Iterator[Path]:
    """A cgroup v1 memory cgroup of `limit_bytes` (a container's limit), removed after;
    the test skips without root or a v1 memory hierarchy."""
    root = Path("/sys/fs/cgroup/memory")
    if os.geteuid() != 0 or not (root / "memory.limit_in_bytes").exists():
        pytest.skip("needs root and a cgroup v1 memory hierarchy")
    cg = root / f"{name}-{uuid.uuid4().hex[:8]}"
    cg.mkdir()
    try:
        (cg / "memory.limit_in_bytes").write_text(str(limit_bytes))
        yield cg
    finally:
        for _ in range(50):  # its last process leaves it a moment after exiting
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)


@pytest.fixture
def memory_cgroup():
    """_v1_memory_cgroup, as a fixture: `with memory_cgroup(2**30) as cg: ...`."""
    return _v1_memory_cgroup


# ---------------------------------------------------------------- cgroup v1 CPU quotas

V1_CPU_MOUNTS = ("/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu")


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


CgroupMaker = Callable[[Path, "float | None"], Path]


@pytest.fixture
def cpu_cgroup() -> Iterator[tuple[Path, CgroupMaker]]:
    """(own cgroup dir, make(parent, cores)): make creates a child cgroup with a quota of
    `cores` (None: no quota). All are removed afterwards, deepest first, once the
    processes started in them have exited. Used by tests/test_cpus.py and the monitor's
    and the analysis' CPU-quota tests."""
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
