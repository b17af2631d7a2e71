"""Whether a DataLoader configuration's batches fit in /dev/shm, and what would make them fit.

A worker process hands each batch to the training process through a file in /dev/shm
(torch's `file_descriptor` sharing strategy; `file_system` names files there too). The
file lives until the loop drops the batch, and torch puts the next index in a worker's
queue before it returns a batch, so at least `workers x prefetch + 1` batches are there at
once (`live_batches`). With `num_workers=0` the batch never leaves the process: no shm.

Docker's default /dev/shm is 64 MiB, a Kubernetes pod's the same without an `emptyDir` of
medium Memory: one float32 batch of 64 x 3x224x224 is 37 MiB, so only `num_workers=0`
fits there, and a configuration that does not fit dies ("unable to allocate shared memory"
or a Bus error) or hangs. `search`, `bench` and `autotune.DataLoader` all check here
first and never start one that does not fit.

The budget (`shm_budget`) is `Environment.shm_budget()` (free /dev/shm, no more than the
cgroup's remaining memory: tmpfs pages are charged to it; 0 without a /dev/shm) split
across the node's ranks, after NCCL's own segments when there is more than one rank and
NCCL may run (`NCCL_SHM_PER_RANK`; `nccl_on_node`), and halved under cgroup v2 `memory.oom.group=1`
(`oom_group_divisor`, the one place search and `autotune.DataLoader` take it from).
"""

from __future__ import annotations

import glob
import math
import os
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["BatchBytes", "MARGIN", "NCCL_SHM_PER_RANK", "OOM_GROUP_DIVISOR", "ShmAdvice",
           "ShmBudget", "SLACK_BYTES", "fits", "live_batches", "max_live_batches",
           "measure_batch", "nccl_on_node", "needed_bytes", "oom_group_divisor", "shm_advice", "shm_budget",
           "size_flag"]

MiB = 2**20
# A batch's file is its tensors' storage rounded up to pages, plus torch's own small files
# (the pin-memory thread's and the queues' pickles) and tmpfs' block rounding: 25 % and a
# few MiB over the tensors' bytes covers what was measured (37 MiB batches, 64 MiB tmpfs:
# the second batch in flight failed at 37 MiB used).
MARGIN = 1.25
SLACK_BYTES = 4 * MiB
# NCCL's shm transport (ranks on one node without P2P, and its proxy) creates one segment
# of 9,637,888 bytes per channel in /dev/shm (the size in NCCL's "Error while creating
# shared memory segment" reports in a 64 MiB container), and 2 channels is the usual count
# on a node of 2-4 GPUs: 2 x 9.2 MiB, rounded up to 20 MiB a rank. Reserved only when
# more than one rank shares the node.
NCCL_SHM_PER_RANK = 20 * MiB
DEFAULT_PREFETCH = 2  # torch's prefetch_factor when workers > 0 and none is given
# Under cgroup v2 memory.oom.group=1 (the Kubernetes default on v2) the OOM killer ends
# the whole job, not the one worker autotune could recover from: budgets are divided by
# this there, in search and bench (shm_budget) as in autotune.DataLoader (its shm and its
# default memory budget).
OOM_GROUP_DIVISOR = 2


def oom_group_divisor(env: Any) -> int:
    """What budgets are divided by in `env` (an `autotune.environment.Environment`):
    `OOM_GROUP_DIVISOR` under memory.oom.group=1, else 1."""
    return OOM_GROUP_DIVISOR if getattr(getattr(env, "memory", None), "oom_group", False) else 1


def live_batches(workers: int, prefetch: int | None) -> int:
    """Batches in /dev/shm at once: `workers x prefetch + 1` with workers (torch queues the
    next index before it returns a batch), 0 without (the batch stays in the process)."""
    if not workers:
        return 0
    return workers * (prefetch or DEFAULT_PREFETCH) + 1


def needed_bytes(workers: int, prefetch: int | None, batch_bytes: int) -> int:
    """/dev/shm a configuration needs: its live batches, with the margin."""
    n = live_batches(workers, prefetch)
    if n == 0:
        return 0
    return int(math.ceil(n * batch_bytes * MARGIN)) + SLACK_BYTES


