"""Reads issued to one disk while the replay runs, so each figure says its I/Os per file.

Behind a cgroup cap (blk-throttle: cgroup v1 `blkio.throttle.*`, v2 `io.max`) the cap
charges every bio before the elevator merges them, so the figure that explains a capped
files/s is the cgroup's own count of charged bios (`blkio.throttle.io_serviced`, v2
`io.stat rios`: autotune.readcap), not the disk's merged requests. Without a cap on this disk the disk's
completed reads (/proc/diskstats, the whole machine's) are counted instead.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from autotune.blockdev import BlockDevice
from autotune.readcap import ReadCap, read_cap, read_text


def diskstats_reads(text: str, name: str) -> int | None:
    """Reads completed by disk `name` in /proc/diskstats (its 4th field)."""
    for line in text.splitlines():
        f = line.split()
        if len(f) > 3 and f[2] == name:
            return int(f[3])
    return None


def read_counter(dev: BlockDevice | None) -> tuple[Callable[[], int | None], str] | None:
    """(a function returning the running count of reads, what it counts) for `dev`: the
    capped cgroup's charged bios when this process sits behind a read cap on it, else the
    disk's completed reads; None when neither can be read."""
    if dev is None:
        return None
    cap = read_cap(dev)
    if cap is not None and cap.charged() is not None:
        capped_by: ReadCap = cap

        def charged() -> int:
            return (capped_by.charged() or (0, 0))[0]

        return charged, "bios charged by the cgroup's read cap"
    if diskstats_reads(read_text(Path("/proc/diskstats")), dev.name) is None:
        return None
    return (lambda: diskstats_reads(read_text(Path("/proc/diskstats")), dev.name),
            f"reads completed by {dev.name} (/proc/diskstats: the whole machine's)")
