"""Which filesystem and block device hold a path.

Shared by the probe (classification), the system monitor (which /proc/diskstats line to
read) and the IOPS-cap emulation (the MAJ:MIN a blkio throttle needs). Linux only; on
anything it cannot resolve it answers None rather than guessing.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

# Filesystems with no block device of their own (or one whose I/O we cannot attribute).
NETWORK_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "lustre",
              "gpfs", "beegfs", "9p", "afs", "virtiofs", "orangefs", "wekafs"}
MEMORY_FS = {"tmpfs", "ramfs", "devtmpfs", "hugetlbfs"}
OVERLAY_FS = {"overlay", "aufs", "squashfs"}


@dataclass(frozen=True)
class MountInfo:
    """One line of /proc/self/mountinfo: the mount that holds a path."""

    mountpoint: str
    fstype: str
    source: str
    dev_major: int
    dev_minor: int
    options: str

    @property
    def is_fuse(self) -> bool:
        return self.fstype == "fuse" or self.fstype.startswith("fuse.")

    @property
    def is_network(self) -> bool:
        return self.fstype in NETWORK_FS or self.fstype.split(".")[-1] in {"sshfs", "s3fs", "gcsfuse", "rclone", "juicefs"}


@dataclass(frozen=True)
class BlockDevice:
    """A whole disk (partitions are mapped to their disk) as the kernel names it."""

    name: str            # e.g. "vda", "nvme0n1", "sda", "dm-0"
    major: int
    minor: int
    partition: str | None  # the partition the path lives on, e.g. "sda1"; None when whole disk
    rotational: bool | None

    @property
    def majmin(self) -> str:
        return f"{self.major}:{self.minor}"


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as three octal digits.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


@dataclass(frozen=True)
class MountEntry:
    """One parsed line of /proc/self/mountinfo (fields as proc(5) names them)."""

    majmin: str
    root: str
    mountpoint: str
    fstype: str
    source: str
    super_options: str


def mountinfo() -> list[MountEntry]:
    """Every mount of this process's namespace, in mount order (later ones stack on top);
    [] when /proc is not readable."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        left, _, right = line.partition(" - ")
        parts, rparts = left.split(), right.split()
        if len(parts) < 5 or len(rparts) < 2:
            continue
        out.append(MountEntry(parts[2], _unescape(parts[3]), _unescape(parts[4]), rparts[0],
                              _unescape(rparts[1]), rparts[2] if len(rparts) > 2 else ""))
    return out


def mount_for(path: str | os.PathLike[str]) -> MountInfo | None:
    """The mount holding `path` (the longest mountpoint prefix of its real path)."""
    real = os.path.realpath(path)
    best: MountInfo | None = None
    for e in mountinfo():
        mnt = e.mountpoint
        if not (real == mnt or real.startswith(mnt.rstrip("/") + "/")):
            continue
        if best is not None and len(mnt) < len(best.mountpoint):
            continue
        major, _, minor = e.majmin.partition(":")
        best = MountInfo(mountpoint=mnt, fstype=e.fstype, source=e.source,
                         dev_major=int(major), dev_minor=int(minor), options=e.super_options)
    return best


def block_device_for(path: str | os.PathLike[str]) -> BlockDevice | None:
    """The disk behind `path`, or None for tmpfs, overlay, FUSE, network filesystems.

    Uses st_dev of the path itself, so bind mounts and containers resolve correctly; a
    partition is mapped to its parent disk because /proc/diskstats utilisation is per disk.
    """
    try:
        st = os.stat(path)
    except OSError:
        return None
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    if major == 0:  # anonymous device: tmpfs, overlay, FUSE, NFS, btrfs subvolumes
        return _btrfs_or_none(path)
    return _block_device_from_majmin(major, minor)


def _block_device_from_majmin(major: int, minor: int) -> BlockDevice | None:
    sysdir = Path(f"/sys/dev/block/{major}:{minor}")
    try:
        real = sysdir.resolve(strict=True)
    except OSError:
        return None
    partition: str | None = None
    if (real / "partition").exists():
        partition = real.name
        real = real.parent
    name = real.name
    try:
        dmaj, _, dmin = (real / "dev").read_text().strip().partition(":")
        dmajor, dminor = int(dmaj), int(dmin)
    except (OSError, ValueError):
        dmajor, dminor = major, minor
    rot: bool | None
    try:
        rot = (real / "queue" / "rotational").read_text().strip() == "1"
    except OSError:
        rot = None
    return BlockDevice(name=name, major=dmajor, minor=dminor, partition=partition, rotational=rot)


def _btrfs_or_none(path: str | os.PathLike[str]) -> BlockDevice | None:
    # btrfs reports an anonymous st_dev; its mountinfo source names the real device.
    m = mount_for(path)
    if m is None or m.fstype != "btrfs" or not m.source.startswith("/dev/"):
        return None
    try:
        st = os.stat(m.source)
    except OSError:
        return None
    return _block_device_from_majmin(os.major(st.st_rdev), os.minor(st.st_rdev))
