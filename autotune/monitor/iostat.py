"""Cross-check against sysstat: run `iostat -x` over an interval while the monitor samples
the same device, and report both sets of figures and their ratio.

The caller generates the load (e.g. a fio job on a scratch file it created); this module
only measures. Used by the tests and scripts/bench_monitor.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any

from autotune.errors import AutotuneError, ToolMissing
from autotune.monitor.diskstats import DiskStatsReader, disk_rates, resolve_disk
from autotune.monitor.records import Unavailable
from autotune.monitor.sampler import SystemMonitor

COMPARED = ("reads_per_s", "read_mib_s", "r_await_ms", "aqu_sz", "util_pct")


def parse_iostat_json(text: str, device: str) -> dict[str, float]:
    """Figures of `device` from the last report of `iostat -x -o JSON`, in our units."""
    stats = json.loads(text)["sysstat"]["hosts"][0]["statistics"]
    if not stats:
        raise AutotuneError("iostat printed no report; was the interval too short?")
    for d in stats[-1]["disk"]:
        if d["disk_device"] == device:
            # sysstat's kB are KiB (sectors / 2): / 1024 gives MiB like our read_mib_s.
            return {"reads_per_s": float(d["r/s"]), "read_mib_s": float(d["rkB/s"]) / 1024.0,
                    "r_await_ms": float(d["r_await"]), "aqu_sz": float(d["aqu-sz"]),
                    "util_pct": float(d["util"]), "writes_per_s": float(d["w/s"]),
                    "write_mib_s": float(d["wkB/s"]) / 1024.0}
    raise AutotuneError(f"iostat report has no device {device!r}")


def iostat_crosscheck(path: str | os.PathLike[str], seconds: int = 3,
                      interval: float = 0.5) -> dict[str, Any]:
    """Measure the disk behind `path` for `seconds` with iostat, a one-shot diskstats pair
    and a SystemMonitor, all over the same interval.

    Returns {"device", "seconds", "iostat", "oneshot", "monitor", "ratio"}, where ratio is
    monitor / iostat per figure (None when iostat saw 0). Raises ToolMissing without iostat
    and AutotuneError when `path` has no block device.
    """
    exe = shutil.which("iostat")
    if exe is None:
        raise ToolMissing("iostat not found: install sysstat (apt-get install sysstat)")
    dev = resolve_disk(path)
    if isinstance(dev, Unavailable):
        raise AutotuneError(f"cannot cross-check {path}: {dev.reason}")
    reader = DiskStatsReader(dev)
    cmd = [exe, "-x", "-d", "-y", "-o", "JSON", dev.name, str(int(seconds)), "1"]
    with SystemMonitor(path=path, interval=interval, gpu=False) as mon:
        before = reader.snapshot()
        # iostat reads its baseline right after exec and its end `seconds` later: bracketing
        # the process with our snapshots makes our window a few ms longer, negligible for
        # rates under a steady load.
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 30,
                              env={**os.environ, "LC_ALL": "C", "S_COLORS": "never"})
        after = reader.snapshot()
    if proc.returncode != 0:
        raise AutotuneError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    ref = parse_iostat_json(proc.stdout, dev.name)
    oneshot = disk_rates(before, after).to_dict()
    monitor = mon.summary()["window"].get("disk", {})
    ratio = {k: (monitor[k] / ref[k] if ref[k] else None) for k in COMPARED if k in monitor}
    return {"device": dev.name, "seconds": seconds, "iostat": ref,
            "oneshot": {k: oneshot[k] for k in COMPARED},
            "monitor": {k: monitor.get(k) for k in COMPARED},
            "monitor_samples": len(mon.records), "ratio": ratio}
