"""Conversion on a real Ray cluster (issue 15): two nodes started here on this machine
(ray.cluster_utils, one CPU each) and stopped afterwards; the output equals one process's,
for WebDataset and for LMDB (tasks read, the driver commits); a Ray worker SIGKILLed
mid-unit is retried and the output is still identical; a killed driver is rerun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.alone  # it judges what it measures: CI runs it alone (.ci/run)

ray = pytest.importorskip("ray",
                          reason="Ray is an optional extra: pip install 'autotune-loader[ray]'")

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["--shard-size", "256KiB", "--readers", "2", "--verify", "decode"]


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A head and a second node, one CPU each, on this machine; shut down at the end.
    HOME holds a Ray token, as on any machine that ever ran a local `ray.init()` (Ray 2.60
    writes ~/.ray/auth_token): the cluster runs without authentication all the same, and a
    driver that sent the token unasked broke it (OwnerDiedError on the second node)."""
    from ray.cluster_utils import Cluster

    home = tmp_path_factory.mktemp("rayhome")
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text("a" * 64)
    old_home = os.environ["HOME"]
    os.environ["HOME"] = str(home)
    # Workers must import this checkout's code, whatever is installed (autotune_converters
    # through the editable install's mapping, or the links a second worktree has).
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = f"{ROOT}:{old}" if old else str(ROOT)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1,
                                                            "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()
        os.environ["HOME"] = old_home
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def _cli(src: Path, dst: Path, fmt: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "autotune", "convert", "-q", str(src), str(dst),
            "--format", fmt, *ARGS, *extra]


def _run(cmd: list[str], timeout: float = 180) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RANK", "WORLD_SIZE")}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def refs(img_src, tmp_path_factory) -> dict[str, Path]:
    out = {}
    for fmt in ("wds", "lmdb"):
        d = tmp_path_factory.mktemp("rayref") / fmt
        r = _run(_cli(img_src, d, fmt, "--workers", "1"))
        assert r.returncode == 0, r.stderr
        out[fmt] = d
    return out


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_two_node_cluster_equals_one_process(ray_cluster, img_src, refs, work_dir, fmt,
                                             tree_digest):
    assert len([n for n in ray_cluster.list_all_nodes()]) == 2
    dst = work_dir / fmt
    r = _run(_cli(img_src, dst, fmt, "--engine", "ray", "--ray-address", ray_cluster.address,
                  "--json", "-"))
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(r.stdout)
    assert d["engine"] == "ray" and d["samples"] == 96 and d["processed"] == 96
    assert tree_digest(dst) == tree_digest(refs[fmt])


def _ray_worker_in_a_unit(tmp: Path, deadline: float) -> int | None:
    """The pid of a Ray worker caught writing a shard (its temporary name ends in its pid)."""
    while time.monotonic() < deadline:
        try:
            names = [p.name for p in tmp.iterdir()]
        except FileNotFoundError:
            names = []
        for n in names:
            pid = int(n.rsplit(".", 1)[1])
            try:
                if any("ray::" in part for part in psutil.Process(pid).cmdline()):
                    return pid
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.001)
    return None


@pytest.mark.slow
def test_a_ray_worker_sigkilled_mid_unit_is_retried_and_the_output_identical(
        ray_cluster, img_src, refs, work_dir, tree_digest):
    dst = work_dir / "killed-worker"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    p = subprocess.Popen(_cli(img_src, dst, "wds", "--engine", "ray", "--ray-address",
                              ray_cluster.address), cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid = _ray_worker_in_a_unit(dst / ".autotune-convert" / "tmp", time.monotonic() + 90)
    assert pid is not None, "no Ray worker was caught inside a unit"
    os.kill(pid, signal.SIGKILL)
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, err[-3000:]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert tree_digest(dst) == tree_digest(refs["wds"])


@pytest.mark.slow
def test_a_killed_ray_driver_is_rerun_to_the_same_output(ray_cluster, img_src, refs, work_dir,
                                                        tree_digest):
    dst = work_dir / "killed-driver"
    cmd = _cli(img_src, dst, "wds", "--engine", "ray", "--ray-address", ray_cluster.address)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    done = dst / ".autotune-convert" / "done"
    deadline = time.monotonic() + 90
    while p.poll() is None and time.monotonic() < deadline:
        if done.is_dir() and len(os.listdir(done)) >= 3:
            break
        time.sleep(0.005)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert not (dst / "manifest.json").exists(), "the driver finished before it was killed"
    r = _run(cmd + ["--json", "-"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["resumed_units"] >= 3
    assert tree_digest(dst) == tree_digest(refs["wds"])


def test_an_unreachable_ray_address_is_one_line(img_src, work_dir):
    r = _run(_cli(img_src, work_dir / "x", "wds", "--engine", "ray", "--ray-address",
                  "127.0.0.1:1"), timeout=180)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "127.0.0.1:1" in lines[0] and "ray start --head" in lines[0], \
        r.stderr[-2000:]
