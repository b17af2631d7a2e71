"""The job's memory cgroup, per interval: its limit, its working set, the OOM kills in it.

A container's memory limit (docker run --memory, a Kubernetes pod's limits.memory, a Slurm
job's cgroup) ends a job that passes it through the kernel's OOM killer: a SIGKILL to the
process it picks, which prints nothing. A DataLoader worker killed so shows in the log as
"DataLoader worker (pid N) is killed by signal: Killed"; the training process killed so
leaves only its status, 137, and the monitor's own process, in the same cgroup, may go
with it. The cgroup counts every kill (v1 memory.oom_control's `oom_kill`, kernel 4.13
and later; v2 memory.events' `oom_kill`): a job killed while that count rose was ended by
its memory limit.

`MemcgSampler(pid)` finds the limit binding process `pid` (its own cgroup's or an
ancestor's: autotune.environment.read_memory_limit on /proc/PID/cgroup) at its first read;
each `section()` after is the "memcg" section of a monitor record: `limit_bytes`,
`limit_file`, `usage_bytes`, `working_set_bytes` (usage less inactive file pages: what
reclaim cannot simply drop, as the environment counts it), `oom_kills` (since the first
read; null where the kernel does not count them). None where no limit binds the job
(nothing to say); `available: false` and the reason where it cannot be read, never an
exception. `totals()` is run.json's `memory`: the limit, the fullest working set seen
and the OOM kills over the run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from autotune.environment import cgroup_usage, read_memory_limit


def oom_kills(d: Path, kind: str) -> int | None:
    """The OOM kills the cgroup `d` has counted; None where the kernel does not say."""
    f = d / ("memory.events" if kind == "v2" else "memory.oom_control")
    try:
        text = f.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        if k == "oom_kill" and v.strip().isdigit():
            return int(v)
    return None


def v2_max(d: Path) -> tuple[int, Path] | None:
    """The tightest memory.max from cgroup v2 directory `d` up (bytes, file); None where
    every one is "max" (no limit the OOM killer acts at)."""
    best: tuple[int, Path] | None = None
    while (f := d / "memory.max").is_file():
        try:
            raw = f.read_text().strip()
        except OSError:
            break
        if raw.isdigit() and (best is None or int(raw) < best[0]):
            best = (int(raw), f)
        if d.parent == d:
            break
        d = d.parent
    return best


class MemcgSampler:
    """Per-interval figures of the memory cgroup whose limit binds process `pid`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._dir: Path | None = None
        self._kind = ""
        self._limit: int | None = None
        self._file = ""
        self._kills0: int | None = None
        self._kills: int | None = None
        self._peak: tuple[int, float] | None = None   # (working set, time)
        self._read = False

    def _resolve(self) -> bool:
        """The binding limit, once (False: none binds the job)."""
        if not self._read:
            self._read = True
            lim = read_memory_limit(cgroup_file=f"/proc/{self.pid}/cgroup")
            if lim.limit_bytes is None or lim.kind is None:
                return False
            found: tuple[int, Path] | None = (lim.limit_bytes, Path(lim.source))
            if lim.source.endswith("memory.high"):
                # v2's memory.high throttles and reclaims, it kills nothing: the OOM killer
                # acts at a memory.max, this cgroup's or an ancestor's.
                found = v2_max(Path(lim.source).parent)
            if found is not None:
                self._limit, self._file, self._kind = found[0], str(found[1]), lim.kind
                self._dir = found[1].parent
                self._kills0 = oom_kills(self._dir, self._kind)
        return self._dir is not None

    def section(self) -> dict[str, Any] | None:
        """This interval's "memcg" section; None where no limit binds the job."""
        try:
            if not self._resolve():
                return None
            assert self._dir is not None
            notes: list[str] = []
            usage, inactive = cgroup_usage(self._dir, self._kind, notes)
        except Exception as e:  # noqa: BLE001  (a figure, never a reason to stop)
            return {"available": False, "reason": f"{type(e).__name__}: {e}"}
        if usage is None:
            return {"available": False, "reason": "; ".join(notes) or "no usage figure"}
        ws = max(0, usage - (inactive or 0))
        if self._peak is None or ws > self._peak[0]:
            self._peak = (ws, time.time())
        now = oom_kills(self._dir, self._kind)
        if now is not None and self._kills0 is not None:
            self._kills = max(0, now - self._kills0)
        return {"available": True, "limit_bytes": self._limit, "limit_file": self._file,
                "usage_bytes": usage, "working_set_bytes": ws, "oom_kills": self._kills}

    def totals(self) -> dict[str, Any] | None:
        """run.json's `memory`: the limit, the fullest working set sampled and when, the
        OOM kills in the cgroup over the run; None where no limit bound the job."""
        if self._dir is None:
            return None
        self.section()   # the last count: a kill at the very end
        ws, t = self._peak if self._peak is not None else (None, None)
        return {"limit_bytes": self._limit, "limit_file": self._file,
                "peak_working_set_bytes": ws, "peak_time": t, "oom_kills": self._kills}


__all__ = ["MemcgSampler", "oom_kills", "v2_max"]
