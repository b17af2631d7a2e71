"""Memory figures for the budget: worker PSS, batch bytes, the machine's available memory."""

from __future__ import annotations

import os
from typing import Any


def pss_bytes(pid: int) -> int | None:
    """Proportional set size of one process (/proc/PID/smaps_rollup), None when unreadable.

    PSS, not RSS: forked workers share the parent's pages, and RSS would count each shared
    page once per worker."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def mem_available() -> int:
    """MemAvailable from /proc/meminfo in bytes (0 when unreadable)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def default_budget() -> int:
    """Half the available memory, as tf.data's autotune budgets its buffers."""
    return mem_available() // 2


def batch_bytes(batch: Any, _depth: int = 0) -> int:
    """Bytes of the tensors and arrays in a (nested) batch; what a batch in flight holds in
    shared memory."""
    if _depth > 8:
        return 0
    nbytes = getattr(batch, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if hasattr(batch, "element_size") and hasattr(batch, "numel"):
        return int(batch.element_size() * batch.numel())
    if isinstance(batch, dict):
        return sum(batch_bytes(v, _depth + 1) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_bytes(v, _depth + 1) for v in batch)
    return 0


def footprint(num_workers: int, prefetch_factor: int | None, per_worker: int,
              per_batch: int) -> int:
    """Workers' PSS plus the batches in flight: workers x prefetch x batch bytes."""
    return num_workers * per_worker + num_workers * (prefetch_factor or 0) * per_batch


def own_pss() -> int:
    """This process's PSS: the estimate of a worker's before any worker was measured (a
    spawned worker rebuilds the dataset; a forked one grows toward it by copy-on-write)."""
    return pss_bytes(os.getpid()) or 0
