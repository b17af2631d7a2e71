"""autotune.emulate.netcap: a tbf-capped veth into a network namespace of the test's own,
with SeaweedFS inside it. Shown by counting (the tbf's byte counter), never by timing."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.emulate import netcap
from autotune.emulate.netcap import CappedSeaweed, NetCap, sweep_stale
from autotune.emulate.seaweed import find_weed

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.root,
              pytest.mark.skipif(netcap.available() is not None,
                                 reason=str(netcap.available()))]


def _exists(cap: NetCap) -> tuple[bool, bool]:
    ns = cap.ns in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                  text=True).stdout.split()
    link = subprocess.run(["ip", "link", "show", cap.host_if], capture_output=True).returncode == 0
    return ns, link


def test_cap_is_made_on_the_namespace_side_and_removed() -> None:
    with NetCap("100mbit") as cap:
        assert _exists(cap) == (True, True)
        assert cap.host_ip.startswith("10.213.") and cap.ns_ip.startswith("10.213.")
        out = subprocess.run([*cap.prefix, "tc", "qdisc", "show", "dev", cap.ns_if],
                             capture_output=True, text=True).stdout
        assert "tbf" in out and "100Mbit" in out
        # A server inside the namespace sends 1 MiB; the host receives all of it, and the
        # tbf on the namespace side counted at least that many bytes.
        srv = ("import socket; s = socket.create_server((%r, 0)); print(s.getsockname()[1],"
               " flush=True); c, _ = s.accept(); c.sendall(b'x' * (1 << 20)); c.close()"
               % cap.ns_ip)
        p = cap.popen([sys.executable, "-c", srv], stdout=subprocess.PIPE, text=True)
        port = int(p.stdout.readline())  # type: ignore[union-attr]
        before = cap.stats()["bytes"]
        with socket.create_connection((cap.ns_ip, port), timeout=30) as conn:
            got = 0
            while chunk := conn.recv(1 << 16):
                got += len(chunk)
        p.wait(30)
        assert got == 1 << 20
        assert cap.stats()["bytes"] - before >= got
    assert _exists(cap) == (False, False)


def test_a_killed_owner_is_swept() -> None:
    code = ("import sys, time; from autotune.emulate.netcap import NetCap\n"
            "c = NetCap().__enter__(); print(c.ns, c.host_if, flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    ns, host_if = p.stdout.readline().split()  # type: ignore[union-attr]
    os.kill(p.pid, signal.SIGKILL)  # no __exit__, no atexit
    p.wait()
    assert ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    gone = sweep_stale()
    assert ns in gone and host_if in gone
    assert subprocess.run(["ip", "link", "show", host_if], capture_output=True).returncode != 0
    assert ns not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                    text=True).stdout


@pytest.mark.skipif(find_weed() is None, reason="weed is not installed (the test extra)")
def test_gets_from_a_capped_server_pass_through_the_tbf(tmp_path: Path, s3_creds: None) -> None:
    import boto3
    from botocore.config import Config

    from autotune.probe.objstore import measure_objects
    from autotune_converters.objstore import S3Config, Store

    blob = os.urandom(3 << 20)
    served = CappedSeaweed(tmp_path / "weed", rate="100mbit")
    cap = served.cap
    with served as endpoint:
        assert endpoint.startswith("http://10.213.")
        c = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                         config=Config(s3={"addressing_style": "path"}))
        c.create_bucket(Bucket="cap")
        c.put_object(Bucket="cap", Key="d/big.bin", Body=blob)
        for i in range(4):
            c.put_object(Bucket="cap", Key=f"d/{i}.jpg", Body=os.urandom(8192))
        before = cap.stats()["bytes"]
        assert c.get_object(Bucket="cap", Key="d/big.bin")["Body"].read() == blob
        after = cap.stats()["bytes"]
        # Every byte of the body left the server through the tbf (plus headers, ACKs).
        assert after - before >= len(blob)
        obj = measure_objects("s3://cap/d", store=Store(S3Config(endpoint)), concurrency=(1,),
                              seconds=0.5, cold=False, range_min_bytes=1 << 20,
                              range_seconds=0.3)
        got = obj.by_concurrency[0].bytes + sum(lv.bytes for lv in obj.ranged.levels)
        assert obj.by_concurrency[0].gets > 0 and obj.ranged.levels[0].gets > 0
        assert cap.stats()["bytes"] - after >= got > 0
    assert _exists(cap) == (False, False)
