"""Disk figures from /proc/diskstats, computed exactly as `iostat -x` (sysstat) does.

sysstat's formulas (iostat.c, common.c `compute_ext_disk_stats`), with Δt in seconds:

    r/s      = Δreads / Δt
    rMB/s    = Δsectors_read / 2048 / Δt        -> MiB/s (sectors are always 512 bytes), so
                                                   our field is `read_mib_s`
    r_await  = Δread_ms / Δreads                 (0 when there were no reads)
    rareq-sz = Δsectors_read / 2 / Δreads        (KiB)
    aqu-sz   = Δweighted_ms / (Δt * 1000)        (field 11, time_in_queue)
    %util    = Δio_ms / (Δt * 1000) * 100        (capped at 100 here)

Usage: `DiskStatsReader(dev).snapshot()` twice, then `disk_rates(before, after)`.

Behind a cgroup read cap on the disk (autotune.readcap; `DiskStatsReader(dev, cap=...)`)
the rates also carry the cap's limits and the reads the cgroup charged against it
(`cap_reads_per_s`, `cap_read_mib_s`): the job's own reads, where r/s is the whole disk's.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from autotune.blockdev import MEMORY_FS, OVERLAY_FS, BlockDevice, block_device_for, mount_for
from autotune.monitor.records import Unavailable, record_dict
from autotune.readcap import ReadCap

DISKSTATS = "/proc/diskstats"

# The kernel prints the millisecond counters as `unsigned int` (diskstats_show), so they
# wrap at 2**32 ms (49.7 days of busy time) even on 64-bit kernels; the counts are
# unsigned long and, on 64-bit kernels, never wrap in practice.
_U32 = 1 << 32

# Fields after "major minor name": 11 (kernels < 4.18), 15 (+ discards, 4.18+),
# 17 (+ flushes, 5.5+). Partitions on kernels < 2.6.25 had 4: not supported (we read disks).
_SUPPORTED_COUNTS = (11, 15, 17)


@dataclass(frozen=True)
class DiskCounters:
    """One /proc/diskstats line, cumulative since boot. Absent fields (older kernels) are None."""

    major: int
    minor: int
    name: str
    reads: int
    reads_merged: int
    sectors_read: int
    read_ms: int
    writes: int
    writes_merged: int
    sectors_written: int
    write_ms: int
    in_flight: int          # instantaneous, not cumulative
    io_ms: int              # time the device had I/O in flight (%util)
    weighted_ms: int        # time_in_queue: sum of all in-flight I/O times (aqu-sz)
    discards: int | None = None
    discards_merged: int | None = None
    sectors_discarded: int | None = None
    discard_ms: int | None = None
    flushes: int | None = None
    flush_ms: int | None = None


def parse_diskstats_line(line: str) -> DiskCounters:
    """Parse one line of /proc/diskstats (14, 18 or 20 whitespace-separated fields).

    Raises ValueError on any other shape, naming the field count.
    """
    parts = line.split()
    if len(parts) < 3:
        raise ValueError(f"/proc/diskstats line too short: {line!r}")
    values = parts[3:]
    if len(values) not in _SUPPORTED_COUNTS:
        raise ValueError(f"/proc/diskstats line has {len(parts)} fields, expected 14, 18 or 20: "
                         f"{line.strip()!r}")
    n = [int(v) for v in values]
    extra: dict[str, int] = {}
    if len(n) >= 15:
        extra.update(discards=n[11], discards_merged=n[12], sectors_discarded=n[13],
                     discard_ms=n[14])
    if len(n) >= 17:
        extra.update(flushes=n[15], flush_ms=n[16])
    return DiskCounters(int(parts[0]), int(parts[1]), parts[2], *n[:11], **extra)


def parse_diskstats(text: str) -> dict[str, DiskCounters]:
    """All devices of a /proc/diskstats text, by kernel name; unparseable lines are skipped."""
    out: dict[str, DiskCounters] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            c = parse_diskstats_line(line)
        except ValueError:
            continue  # e.g. a 2.6.x partition line: never the whole disk we read
        out[c.name] = c
    return out


@dataclass(frozen=True)
class DiskSnapshot:
    """Counters of one device plus the clocks they were read at."""

    counters: DiskCounters
    monotonic: float   # time.monotonic(): the Δt of the rates
    time: float        # time.time(): for joining with logs
    cap: ReadCap | None = None
    charged: tuple[int, int] | None = None   # (bios, bytes) the cap's cgroup charged so far


class DiskStatsReader:
    """Reads one device's line from /proc/diskstats.

    `device` is a BlockDevice (matched by major:minor, which survives renames) or a kernel
    name such as "vda" / "nvme0n1".
    """

    def __init__(self, device: BlockDevice | str, path: str = DISKSTATS,
                 cap: ReadCap | None = None) -> None:
        self.device = device
        self.cap = cap
        self.name = device.name if isinstance(device, BlockDevice) else device
        self._path = path
        self._majmin = (device.major, device.minor) if isinstance(device, BlockDevice) else None

    def snapshot(self) -> DiskSnapshot:
        """Current counters; raises LookupError if the device is not in /proc/diskstats."""
        with open(self._path, "rb") as f:   # one read(): the kernel prints it atomically per line
            text = f.read().decode()
        mono, wall = time.monotonic(), time.time()
        for line in text.splitlines():
            parts = line.split(None, 3)
            if len(parts) < 4:
                continue
            if self._majmin is not None:
                hit = (int(parts[0]), int(parts[1])) == self._majmin
            else:
                hit = parts[2] == self.name
            if hit:
                charged = self.cap.charged() if self.cap is not None else None
                return DiskSnapshot(parse_diskstats_line(line), mono, wall, self.cap, charged)
        raise LookupError(f"{self.name}: not in {self._path}")


@dataclass(frozen=True)
class DiskRates:
    """iostat -x figures for one device over one interval (see the module docstring)."""

    device: str
    interval_s: float
    reads_per_s: float        # iostat r/s
    read_mib_s: float         # iostat rMB/s (-m); MiB = 2**20 bytes
    reads_merged_per_s: float  # iostat rrqm/s
    r_await_ms: float         # iostat r_await
    rareq_sz_kib: float       # iostat rareq-sz
    writes_per_s: float       # iostat w/s
    write_mib_s: float        # iostat wMB/s
    w_await_ms: float         # iostat w_await
    aqu_sz: float             # iostat aqu-sz
    util_pct: float           # iostat %util, capped at 100
    in_flight: int            # I/Os in flight at the end of the interval
    # Behind a cgroup read cap: its limits and what the cgroup charged (None: no cap).
    cap_iops: int | None = None
    cap_mib_s: float | None = None
    cap_reads_per_s: float | None = None
    cap_read_mib_s: float | None = None

    def to_dict(self) -> dict:
        return record_dict(self)


def _delta(name: str, a: int, b: int, u32: bool = False) -> int:
    d = b - a
    if d < 0 and u32:
        d += _U32
    if d < 0:
        raise ValueError(f"{name} went backwards ({a} -> {b}): device reset or re-attached")
    return d


def disk_rates(before: DiskSnapshot, after: DiskSnapshot,
               interval_s: float | None = None) -> DiskRates:
    """iostat -x figures between two snapshots of the same device.

    `interval_s` overrides the monotonic-clock interval (for recorded data).
    Raises ValueError when the interval is not positive or a counter went backwards.
    """
    a, b = before.counters, after.counters
    if (a.major, a.minor) != (b.major, b.minor):
        raise ValueError(f"snapshots of different devices: {a.name} and {b.name}")
    dt = interval_s if interval_s is not None else after.monotonic - before.monotonic
    if dt <= 0:
        raise ValueError(f"interval must be positive, got {dt!r} s")
    reads = _delta("reads", a.reads, b.reads)
    writes = _delta("writes", a.writes, b.writes)
    rsect = _delta("sectors_read", a.sectors_read, b.sectors_read)
    wsect = _delta("sectors_written", a.sectors_written, b.sectors_written)
    rms = _delta("read_ms", a.read_ms, b.read_ms, u32=True)
    wms = _delta("write_ms", a.write_ms, b.write_ms, u32=True)
    io_ms = _delta("io_ms", a.io_ms, b.io_ms, u32=True)
    wtd_ms = _delta("weighted_ms", a.weighted_ms, b.weighted_ms, u32=True)
    dt_ms = dt * 1000.0
    return DiskRates(
        device=b.name,
        interval_s=dt,
        reads_per_s=reads / dt,
        read_mib_s=rsect / 2048.0 / dt,
        reads_merged_per_s=_delta("reads_merged", a.reads_merged, b.reads_merged) / dt,
        r_await_ms=rms / reads if reads else 0.0,
        rareq_sz_kib=rsect / 2.0 / reads if reads else 0.0,
        writes_per_s=writes / dt,
        write_mib_s=wsect / 2048.0 / dt,
        w_await_ms=wms / writes if writes else 0.0,
        aqu_sz=wtd_ms / dt_ms,
        # io_ticks is sampled in jiffies by the kernel and can overshoot the wall interval
        # slightly; sysstat prints it uncapped, we cap so it always reads as a percentage.
        util_pct=min(100.0, io_ms / dt_ms * 100.0),
        in_flight=b.in_flight,
        **_cap_rates(before, after, dt),
    )


def _cap_rates(before: DiskSnapshot, after: DiskSnapshot, dt: float) -> dict[str, float | None]:
    cap = after.cap
    if cap is None or before.charged is None or after.charged is None:
        return {}
    ios, nbytes = (max(0, b - a) for a, b in zip(before.charged, after.charged))
    lim = cap.limits()
    return {"cap_iops": lim["iops"], "cap_mib_s": lim["mib_s"],
            "cap_reads_per_s": ios / dt, "cap_read_mib_s": nbytes / 2**20 / dt}


def resolve_disk(path: str | os.PathLike[str]) -> BlockDevice | Unavailable:
    """The whole disk whose /proc/diskstats line accounts for I/O on `path`, or why none does."""
    if isinstance(path, str) and path.startswith("s3://"):
        return Unavailable(f"{path}: object storage, read over the network (no local disk)")
    p = Path(path)
    if not p.exists():
        return Unavailable(f"{p}: no such file or directory")
    dev = block_device_for(p)
    if dev is not None:
        return dev
    m = mount_for(p)
    if m is None:
        return Unavailable(f"{p}: mount not found in /proc/self/mountinfo")
    if m.fstype in MEMORY_FS:
        return Unavailable(f"{m.fstype} has no block device ({m.mountpoint} is in memory)")
    if m.is_fuse:
        return Unavailable(f"FUSE filesystem ({m.fstype}) at {m.mountpoint}: its I/O is not "
                           "attributable to one local disk")
    if m.is_network:
        return Unavailable(f"network filesystem ({m.fstype}) at {m.mountpoint} has no local "
                           "block device")
    if m.fstype in OVERLAY_FS:
        return Unavailable(f"{m.fstype} filesystem at {m.mountpoint} has no single block "
                           "device; monitor a path on the underlying disk instead")
    return Unavailable(f"{m.fstype} filesystem at {m.mountpoint} ({m.source}): no block device "
                       f"for st_dev {m.dev_major}:{m.dev_minor}")
