"""Slow-storage emulation for tests, benchmarks and the demo.

- `IoThrottle`: cap read IOPS/bandwidth of a disk for chosen processes (cgroup blkio/io).
- `SlowMount`: a FUSE mirror of a directory that adds latency per open/read (network FS).
- `NetCap`, `CappedSeaweed`: a `tc tbf` bandwidth cap on a veth into a network namespace
  of the caller's own (root), and SeaweedFS inside it.
- `drop_caches`: make the next read cold (lives in `autotune.cache`, re-exported here).

Names are imported lazily so that `python -m autotune.emulate.slowfs` does not import its
own module twice.
"""

from __future__ import annotations

from typing import Any

__all__ = ["IoThrottle", "IoStats", "detect_backend", "SlowMount", "NetCap", "CappedSeaweed",
           "drop_caches"]

_WHERE = {"IoThrottle": "throttle", "IoStats": "throttle", "detect_backend": "throttle",
          "SlowMount": "slowfs", "NetCap": "netcap", "CappedSeaweed": "netcap"}


def __getattr__(name: str) -> Any:
    import importlib

    if name == "drop_caches":
        from autotune.cache import drop_caches
        return drop_caches
    if name in _WHERE:
        return getattr(importlib.import_module(f"autotune.emulate.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'autotune.emulate' has no attribute {name!r}")
