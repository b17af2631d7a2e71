"""Reads issued to one disk while the replay runs, so each figure says its I/Os per file.

Behind a cgroup cap (blk-throttle: cgroup v1 `blkio.throttle.*`, v2 `io.max`) the cap
charges every bio before the elevator merges them, so the figure that explains a capped
files/s is the cgroup's own count of charged bios (`blkio.throttle.io_serviced`, v2
`io.stat rios`), not the disk's merged requests. Without a cap on this disk the disk's
completed reads (/proc/diskstats, the whole machine's) are counted instead.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from autotune.blockdev import BlockDevice, mountinfo

_V1_LIMITS = ("blkio.throttle.read_iops_device", "blkio.throttle.read_bps_device")


def v1_reads(text: str, majmin: str) -> int | None:
    """Read bios of `majmin` in a v1 `blkio.throttle.io_serviced` ("7:0 Read 123" lines)."""
    for line in text.splitlines():
        f = line.split()
        if len(f) == 3 and f[0] == majmin and f[1] == "Read":
            return int(f[2])
    return None


def v2_reads(text: str, majmin: str) -> int | None:
    """`rios` of `majmin` in a v2 `io.stat` ("7:0 rbytes=.. wbytes=.. rios=12 ..")."""
    for line in text.splitlines():
        f = line.split()
        if f and f[0] == majmin:
            kv = dict(x.split("=", 1) for x in f[1:] if "=" in x)
            return int(kv["rios"]) if "rios" in kv else None
    return None


def capped(limits: str, majmin: str, *, v2: bool = False) -> bool:
    """Whether a v1 limit file ("7:0 100" lines) or a v2 `io.max` ("7:0 rbps=max riops=100
    ...") caps reads of `majmin`."""
    for line in limits.splitlines():
        f = line.split()
        if not f or f[0] != majmin:
            continue
        if not v2:
            return len(f) == 2 and f[1] != "0"
        return any(x.split("=", 1)[1] != "max" for x in f[1:] if x.startswith(("riops=", "rbps=")))
    return False


def diskstats_reads(text: str, name: str) -> int | None:
    """Reads completed by disk `name` in /proc/diskstats (its 4th field)."""
    for line in text.splitlines():
        f = line.split()
        if len(f) > 3 and f[2] == name:
            return int(f[3])
    return None


def _own_cgroup_dir(v2: bool) -> Path | None:
    """This process's blkio (v1) or unified (v2) cgroup directory, where it is mounted."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = mountinfo()
    except OSError:
        return None
    for line in lines:
        hid, _, rest = line.partition(":")
        ctrls, _, path = rest.partition(":")
        if (hid == "0") if v2 else ("blkio" in ctrls.split(",")):
            for m in mounts:
                ok = m.fstype == "cgroup2" if v2 else (
                    m.fstype == "cgroup" and "blkio" in m.super_options.split(","))
                if ok and path.startswith(m.root):
                    return Path(m.mountpoint) / path[len(m.root):].lstrip("/")
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def read_counter(dev: BlockDevice | None) -> tuple[Callable[[], int | None], str] | None:
    """(a function returning the running count of reads, what it counts) for `dev`: the
    capped cgroup's charged bios when this process sits behind a read cap on it, else the
    disk's completed reads; None when neither can be read."""
    if dev is None:
        return None
    mm = dev.majmin
    v1 = _own_cgroup_dir(False)
    if v1 is not None and any(capped(_read(v1 / f), mm) for f in _V1_LIMITS):
        f1 = v1 / "blkio.throttle.io_serviced"
        return (lambda: v1_reads(_read(f1), mm) or 0), "bios charged by the cgroup's read cap"
    v2 = _own_cgroup_dir(True)
    if v2 is not None and capped(_read(v2 / "io.max"), mm, v2=True):
        f2 = v2 / "io.stat"
        return (lambda: v2_reads(_read(f2), mm) or 0), "bios charged by the cgroup's read cap"
    if diskstats_reads(_read(Path("/proc/diskstats")), dev.name) is None:
        return None
    return (lambda: diskstats_reads(_read(Path("/proc/diskstats")), dev.name),
            f"reads completed by {dev.name} (/proc/diskstats: the whole machine's)")
