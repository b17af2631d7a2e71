"""The worker bound and the latency rule: how many DataLoader workers a job may use, and
whether waiting on reads is a setting to change or the storage to change.

One place for both, so that the search's space, the verdict, the in-loop tuner and the
object-storage reader agree:

    worker_bound(usable_cores=8)                            -> 8
    worker_bound(usable_cores=8, blocked_share=0.75)        -> 32  (each worker needs a core 1/4 of the time)
    worker_bound(usable_cores=16, ranks_per_node=4)         -> 4
    latency_verdict(needed_in_flight=32, bound=8)           -> storage (latency): settings cannot hide it
    latency_verdict(needed_in_flight=6, bound=8)            -> loader (latency): raise num_workers to 6

The bound is the usable cores (cgroup quota, affinity: autotune.cpus.usable_cores) per
rank; more only while workers are seen blocked on I/O (a worker blocked 75 % of its time
needs a core only 25 % of it, so cores / (1 - blocked) of them fill the cores), or the
storage was measured to need more reads in flight than that; never above 4x the cores
or 64 (each worker holds a copy of the dataset object and its prefetched batches).
Imports nothing: any module may call it.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_WORKERS = 64           # beyond this, worker start-up and memory dominate
RAISE_CAP = 4              # blocked workers may number at most this many times the cores
MAX_BLOCKED = 0.95         # a blocked share is capped so cores / (1 - blocked) stays finite


def worker_bound(usable_cores: int, ranks_per_node: int = 1, blocked_share: float | None = None,
                 memory_bound: int | None = None, reads_in_flight: int | None = None) -> int:
    """The most DataLoader workers one rank should use.

    usable_cores: the cores the job may run on (autotune.cpus.usable_cores()).
    ranks_per_node: training processes sharing those cores; each gets its share.
    blocked_share: the share of their time the workers were seen blocked on I/O (the time
        budget's io + storage_wait); raises the bound to cores / (1 - blocked).
    memory_bound: the most workers the memory holds (each holds its prefetched batches).
    reads_in_flight: reads in flight the storage was measured to need for its best rate
        (the probe's best concurrency); raises the bound up to it.
    """
    if usable_cores < 1:
        raise ValueError(f"usable_cores must be at least 1, but got {usable_cores}.")
    if ranks_per_node < 1:
        raise ValueError(f"ranks_per_node must be at least 1, but got {ranks_per_node}.")
    per_rank = max(1, usable_cores // ranks_per_node)
    cap = min(MAX_WORKERS, max(RAISE_CAP, per_rank * RAISE_CAP))
    bound = per_rank
    if blocked_share is not None and blocked_share > 0:
        b = min(float(blocked_share), MAX_BLOCKED)
        bound = max(bound, min(cap, int(per_rank / (1.0 - b) + 1e-9)))
    if reads_in_flight is not None and reads_in_flight > per_rank:
        bound = max(bound, min(cap, int(reads_in_flight)))
    if memory_bound is not None:
        bound = min(bound, max(1, int(memory_bound)))
    return bound


@dataclass
class LatencyCall:
    """What waiting on storage latency calls for: `bottleneck` "loader" (more reads in
    flight within the bound hide it) or "storage" (they would not fit)."""

    bottleneck: str
    label: str              # "loader (latency)" or "storage (latency)"
    reason: str             # one line with the figures
    needed_in_flight: int
    bound: int

    @property
    def within_bound(self) -> bool:
        return self.bottleneck == "loader"


def latency_verdict(needed_in_flight: int, bound: int, *, rate: float | None = None,
                    unit: str = "files/s", in_flight: int | None = None) -> LatencyCall:
    """The latency rule: the storage gives its rate (`rate` `unit`) only with
    `needed_in_flight` reads in flight; workers can supply them only up to `bound`.
    `in_flight`: the reads in flight the job has now (its workers)."""
    if needed_in_flight < 1:
        raise ValueError(f"needed_in_flight must be at least 1, but got {needed_in_flight}.")
    if bound < 1:
        raise ValueError(f"bound must be at least 1, but got {bound}.")
    at = f" ({rate:,.0f} {unit})" if rate else ""
    now = f", the job has {in_flight}" if in_flight is not None else ""
    if needed_in_flight > bound:
        return LatencyCall("storage", "storage (latency)",
                           f"hiding the latency takes {needed_in_flight} reads in flight{at}"
                           f"{now}, above the {bound}-worker bound: settings cannot hide it",
                           needed_in_flight, bound)
    return LatencyCall("loader", "loader (latency)",
                       f"hiding the latency takes {needed_in_flight} reads in flight{at}{now}, "
                       f"within the {bound}-worker bound: raise num_workers to "
                       f"{needed_in_flight}", needed_in_flight, bound)


__all__ = ["MAX_WORKERS", "LatencyCall", "latency_verdict", "worker_bound"]
