"""A cgroup's read cap on one disk (blk-throttle: cgroup v1 `blkio.throttle.read_iops_device`
and `read_bps_device`, v2 `io.max riops= rbps=`), and the cgroup's own count of what it
charged.

A container's storage limit (`docker run --device-read-iops`, a systemd unit's
`IOReadIOPSMax=`) is such a cap. It is a limit set by configuration, not a figure measured
from the job, so a job whose reads reach it is held back by it whatever its loaders do:
more workers only queue more reads behind the same cap. The cap charges every bio before
the elevator merges them, so what shows the job at its cap is the cgroup's count of charged
bios (`blkio.throttle.io_serviced`, v2 `io.stat rios`), not the disk's merged requests.

Only the process's own cgroup is read (where Docker and systemd put the limit); a cap on
an ancestor is not seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autotune.blockdev import BlockDevice, mountinfo

_V1_LIMITS = {"iops": "blkio.throttle.read_iops_device", "bps": "blkio.throttle.read_bps_device"}
_V1_COUNTS = ("blkio.throttle.io_serviced", "blkio.throttle.io_service_bytes")


def v1_reads(text: str, majmin: str) -> int | None:
    """Read bios (or bytes) of `majmin` in a v1 `blkio.throttle.io_serviced` (or
    `io_service_bytes`): "7:0 Read 123" lines."""
    for line in text.splitlines():
        f = line.split()
        if len(f) == 3 and f[0] == majmin and f[1] == "Read":
            return int(f[2])
    return None


def v2_stat(text: str, majmin: str, key: str = "rios") -> int | None:
    """`key` (rios, rbytes) of `majmin` in a v2 `io.stat` ("7:0 rbytes=.. rios=12 ..")."""
    for line in text.splitlines():
        f = line.split()
        if f and f[0] == majmin:
            kv = dict(x.split("=", 1) for x in f[1:] if "=" in x)
            return int(kv[key]) if key in kv else None
    return None


def v1_limit(text: str, majmin: str) -> int | None:
    """The limit of `majmin` in a v1 limit file ("7:0 100" lines); None: not capped."""
    for line in text.splitlines():
        f = line.split()
        if len(f) == 2 and f[0] == majmin and f[1].isdigit() and int(f[1]) > 0:
            return int(f[1])
    return None


def v2_limits(text: str, majmin: str) -> dict[str, int]:
    """The read limits of `majmin` in a v2 `io.max` ("7:0 rbps=max wbps=max riops=100
    wiops=max"): {"iops": 100} (a write limit alone caps no read)."""
    for line in text.splitlines():
        f = line.split()
        if f and f[0] == majmin:
            kv = dict(x.split("=", 1) for x in f[1:] if "=" in x)
            return {name: int(kv[key]) for name, key in (("iops", "riops"), ("bps", "rbps"))
                    if kv.get(key, "max").isdigit()}
    return {}


def capped(limits: str, majmin: str, *, v2: bool = False) -> bool:
    """Whether a v1 limit file or a v2 `io.max` caps reads of `majmin`."""
    return bool(v2_limits(limits, majmin)) if v2 else v1_limit(limits, majmin) is not None


@dataclass(frozen=True)
class ReadCap:
    """The read limits a cgroup puts on one disk, and where it counts what it charged."""

    majmin: str
    iops: int | None          # reads (bios) a second allowed; None: no count limit
    bps: int | None           # bytes a second allowed; None: no byte limit
    cgroup: Path              # the cgroup directory that sets it
    v2: bool

    @property
    def source(self) -> str:
        files = ("io.max",) if self.v2 else tuple(
            _V1_LIMITS[k] for k in ("iops", "bps") if getattr(self, k) is not None)
        return f"{', '.join(files)} of cgroup {self.cgroup}"

    def charged(self) -> tuple[int, int] | None:
        """(read bios, read bytes) the cgroup has charged on this disk so far; None when
        its counters cannot be read."""
        if self.v2:
            text = read_text(self.cgroup / "io.stat")
            ios, nbytes = v2_stat(text, self.majmin, "rios"), v2_stat(text, self.majmin, "rbytes")
        else:
            ios, nbytes = (v1_reads(read_text(self.cgroup / f), self.majmin) for f in _V1_COUNTS)
        if ios is None and nbytes is None:
            # Nothing charged yet: the kernel lists a device only after its first bio.
            return (0, 0) if self._counters_exist() else None
        return ios or 0, nbytes or 0

    def _counters_exist(self) -> bool:
        return (self.cgroup / ("io.stat" if self.v2 else _V1_COUNTS[0])).exists()

    def limits(self) -> dict[str, float | None]:
        """{"iops": reads/s, "mib_s": MiB/s} allowed (None: no such limit), as the
        monitor's figures carry them."""
        return {"iops": self.iops, "mib_s": None if self.bps is None else self.bps / 2**20}


def cgroup_dir(pid: int | str = "self", *, v2: bool) -> Path | None:
    """The blkio (v1) or unified (v2) cgroup directory of process `pid`, where mounted."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
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


def read_text(path: Path) -> str:
    """A kernel file's text; "" when it cannot be read (gone, no permission)."""
    try:
        return path.read_text()
    except OSError:
        return ""


def read_cap(dev: BlockDevice | None, pid: int | str = "self") -> ReadCap | None:
    """The read cap process `pid`'s own cgroup puts on `dev` (v1 blkio first, as the kernel
    applies it on a hybrid machine), or None."""
    if dev is None:
        return None
    mm = dev.majmin
    v1 = cgroup_dir(pid, v2=False)
    if v1 is not None:
        lim = {k: v1_limit(read_text(v1 / f), mm) for k, f in _V1_LIMITS.items()}
        if any(v is not None for v in lim.values()):
            return ReadCap(mm, lim["iops"], lim["bps"], v1, v2=False)
    v2 = cgroup_dir(pid, v2=True)
    if v2 is not None:
        lim = v2_limits(read_text(v2 / "io.max"), mm)
        if lim:
            return ReadCap(mm, lim.get("iops"), lim.get("bps"), v2, v2=True)
    return None


__all__ = ["ReadCap", "capped", "cgroup_dir", "read_cap", "read_text", "v1_limit", "v1_reads",
           "v2_limits", "v2_stat"]
