"""Memory figures for the budget: worker PSS, batch bytes, the job's memory budget
(autotune.environment)."""

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


def default_budget() -> int:
    """Half the memory this job may still take, as tf.data's autotune budgets its buffers:
    its cgroup's limit less its working set where a limit is set (a container's, a Slurm
    job's), else the host's available memory (autotune.environment)."""
    from autotune.environment import read_environment

    return read_environment().memory_budget() // 2


def over_limit(budget: int) -> str | None:
    """The warning for a user's `memory_budget` above the cgroup's memory limit (the OOM
    killer acts at the limit, whatever the budget says), or None."""
    from autotune.environment import read_memory_limit

    lim = read_memory_limit()
    if lim.limit_bytes is None or budget <= lim.limit_bytes:
        return None
    return (f"memory_budget={budget:,} bytes ({budget / 2**20:,.0f} MiB) is over this job's "
            f"cgroup memory limit of {lim.limit_bytes:,} bytes ({lim.limit_bytes / 2**20:,.0f} "
            f"MiB, {lim.source}): the OOM killer acts at the limit; give at most half of it, "
            "or leave memory_budget unset (half of what the cgroup has left)")


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
