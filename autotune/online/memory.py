"""Memory figures for the budget: a worker's own memory, the default budget, a configuration's
footprint (a batch's bytes are autotune.shmfit.measure_batch's)."""

from __future__ import annotations

import os
from typing import Any


def private_bytes(pid: int) -> int | None:
    """A worker's own memory: the pages only it maps (its unique set, USS), None (or 0:
    gone) when unreadable.

    What the job's cgroup is charged for the worker alone. Not its PSS: a forked worker
    maps its parent's pages (torch's libraries, the interpreter, the dataset's index)
    until it writes them, and PSS gives it a share of pages the cgroup already holds for
    the training process; measured with torch 2.14.1 and an ImageFolder, a worker's PSS
    was 150 MiB and its USS 17-20 MiB. A page it copies on write becomes its own, so the
    figure grows as it does, and the loader reads it again at each decision."""
    from autotune.monitor.proctree import read_rollup_bytes

    return read_rollup_bytes(pid, ("Private_Clean", "Private_Dirty"))


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


def own_anonymous() -> int:
    """This process's anonymous memory: the estimate of a worker's before any worker was
    measured. A spawned worker builds as much again (the interpreter, torch, the
    dataset); a forked one shares it, and can come to hold at most that much by copying
    it on write, never the libraries' file pages, which the kernel holds once (they were
    half of a training process's 720 MiB PSS with torch 2.14.1)."""
    from autotune.monitor.proctree import read_rollup_bytes

    return read_rollup_bytes(os.getpid(), ("Anonymous",)) or 0


def worker_memory(pids: list[int], mp_context: Any, oom_group: bool) -> tuple[int, bool, bool]:
    """(a worker's own bytes, measured, try_one): the mean of the pool's workers `pids`
    (private_bytes), else this process's estimate (own_anonymous). A forked worker starts
    with nothing of its own, so where that estimate alone leaves no worker one may be
    started to measure it (try_one; autotune.online.limits.measure_one), but not where the
    OOM killer would take the whole job with it (memory.oom.group=1)."""
    sizes = [s for s in (private_bytes(p) for p in pids) if s]
    if sizes:
        return sum(sizes) // len(sizes), True, False
    from autotune.online.pool import start_method

    return own_anonymous(), False, start_method(mp_context) == "fork" and not oom_group
