"""Conversion through a head started as users start it (issue 29): `ray start --head` on
loopback, with a token in ~/.ray/auth_token as every earlier local `ray.init()` leaves
one, so Ray 2.60 turns token authentication on. `autotune convert --engine ray
--ray-address 127.0.0.1:PORT` connects and writes what one process writes; a user who
turned the token off (RAY_AUTH_MODE=disabled) or holds the wrong token gets one line
naming the fix.

The head runs in a session of its own with a HOME and a temp dir of its own, and is
stopped by its process group (never `ray stop`, which stops every Ray on the machine)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'autotune-loader[ray]'")

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))
ARGS = ["--shard-size", "256KiB", "--readers", "2", "--verify", "decode"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RAY_") and k not in ("RANK", "WORLD_SIZE")}
    # Ray workers import this checkout's code, whatever is installed.
    env.update(HOME=str(home), PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}",
               **extra)
    return env


def _stop(p: subprocess.Popen) -> None:
    """SIGTERM to the head's own process group (GCS, raylet, agents, workers), then KILL."""
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(p.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def _token_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("rayhome")
    subprocess.run([RAY, "get-auth-token", "--generate"], env=_env(home), check=True,
                   capture_output=True, timeout=60)
    assert (home / ".ray" / "auth_token").is_file()
    return home


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """`ray start --head --port PORT --num-cpus 1` with a token in its HOME: token
    authentication on. Yields (address, home)."""
    home = _token_home(tmp_path_factory)
    yield from _start_head(home, "auth", expect_auth=True)


def _start_head(home: Path, name: str, *, expect_auth: bool):
    # short: Ray's socket paths live under it
    tmp = Path(f"/tmp/autotune-integ-ray-{os.getpid()}-{name}")
    env = _env(home)
    port = _free_port()
    cmd = [RAY, "start", "--head", "--port", str(port), "--num-cpus", "1",
           "--temp-dir", str(tmp), "--include-dashboard=false", "--disable-usage-stats",
           "--object-store-memory", str(100 * 2**20),
           "--dashboard-agent-listen-port", str(_free_port()),
           "--dashboard-port", str(_free_port()), "--metrics-export-port", str(_free_port())]
    p = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out[-3000:]
        assert ("Token authentication is enabled" in out) is expect_auth, out[-3000:]
        yield f"127.0.0.1:{port}", home
    finally:
        _stop(p)
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def _convert(src: Path, dst: Path, fmt: str, home: Path, *extra: str,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "autotune", "convert", "-q", str(src), str(dst),
           "--format", fmt, *ARGS, *extra]
    return subprocess.run(cmd, cwd=ROOT, env=env or _env(home), capture_output=True,
                          text=True, timeout=240)


def test_convert_through_a_head_with_token_auth_equals_one_process(head, img_src, work_dir,
                                                                   tree_digest):
    address, home = head
    ref = _convert(img_src, work_dir / "ref", "wds", home, "--workers", "1")
    assert ref.returncode == 0, ref.stderr
    r = _convert(img_src, work_dir / "ray", "wds", home, "--engine", "ray", "--ray-address",
                 address)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.strip() == "", r.stderr[-3000:]
    assert tree_digest(work_dir / "ray") == tree_digest(work_dir / "ref")


@pytest.mark.parametrize("case", ["disabled", "wrong-token"])
def test_a_refused_token_is_one_line_naming_the_fix(head, img_src, work_dir, case):
    address, home = head
    extra = ({"RAY_AUTH_MODE": "disabled"} if case == "disabled"
             else {"RAY_AUTH_TOKEN": "0" * 64})
    # Ray retries a refused connection for a minute by default; its own knob shortens it.
    env = _env(home, RAY_gcs_server_port_wait_time_s="1", **extra)
    r = _convert(img_src, work_dir / case, "wds", home, "--engine", "ray", "--ray-address",
                 address, env=env)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr[-3000:]
    assert address in lines[0]
    if case == "disabled":
        assert "RAY_AUTH_MODE=token" in lines[0] and "ray get-auth-token" in lines[0]
    else:
        assert "refused this machine's token (from RAY_AUTH_TOKEN)" in lines[0]
