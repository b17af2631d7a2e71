"""What kind of storage holds a path: nvme / ssd / hdd / network / memory / object / unknown
(object: an s3:// dataset, autotune.probe.objstore).

Kernel flags alone mislead (virtio and many cloud disks report rotational=1 while serving
100k IOPS; an SSD behind a cgroup throttle serves 500), so the class comes from the
device and filesystem and is then checked against what was measured; every step that
decided it is kept as evidence.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from autotune.blockdev import MEMORY_FS, OVERLAY_FS, BlockDevice, block_device_for, mount_for
from autotune.probe.fio import FioResult
from autotune.probe.replay import ReplayResult

CLASSES = ("nvme", "ssd", "hdd", "network", "memory", "object", "unknown")
HDD_MAX_IOPS = 1_000   # a 15k rpm disk serves ~200-400 random IOPS; SSDs serve >10k
SSD_MIN_IOPS = 5_000


@dataclass
class FilesystemInfo:
    type: str | None
    mountpoint: str | None
    source: str | None
    device: str | None           # kernel name of the disk, e.g. "nvme0n1"; None if none
    rotational: bool | None
    # "class" is a Python keyword; the JSON key is "class".
    klass: str = "unknown"
    behaves_like: str | None = None  # tier from measured figures, when they disagree
    evidence: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["class"] = d.pop("klass")
        return d


def _measured_tier(fio: FioResult | None, replay: ReplayResult | None) -> tuple[str | None, str]:
    if fio is not None and fio.rand_read.plausible:
        iops = fio.rand_read.iops
        if iops < HDD_MAX_IOPS:
            return "hdd", f"{iops:,.0f} random 4 KiB IOPS (< {HDD_MAX_IOPS:,}: disk-like)"
        if iops < SSD_MIN_IOPS:
            return "ssd", f"{iops:,.0f} random 4 KiB IOPS (slow SSD or capped volume)"
        return ("nvme" if iops > 200_000 else "ssd"), f"{iops:,.0f} random 4 KiB IOPS"
    if replay is not None:
        one = next((lv for lv in replay.by_concurrency if lv.concurrency == 1), None)
        if one is not None and one.files:
            p50 = one.lat_p50_ms
            tier = "hdd" if p50 >= 4 else ("ssd" if p50 >= 0.05 else "memory")
            return tier, f"replay per-file latency p50 {p50:.2f} ms at concurrency 1"
    return None, ""


def classify(path: str | os.PathLike[str], fio: FioResult | None = None,
             replay: ReplayResult | None = None) -> FilesystemInfo:
    """Classify the storage under `path`, using measured figures when given."""
    if isinstance(path, str) and path.startswith("s3://"):
        return FilesystemInfo(type="s3", mountpoint=None, source=None, device=None,
                              rotational=None, klass="object",
                              evidence=["an s3:// dataset: object storage, read over the network"])
    m = mount_for(path)
    dev = block_device_for(path)
    info = FilesystemInfo(type=m.fstype if m else None, mountpoint=m.mountpoint if m else None,
                          source=m.source if m else None, device=dev.name if dev else None,
                          rotational=dev.rotational if dev else None)
    ev = info.evidence
    tier, why = _measured_tier(fio, replay)
    if m is None:
        ev.append("no entry in /proc/self/mountinfo for this path")
    elif m.fstype in MEMORY_FS:
        info.klass = "memory"
        ev.append(f"filesystem {m.fstype} lives in RAM")
    elif m.is_network:
        info.klass = "network"
        ev.append(f"filesystem {m.fstype} from {m.source} is a network filesystem")
    elif m.is_fuse:
        ev.append(f"FUSE filesystem {m.fstype} ({m.source}): user-space, often remote "
                  "(s3fs, gcsfuse, sshfs)")
        info.klass = "network" if tier in ("hdd", None) and why else "unknown"
        if why:
            ev.append(f"measured {why}")
    elif dev is not None:
        _block_device(info, dev, tier, why)
    elif m.fstype in OVERLAY_FS:
        ev.append(f"{m.fstype} filesystem: the backing device is not visible from here")
        info.klass = tier or "unknown"
    else:
        ev.append(f"filesystem {m.fstype} has no block device visible from here")
        info.klass = tier or "unknown"
    if why and tier and tier != info.klass and info.klass in ("nvme", "ssd", "hdd"):
        info.behaves_like = tier
        ev.append(f"but measured {why}: behaves like {tier} (throttled or capped?)")
    elif why and f"measured {why}" not in ev and why not in " ".join(ev):
        ev.append(f"measured {why}")
    if fio is not None and not fio.rand_read.plausible:
        # Page-cache or RAM figures (buffered fio, tmpfs) would read as nvme: say they
        # were left out, and why.
        ev.append("fio's random-read figure not used for the class: "
                  + " ".join(fio.rand_read.warnings or ["failed the plausibility check"]))
    return info


def _block_device(info: FilesystemInfo, dev: BlockDevice, tier: str | None, why: str) -> None:
    """The class a block device's name and rotational flag give, the flag checked against
    the measured tier."""
    ev = info.evidence
    name = dev.name
    ev.append(f"block device {name} ({dev.majmin})"
              + (f", partition {dev.partition}" if dev.partition else "")
              + (f", rotational={int(dev.rotational)}" if dev.rotational is not None else ""))
    if name.startswith("nvme"):
        info.klass = "nvme"
    elif dev.rotational is False:
        info.klass = "ssd"
    elif dev.rotational is True:
        info.klass = "hdd"
        if tier in ("ssd", "nvme"):
            # Virtual disks (virtio, Xen, many cloud volumes) report rotational=1.
            info.klass = "ssd"
            ev.append(f"rotational flag contradicted by {why}: a virtual or "
                      "flash-backed disk, classed ssd")
    if name.startswith(("vd", "xvd")):
        ev.append(f"{name} is a paravirtual disk: its speed is the host's storage")
