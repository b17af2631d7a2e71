"""/dev/shm usage: DataLoader workers hand batches to the parent through it, and a full
/dev/shm ("Bus error" / "unable to write to file </torch_...>") is a classic failure."""

from __future__ import annotations

import os
from dataclasses import dataclass

from autotune.monitor.records import Unavailable, record_dict

DEV_SHM = "/dev/shm"


@dataclass(frozen=True)
class ShmUsage:
    """Bytes used and total of the filesystem at /dev/shm."""

    used_bytes: int
    total_bytes: int

    def to_dict(self) -> dict:
        return record_dict(self)


def shm_usage(path: str = DEV_SHM) -> ShmUsage | Unavailable:
    """statvfs of `path` (default /dev/shm)."""
    try:
        st = os.statvfs(path)
    except OSError as e:
        return Unavailable(f"{path}: {e.strerror}")
    return ShmUsage(used_bytes=(st.f_blocks - st.f_bfree) * st.f_frsize,
                    total_bytes=st.f_blocks * st.f_frsize)
