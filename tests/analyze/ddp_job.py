"""A DDP job whose rank 1 waits for its batches: each of its items sleeps SLOW s; the
other ranks' cost nothing, so they wait in all_reduce (inside their step) for rank 1's
batch. The step's own work is a STEP s busy loop and a backward through DDP.
Every rank logs through autotune.instrument into one file ($LOG, appended)."""

import os
import time

import torch
import torch.distributed as dist

import autotune


class Items(torch.utils.data.Dataset):
    def __init__(self, n: int, slow: float) -> None:
        self.n, self.slow = n, slow

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.slow:
            time.sleep(self.slow)
        return torch.zeros(8), 0


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    batches = int(os.environ.get("BATCHES", "30"))
    ds = Items(4 * batches, float(os.environ["SLOW"]) if rank == 1 else 0.0)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    step = float(os.environ["STEP"])
    for x, _ in autotune.instrument(loader, os.environ["LOG"]):
        t = time.perf_counter()
        while time.perf_counter() - t < step:
            pass
        model(x).sum().backward()     # all_reduce: the other ranks wait here for rank 1
    # Every rank past its last all_reduce before any tears gloo down: under load, rank 1
    # was still finishing it when another closed its connections, and gloo's thread
    # aborted rank 1 ("terminate called without an active exception", SIGABRT; one CI run).
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
