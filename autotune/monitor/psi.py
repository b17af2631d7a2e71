"""I/O pressure (PSI) beside the time budget: the share of wall time in which some (or all)
of the job's tasks were stalled on I/O.

The job's own cgroup v2 `io.pressure` where it has one (its cgroup from /proc/PID/cgroup's
`0::` line under the cgroup2 mount, e.g. /sys/fs/cgroup/unified here), scope "cgroup";
else the machine-wide /proc/pressure/io, scope "machine" (a job in the root cgroup is the
machine's). The avg over a window is the delta of `total=` (microseconds stalled) over the
window's wall time, not the kernel's own avg10 (a 10 s decay that a 0.5 s window would smear).
"""

from __future__ import annotations

import os
import time
from typing import Any

from autotune.monitor.proctree import read_proc

MACHINE_PSI = "/proc/pressure/io"


def cgroup2_mount(mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """Where the cgroup v2 hierarchy is mounted (None when it is not)."""
    data = read_proc(mountinfo, 1 << 20)
    for line in (data or b"").decode("utf-8", "replace").splitlines():
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            return left.split()[4]
    return None


def job_psi_file(pid: int) -> tuple[str, str]:
    """(io.pressure file, scope) for `pid`: its own cgroup's, else the machine's."""
    data = read_proc(f"/proc/{pid}/cgroup", 65536) or b""
    mount = cgroup2_mount()
    for line in data.decode("utf-8", "replace").splitlines():
        if line.startswith("0::"):
            rel = line[3:].strip()
            if mount and rel not in ("", "/"):
                path = os.path.join(mount, rel.lstrip("/"), "io.pressure")
                if os.path.exists(path):
                    return path, "cgroup"
    return MACHINE_PSI, "machine"


def parse_totals(data: bytes) -> dict[str, int]:
    """{"some": us, "full": us} from an io.pressure file's text."""
    out: dict[str, int] = {}
    for line in data.decode("ascii", "replace").splitlines():
        kind, *fields = line.split()
        for f in fields:
            if f.startswith("total="):
                out[kind] = int(f[6:])
    return out


class PsiReader:
    """Deltas of an io.pressure file between `take()`s, as % of wall time."""

    def __init__(self, pid: int) -> None:
        self.path, self.scope = job_psi_file(pid)
        self.note: str | None = None
        self._last = self._read()
        if self._last is None:
            self.note = f"no {self.path} (a kernel without PSI, or booted psi=0): PSI not shown"

    def _read(self) -> tuple[float, dict[str, int]] | None:
        data = read_proc(self.path)
        if not data:
            return None
        totals = parse_totals(data)
        return (time.monotonic(), totals) if totals else None

    def take(self) -> dict[str, Any] | None:
        """{"scope", "file", "some_pct", "full_pct"} since the previous take, or None."""
        cur = self._read()
        last, self._last = self._last, cur
        if cur is None or last is None or cur[0] <= last[0]:
            return None
        wall_us = (cur[0] - last[0]) * 1e6
        out: dict[str, Any] = {"scope": self.scope, "file": self.path}
        for k in ("some", "full"):
            a, b = last[1].get(k), cur[1].get(k)
            out[f"{k}_pct"] = (None if a is None or b is None
                               else max(0.0, min(100.0, (b - a) / wall_us * 100.0)))
        return out


__all__ = ["MACHINE_PSI", "PsiReader", "cgroup2_mount", "job_psi_file", "parse_totals"]
