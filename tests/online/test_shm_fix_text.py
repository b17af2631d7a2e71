"""The /dev/shm a fit or a fallback names when it leaves no worker: under DDP each rank's
budget is its share of the node's /dev/shm, so the size to give the container is the
node's (a user's walk: 2 ranks in a 64 MiB /dev/shm were each told "119 MiB of free
/dev/shm would hold num_workers=1, prefetch_factor=4"; a --shm-size of 119 MiB leaves each
rank 60 MiB, and still no worker)."""

from __future__ import annotations

from types import SimpleNamespace

from autotune.online.config import Config
from autotune.online.limits import no_worker_text
from autotune.shmfit import needed_bytes

MIB = 2**20


def test_the_size_named_is_the_nodes_when_ranks_share_dev_shm():
    per_batch = int(18.4 * MIB)
    wanted, fitted = Config(1, 4, True, False), Config(0, None, False, False)
    need = needed_bytes(1, 4, per_batch)
    one = no_worker_text(SimpleNamespace(shm=32 * MIB, beside=None, shm_ranks=1), wanted,
                         fitted, per_batch)
    assert f"{need / MIB:,.0f} MiB of free /dev/shm would hold" in one, one
    two = no_worker_text(SimpleNamespace(shm=32 * MIB, beside=None, shm_ranks=2), wanted,
                         fitted, per_batch)
    assert (f"{2 * need / MIB:,.0f} MiB of free /dev/shm for this node's 2 ranks "
            f"({need / MIB:,.0f} MiB each) would hold num_workers=1") in two, two
