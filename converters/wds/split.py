"""Which shards a rank reads: split by node first, then by local rank, the same every epoch.

    node n of N reads       shards[n::N]                  (stored order)
    local rank l of L reads node_shards[l::L]             (global rank = n * L + l)

The reader (autotune_converters.wds.reader) and `autotune stage --node-rank R --nnodes N` both use
these functions, so a node's staged copy holds exactly the shards its ranks read, every
epoch: only the order inside a rank's set (and the samples, through the shuffle buffer)
changes from epoch to epoch. Each split is a partition, so every sample is read exactly
once per epoch across all ranks (and, split again by DataLoader worker, all workers).

Ranks per node come from LOCAL_WORLD_SIZE (torchrun) or SLURM_NTASKS_PER_NODE (srun);
without either every rank counts as its own node. No torch here: staging imports it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TypeVar

T = TypeVar("T")
NODE_FILE = "node.json"  # in a copy staged for one node: {"node_rank": R, "nnodes": N, ...}


def node_shards(shards: Sequence[T], node: int, nnodes: int) -> list[T]:
    """The shards node `node` of `nnodes` holds and reads."""
    if nnodes < 1 or not 0 <= node < nnodes:
        raise ValueError(f"node rank must be in 0..{nnodes - 1} (nnodes {nnodes}), not {node}")
    return list(shards[node::nnodes])


def rank_shards(shards: Sequence[T], rank: int, world: int, local_world: int = 1) -> list[T]:
    """The shards global rank `rank` of `world` reads, with `local_world` ranks per node."""
    node, nnodes, local = placement(rank, world, local_world)
    return node_shards(shards, node, nnodes)[local::world // nnodes]


def placement(rank: int, world: int, local_world: int = 1) -> tuple[int, int, int]:
    """(node, nnodes, local rank) of a global rank; local_world that does not divide the
    world size (uneven nodes) counts every rank as its own node."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank must be in 0..{world - 1} (world size {world}), not {rank}")
    if local_world < 1 or world % local_world:
        return rank, world, 0
    return rank // local_world, world // local_world, rank % local_world


def local_world_size(env: Mapping[str, str] | None = None) -> int:
    """Ranks per node, from the launcher's environment (1 when it does not say)."""
    env = os.environ if env is None else env
    for var in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        v = env.get(var, "")
        digits = v.split("(", 1)[0].split(",", 1)[0].strip()  # Slurm: "4(x2)" or "4,2"
        if digits.isdigit() and int(digits) > 0:
            return int(digits)
    return 1