def fits(workers: int, prefetch: int | None, batch_bytes: int | None,
         budget_bytes: int | None) -> bool:
    """Whether the configuration's batches fit in the budget; True when either figure is
    unknown (nothing to decide on) and always for `workers=0`; never with workers in a
    budget of 0 (no /dev/shm)."""
    if not workers or budget_bytes is None:
        return True
    if budget_bytes <= 0:
        return False  # no /dev/shm at all: whatever the batch, workers cannot hand it over
    if batch_bytes is None:
        return True
    return needed_bytes(workers, prefetch, batch_bytes) <= budget_bytes


def max_live_batches(batch_bytes: int, budget_bytes: int) -> int:
    """The most live batches the budget holds (0: not even one worker with prefetch 1,
    which needs 2)."""
    room = budget_bytes - SLACK_BYTES
    if batch_bytes <= 0:
        return 1 << 30
    n = int(room // (batch_bytes * MARGIN)) if room > 0 else 0
    return n if n >= 2 else 0


@dataclass(frozen=True)
class BatchBytes:
    """One batch's bytes, how many of them are 4-byte floats (what uint8 would make a
    quarter), and its tensors (each an open file while a worker hands it over:
    autotune.openfiles)."""

    total: int
    float32: int = 0
    tensors: int = 0

    @property
    def as_uint8(self) -> int:
        """The batch's bytes with its float32 tensors as uint8 (normalised on the accelerator)."""
        return self.total - self.float32 + self.float32 // 4


def measure_batch(batch: Any, _depth: int = 0) -> BatchBytes:
    """Bytes of the tensors and arrays in a (nested) batch, and of its float32 ones."""
    if _depth > 8:
        return BatchBytes(0)
    if hasattr(batch, "element_size") and hasattr(batch, "numel"):
        n = int(batch.element_size() * batch.numel())
        f32 = n if str(getattr(batch, "dtype", "")) in ("torch.float32", "float32") else 0
        return BatchBytes(n, f32, 1)
    nbytes = getattr(batch, "nbytes", None)
    if isinstance(nbytes, int):
        f32 = nbytes if str(getattr(batch, "dtype", "")) == "float32" else 0
        return BatchBytes(nbytes, f32)
    parts: list[BatchBytes] = []
    if isinstance(batch, dict):
        parts = [measure_batch(v, _depth + 1) for v in batch.values()]
    elif isinstance(batch, (list, tuple)):
        parts = [measure_batch(v, _depth + 1) for v in batch]
    return BatchBytes(sum(p.total for p in parts), sum(p.float32 for p in parts),
                      sum(p.tensors for p in parts))


@dataclass(frozen=True)
class ShmBudget:
    """The /dev/shm one rank's loader may fill: `budget_bytes` (None: unknown, nothing is
    refused). `free_bytes` is what the environment reported, `reserved_bytes` NCCL's share."""

    budget_bytes: int | None
    total_bytes: int | None
    free_bytes: int | None
    ranks: int = 1
    reserved_bytes: int = 0
    source: str = ""
    oom_group: bool = False      # halved: memory.oom.group=1 ends the whole job

    def to_dict(self) -> dict:
        return asdict(self)


def nccl_on_node() -> bool:
    """Whether NCCL (RCCL on AMD) may run on this node: an NVIDIA or AMD accelerator's
    device is there. Without one the ranks speak gloo or MPI over sockets, and those hold
    nothing in /dev/shm."""
    return (os.path.exists("/proc/driver/nvidia/version") or bool(glob.glob("/dev/nvidia[0-9]*"))
            or os.path.exists("/dev/kfd"))


def shm_budget(env: Any, ranks: int = 1, nccl: bool | None = None) -> ShmBudget:
    """The per-rank budget from an `autotune.environment.Environment`: its `shm_budget()`
    less NCCL's segments (more than one rank, and `nccl`: default `nccl_on_node()`), split
    across `ranks`."""
    ranks = max(1, int(ranks))
    whole = env.shm_budget()
    total, free = env.shm.total_bytes, env.shm.free_bytes
    if whole is None:
        return ShmBudget(None, total, free, ranks, 0, env.shm.note or "/dev/shm unknown")
    if whole <= 0 and total is None:
        return ShmBudget(0, total, free, ranks, 0, env.shm.note or "no /dev/shm")
    src = "free /dev/shm"
    if free is not None and whole < free:
        src = ("the cgroup's remaining memory (tmpfs pages are charged to it)"
               if getattr(env.memory, "limit_bytes", None) is not None
               else "the available memory")
    nccl = nccl_on_node() if nccl is None else nccl
    reserved = NCCL_SHM_PER_RANK * ranks if ranks > 1 and nccl else 0
    per = max(0, whole - reserved) // ranks
    if reserved:
        src += (f", less {reserved / MiB:.0f} MiB for NCCL's segments, split across "
                f"{ranks} ranks")
    elif ranks > 1:
        src += f", split across {ranks} ranks (no NCCL here: none held back for it)"
    div = oom_group_divisor(env)
    if div > 1:
        per //= div
        src += (f", divided by {div}: memory.oom.group is 1, so a worker the OOM killer "
                "ends takes the whole job with it")
    return ShmBudget(per, total, free, ranks, reserved, src, div > 1)


def size_flag(nbytes: int) -> tuple[str, str]:
    """A /dev/shm size rounded up sensibly: (docker `--shm-size` value, Kubernetes
    quantity). Under 1 GiB to a multiple of 64 MiB, else to whole GiB."""
    m = max(64, int(math.ceil(nbytes / (64 * MiB))) * 64)
    if m < 1024:
        return f"{m}m", f"{m}Mi"
    g = max(1, int(math.ceil(nbytes / 2**30)))
    return f"{g}g", f"{g}Gi"


@dataclass(frozen=True)
class ShmAdvice:
    """What would let a configuration that does not fit run: a larger /dev/shm (its size
    for every rank of the node and what other processes already hold there), or a smaller
    batch element."""

    workers: int
    prefetch: int | None
    batch_bytes: int
    needed_bytes: int            # this rank's loader
    shm_size_bytes: int          # the whole /dev/shm, every rank and what is already there
    docker: str                  # "--shm-size=512m"
    k8s_size_limit: str          # "512Mi"
    uint8_batch_bytes: int | None = None
    uint8_live_batches: int | None = None   # live batches uint8 would fit in the budget
    uint8_fits: bool | None = None           # the configuration itself with uint8

    def lines(self) -> list[str]:
        """The words the CLI prints (one fix a line)."""
        cfg = f"num_workers={self.workers}, prefetch_factor={self.prefetch or DEFAULT_PREFETCH}"
        out = [f"/dev/shm of {self.docker[len('--shm-size='):]} would run {cfg} "
               f"({live_batches(self.workers, self.prefetch)} batches of "
               f"{self.batch_bytes / MiB:.1f} MiB live): `docker run {self.docker}`, or in "
               f"Kubernetes an emptyDir with medium: Memory and sizeLimit: "
               f"{self.k8s_size_limit} mounted at /dev/shm"]
        if self.uint8_batch_bytes is not None:
            room = self.uint8_live_batches or 0
            if self.uint8_fits:
                what = f"{cfg} itself fits"
            elif room >= 2:
                what = (f"{room} live batches fit, e.g. workers x prefetch up to {room - 1}")
            else:
                what = "still no worker batch fits"
            out.append(f"uint8 batches instead of float32 ({self.uint8_batch_bytes / MiB:.1f} "
                       f"MiB, normalised on the accelerator): {what} in this /dev/shm")
        return out

    def to_dict(self) -> dict:
        d = asdict(self)
        d["lines"] = self.lines()
        return d


def shm_advice(workers: int, prefetch: int | None, batch: BatchBytes | int,
               budget: ShmBudget) -> ShmAdvice:
    """The /dev/shm size that would run this configuration on every rank of the node, and
    what uint8 batches would allow in the budget there is."""
    bb = batch if isinstance(batch, BatchBytes) else BatchBytes(int(batch))
    need = needed_bytes(workers, prefetch, bb.total)
    others = 0
    if budget.total_bytes is not None and budget.free_bytes is not None:
        others = max(0, budget.total_bytes - budget.free_bytes)
    whole = need * budget.ranks + budget.reserved_bytes + others
    docker, k8s = size_flag(whole)
    u8 = room = ok = None
    if bb.float32:
        u8 = bb.as_uint8
        if budget.budget_bytes is not None:
            room = max_live_batches(u8, budget.budget_bytes)
            ok = fits(workers, prefetch, u8, budget.budget_bytes)
    return ShmAdvice(workers, prefetch, bb.total, need, whole, f"--shm-size={docker}", k8s,
                     u8, room, ok)
