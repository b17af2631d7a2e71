"""Memory figures for the budget: worker PSS, the default budget, a configuration's
footprint (a batch's bytes are autotune.shmfit.measure_batch's)."""

from __future__ import annotations

import os
from typing import Any


def pss_bytes(pid: int) -> int | None:
    """Proportional set size of one process, None (or 0: gone) when unreadable.

    PSS, not RSS: forked workers share the parent's pages, and RSS would count each shared
    page once per worker."""
    from autotune.monitor.proctree import read_pss_bytes

    return read_pss_bytes(pid)


def default_budget(env: Any = None, ranks: int = 1) -> int:
    """Half the memory this job may still take, as tf.data's autotune budgets its buffers:
    its cgroup's limit less its working set where a limit is set (a container's, a Slurm
    job's), else the host's available memory, from `env` (the loader's one reading of
    autotune.environment; None: read here); this rank's share
    of the node's `ranks`, and divided again under memory.oom.group=1
    (autotune.shmfit.oom_group_divisor, as the /dev/shm budget is)."""
    from autotune.shmfit import oom_group_divisor

    if env is None:
        from autotune.environment import read_environment

        env = read_environment()
    whole = env.memory_budget()
    return max(1, whole // 2 // max(1, ranks) // oom_group_divisor(env))


def over_limit(budget: int, env: Any = None) -> str | None:
    """The warning for a user's `memory_budget` above the cgroup's memory limit (the OOM
    killer acts at the limit, whatever the budget says), or None. `env`: the loader's
    reading of autotune.environment (None: the cgroup is read here)."""
    if env is not None:
        lim = env.memory
    else:
        from autotune.environment import read_memory_limit

        lim = read_memory_limit()
    if lim.limit_bytes is None or budget <= lim.limit_bytes:
        return None
    return (f"memory_budget={budget:,} bytes ({budget / 2**20:,.0f} MiB) is over this job's "
            f"cgroup memory limit of {lim.limit_bytes:,} bytes ({lim.limit_bytes / 2**20:,.0f} "
            f"MiB, {lim.source}): the OOM killer acts at the limit; give at most half of it, "
            "or leave memory_budget unset (half of what the cgroup has left)")


def footprint(num_workers: int, prefetch_factor: int | None, per_worker: int,
              per_batch: int) -> int:
    """Workers' PSS plus their live batches as autotune.shmfit counts them for /dev/shm:
    (workers x prefetch + 1) x batch bytes, with its margin (`shmfit.needed_bytes`)."""
    from autotune.shmfit import needed_bytes

    if not num_workers:
        return 0
    return num_workers * per_worker + (needed_bytes(num_workers, prefetch_factor, per_batch)
                                       if per_batch else 0)


def own_pss() -> int:
    """This process's PSS: the estimate of a worker's before any worker was measured (a
    spawned worker rebuilds the dataset; a forked one grows toward it by copy-on-write)."""
    return pss_bytes(os.getpid()) or 0
