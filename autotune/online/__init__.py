"""autotune.online: `autotune.DataLoader`, tuned inside the user's own training loop.

loader      the DataLoader: the user's arguments, what its parts share, each batch's figures
epoch       its epoch iterator, each epoch's pools, the batches taken from them
switch      a switch to a new pool within an epoch; the ranks' decisions under DDP
budget      memory and /dev/shm budgets, the workers' time budget (worker bound, verdict)
stream      the epoch's index batches, drawn lazily, and each pool's lease of them
pool        one inner torch DataLoader with one configuration, started idle for a switch
failure     a pool's failure of autotune's making (shm refused, a worker killed) told apart
            from the user's errors
fallback    the epoch carried on at a configuration that needs less after such a failure
controller  start point, hill climbing, bounds, settling, tuning again
ddp         the ranks' decisions at agreed steps over a gloo group
measure     windows of (step, wait), noise
memory      a worker's own memory, batch bytes, the default budget
cache       ~/.cache/autotune/online.json ($AUTOTUNE_CACHE_DIR; none without a home)
why         once, why AU stays under 0.90 after tuning (the workers' CPU time)
"""

from autotune.online.loader import DataLoader

__all__ = ["DataLoader"]
