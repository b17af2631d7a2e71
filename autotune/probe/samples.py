"""Sample replay: cold reads of a dataset through its own format's reader, bytes only.

A conversion's storage ceiling is samples/s, not files/s: a WebDataset shard holds
hundreds of samples, an LMDB environment all of them. So for a converted dataset the
storage probe reads samples the way a DataLoader's workers would, through the format's
reader (autotune_converters.registry), without decoding, at several concurrencies, cold before each:

- a streamed format (shards): each reader thread streams its share of the shards in
  order (`source.dataset(None, shuffle=False, rank=k, world_size=c)`), as c workers do;
- a map-style format (LMDB, a folder): threads read samples by index in a seeded random
  order, as a shuffled sampler asks for them.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from autotune.cache import make_cold

DEFAULT_CONCURRENCY = (1, 4, 16)


@dataclass
class SampleLevel:
    concurrency: int
    samples: int
    bytes: int
    seconds: float
    samples_per_s: float
    mib_per_s: float
    errors: int = 0


@dataclass
class SampleReplay:
    format: str
    samples_total: int
    cold_method: str
    by_concurrency: list[SampleLevel] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def best(self) -> SampleLevel:
        return max(self.by_concurrency, key=lambda lv: lv.samples_per_s)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["best_concurrency"] = self.best.concurrency
        d["best_samples_per_s"] = self.best.samples_per_s
        return d


def _streams(source: Any, c: int, seed: int) -> list[Callable[[], Any]]:
    """One iterator factory per reader thread, over (bytes, label) samples."""
    if source.iterable:
        # Every sample once (no equal-ranks remainder dropped, no node split from the
        # launcher's environment): the readers are threads of one process.
        return [lambda k=k: iter(source.dataset(None, shuffle=False, seed=seed, rank=k,
                                                world_size=c, equalize=False,
                                                local_world_size=1)) for k in range(c)]
    order = list(range(len(source)))
    random.Random(seed).shuffle(order)
    counter = itertools.count()  # next() is atomic under the GIL, as in replay.read_level

    def indexed() -> Any:
        while (i := next(counter)) < len(order):
            yield source.read(order[i])

    return [indexed for _ in range(c)]


def read_level(source: Any, c: int, seconds: float, seed: int) -> SampleLevel:
    """Read samples with `c` threads until the data or `seconds` run out."""
    totals = [0, 0, 0]  # samples, bytes, errors
    lock = threading.Lock()
    t0 = time.monotonic()
    deadline = t0 + seconds
    last = [t0]

    def worker(make: Callable[[], Any]) -> None:
        n = b = e = 0
        try:
            for data, _label in make():
                n += 1
                b += len(data)
                if time.monotonic() >= deadline:
                    break
        except Exception:  # noqa: BLE001 - a damaged sample is an error count, not a crash
            e += 1
        with lock:
            totals[0] += n
            totals[1] += b
            totals[2] += e
            last[0] = max(last[0], time.monotonic())

    threads = [threading.Thread(target=worker, args=(m,)) for m in _streams(source, c, seed)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = max(last[0] - t0, 1e-9)
    return SampleLevel(c, totals[0], totals[1], wall, totals[0] / wall,
                       totals[1] / wall / 2**20, totals[2])


def sample_replay(source: Any, *, concurrency: Sequence[int] = DEFAULT_CONCURRENCY,
                  seconds_per_level: float = 5.0, cold: bool = True, seed: int = 0,
                  progress: Callable[[str], None] | None = None) -> SampleReplay:
    """samples/s through `source`'s reader at each concurrency, cold before each level."""
    files = list(source.files())
    res = SampleReplay(source.format, len(source), "warm")
    if not source.iterable and len(source):
        source.read(0)  # opens the reader's handles in this process before threads share it
    if source.iterable:
        shards = getattr(source, "num_shards", None)
        concurrency = [c for c in concurrency if not shards or c <= shards] or [1]
    for c in concurrency:
        if cold:
            res.cold_method = make_cold(files)
        if progress:
            progress(f"sample replay ({source.format}): {c} reader(s), bytes only")
        res.by_concurrency.append(read_level(source, c, seconds_per_level, seed))
    if not cold:
        res.warnings.append("warm: the samples were not evicted from the page cache; "
                            "figures are the cache's, not the storage's.")
    if any(lv.errors for lv in res.by_concurrency):
        res.warnings.append("some reads failed: the dataset is damaged (see `autotune bench`).")
    return res
