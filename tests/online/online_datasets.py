"""Small synthetic datasets for the online loader's tests (importable by spawned workers)."""

from __future__ import annotations

import time

import torch
from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info


class Slow(Dataset):
    """Item i is tensor([i]), after `sleep_s`: workers matter."""

    def __init__(self, n: int = 120, sleep_s: float = 0.0005, payload: int = 0) -> None:
        self.n, self.sleep_s, self.payload = n, sleep_s, payload

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        if self.payload:
            x = torch.zeros(self.payload + 1)
            x[0] = i
            return x
        return torch.tensor([i])


class Burn(Dataset):
    """Item i is tensor([i]), after `cost_s` of CPU (a busy loop: decode is CPU, not sleep)."""

    def __init__(self, n: int = 120, cost_s: float = 0.002) -> None:
        self.n, self.cost_s = n, cost_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        end = time.perf_counter() + self.cost_s
        while time.perf_counter() < end:
            pass
        return torch.tensor([i])


class Files(Dataset):
    """Item i: file i of `root` read whole (sorted names); returns tensor([i])."""

    def __init__(self, root: str) -> None:
        import os

        self.root = root
        self.files = sorted(os.path.join(root, f) for f in os.listdir(root))

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> torch.Tensor:
        with open(self.files[i], "rb") as f:
            f.read()
        return torch.tensor([i])


class Stream(IterableDataset):
    """0..n-1, shared out between the workers as torch's documentation shows."""

    def __init__(self, n: int = 60, sleep_s: float = 0.0005) -> None:
        self.n, self.sleep_s = n, sleep_s

    def __iter__(self):
        info = get_worker_info()
        k, r = (1, 0) if info is None else (info.num_workers, info.id)
        for i in range(r, self.n, k):
            time.sleep(self.sleep_s)
            yield torch.tensor([i])


class EpochStream(IterableDataset):
    """(i, the epoch set_epoch last set) for i in 0..n-1, shared out between the workers: a
    worker kept from an earlier epoch still yields the old epoch."""

    def __init__(self, n: int = 120, sleep_s: float = 0.002) -> None:
        self.n, self.sleep_s, self.epoch = n, sleep_s, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        info = get_worker_info()
        k, r = (1, 0) if info is None else (info.num_workers, info.id)
        for i in range(r, self.n, k):
            time.sleep(self.sleep_s)
            yield torch.tensor([i, self.epoch])


class Forever(Sampler):
    """An infinite sampler: random indices from its own generator, forever."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed

    def __iter__(self):
        g = torch.Generator()
        g.manual_seed(self.seed)
        while True:
            yield int(torch.randint(self.n, (1,), generator=g))


class EveryThird(Sampler):
    """A custom sampler that draws from torch's global RNG as it goes (lazily)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        for i in range(0, self.n, 3):
            yield (i + int(torch.randint(3, (1,)))) % self.n

    def __len__(self) -> int:
        return len(range(0, self.n, 3))


class Pairs(Sampler):
    """A batch_sampler: shuffled pairs of indices from a generator it is given."""

    def __init__(self, n: int, generator: torch.Generator) -> None:
        self.n, self.g = n, generator

    def __iter__(self):
        perm = torch.randperm(self.n, generator=self.g).tolist()
        for i in range(0, self.n - 1, 2):
            yield perm[i:i + 2]

    def __len__(self) -> int:
        return self.n // 2


# Contexts that record which thread started each worker process (the parent's side).
import multiprocessing.context as _mpc  # noqa: E402
import threading as _threading  # noqa: E402

STARTED_FROM: list[str] = []


class _RecordingForkServerProcess(_mpc.ForkServerProcess):
    def start(self) -> None:
        STARTED_FROM.append(_threading.current_thread().name)
        super().start()


class _RecordingForkProcess(_mpc.ForkProcess):
    def start(self) -> None:
        STARTED_FROM.append(_threading.current_thread().name)
        super().start()


class RecordingForkServer(_mpc.ForkServerContext):
    Process = _RecordingForkServerProcess


class RecordingFork(_mpc.ForkContext):
    Process = _RecordingForkProcess


class Unsplit(IterableDataset):
    """0..n-1 in every process that iterates it: it does not split itself across workers
    (each worker yields all of it)."""

    def __init__(self, n: int = 200) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


class WorkerOnly(Dataset):
    """Item i needs a handle that only `open_handle` (a worker_init_fn) sets, in a worker,
    as an h5py/LMDB dataset opened per worker does; in the main process it fails."""

    handle = None

    def __init__(self, n: int = 64) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([self.handle[i]])


def open_handle(worker_id: int) -> None:
    info = get_worker_info()
    info.dataset.handle = list(range(info.dataset.n))


class Epochal(Dataset):
    """Item i is (i, the epoch set_epoch last set): what a worker kept from an earlier
    epoch would still return the old epoch."""

    def __init__(self, n: int = 32) -> None:
        self.n, self.epoch = n, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, self.epoch])


class Level:
    """A transform's setting, changed by the loop (an augmentation schedule)."""

    def __init__(self) -> None:
        self.level = 0


class Scheduled(Dataset):
    """Item i is (i, size, aug.level): an image-size schedule and an augmentation schedule
    the loop sets between epochs by plain assignment, with no set_epoch."""

    def __init__(self, n: int = 32) -> None:
        self.n, self.size, self.aug = n, 0, Level()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, self.size, self.aug.level])
