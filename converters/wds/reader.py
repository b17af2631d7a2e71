"""Reader of autotune WebDataset shards, built on the webdataset library's pipeline.

    src = WdsSource("/data/train-wds")
    ds = src.dataset(transform)             # an IterableDataset of (transform(bytes), label)
    loader = DataLoader(ds, batch_size=256, num_workers=8)   # no sampler, no shuffle=
    for epoch in range(E):
        ds.set_epoch(epoch)                 # as DistributedSampler.set_epoch
        for images, labels in loader: ...

Pipeline (webdataset stages): SimpleShardList shuffled with a seed shared by every rank and
worker (seed, epoch) -> split_by_node (rank) -> split_by_worker (DataLoader worker) ->
autotune's checked tar expansion -> webdataset's shuffle buffer (seeded per rank, worker
and epoch) -> map to (transform(bytes), label). Shuffling the shard list before splitting
with one shared seed makes the split a partition: every sample is read exactly once per
epoch across all ranks and workers. Rank and world size come from RANK/WORLD_SIZE or
torch.distributed, as webdataset reads them, or from `rank=`/`world_size=`.

Equal ranks: with more than one rank, every rank reads the same number of samples per
epoch, so that DDP's collectives (one all_reduce per step) never wait forever for a rank
that has run out. Shards hold slightly different counts; from the manifest's per-shard
counts each DataLoader worker gets a quota, the same on every rank for the same worker
index (min over ranks of what that worker's shards hold), and stops there: the
remainder (the tail of the last shards, a different one each epoch) is dropped, and
said once (a warning from rank 0's first worker, once per process: with non-persistent
DataLoader workers, once an epoch). Per-worker equality is what makes the batch counts
equal: equal totals split differently over workers can still give a rank one batch
more. `equalize=False` reads every sample (then ranks may differ).

Length: `len(ds)` is the exact number of samples this rank reads in the coming epoch,
summed from the manifest's per-shard counts (with `num_workers=` the DataLoader's, when
ranks are equalized: quotas are per worker).

Tar members are read from the stream in memory and never extracted. A member that is a
link, a directory or a device, a name with a path, '..' or an absolute path, a truncated
shard, or a shard with fewer samples than the manifest lists raises SampleError naming
the shard.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import torch.utils.data

from converters.manifest import Manifest, read_manifest
from converters.source import SampleError, SampleSource
from converters.wds.tarfmt import ShardFormatError, iter_members

_SAID: set[Any] = set()  # equalizations already warned about in this process
IMAGE_SUFFIXES = ("jpg", "jpeg", "png", "webp", "bmp", "tiff", "tif", "ppm", "pgm", "gif")


def _seed(*parts: int) -> int:
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little")


class WdsSource(SampleSource):
    """The shards of a WebDataset conversion. Streamed: use `dataset()`, not `read(i)`.

    `iterable = True` tells a loader builder (bench) to iterate `dataset(transform)` with
    no sampler instead of indexing.
    """

    format = "wds"
    iterable = True

    def __init__(self, root: str | os.PathLike[str], *, manifest: Manifest | None = None) -> None:
        super().__init__(root)
        self.manifest = manifest or read_manifest(self.root, expect_format="wds")
        self.shards = [(self.root / s["file"], int(s["samples"])) for s in self.manifest.shards]
        missing = [str(p) for p, _ in self.shards if not p.is_file()]
        if missing:
            raise SampleError(f"{missing[0]}: missing ({len(missing)} of {len(self.shards)} "
                              "shards listed in manifest.json); copy or convert again.")

    def __len__(self) -> int:
        return self.manifest.num_samples

    @property
    def classes(self) -> list[str]:
        return self.manifest.classes

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    def read(self, index: int) -> tuple[bytes, int]:
        raise SampleError(f"{self.root}: WebDataset shards are read sequentially, not by "
                          "index; iterate WdsSource.dataset(transform) instead.")

    def describe(self, index: int) -> str:
        return f"{self.root} (WebDataset, {self.num_shards} shards; sample {index})"

    def files(self) -> Iterator[Path]:
        return (p for p, _ in self.shards)

    def records(self) -> Iterator[tuple[bytes, int, str]]:
        """Every sample in stored order, checked: (image bytes, label, original path)."""
        counts = {str(p): n for p, n in self.shards}
        for s in _expand(({"url": str(p)} for p, _ in self.shards), counts, len(self.classes)):
            yield s["image"], s["label"], s["path"]

    def readers_note(self, num_workers: int, world_size: int = 1) -> str | None:
        """A warning when there are more readers than shards (some would read nothing)."""
        readers = max(1, num_workers) * max(1, world_size)
        if readers > self.num_shards:
            return (f"{self.root}: {readers} readers ({max(1, num_workers)} workers x "
                    f"{world_size} ranks) but only {self.num_shards} shards: "
                    f"{readers - self.num_shards} readers get no data; convert with "
                    f"--readers {readers} or read with fewer workers.")
        return None

    def info(self) -> dict:
        d = super().info()
        d["shards"] = self.num_shards
        return d

    def dataset(self, transform: Callable[[bytes], Any] | None = None, *, shuffle: bool = True,
                shuffle_buffer: int = 1000, seed: int = 0, rank: int | None = None,
                world_size: int | None = None, equalize: bool = True,
                num_workers: int | None = None) -> WdsDataset:
        """An IterableDataset of (transform(image bytes), label); bytes when no transform.

        shuffle: shard order (seed, epoch) and a sample buffer of `shuffle_buffer`;
            False reads shards and samples in stored order (already seeded-shuffled once
            at conversion).
        rank, world_size: override RANK/WORLD_SIZE / torch.distributed.
        equalize: with several ranks, the same number of samples on every rank (and for
            each worker index), the remainder dropped (see the module doc).
        num_workers: the DataLoader's, for an exact `len()` when ranks are equalized
            (iteration itself always uses the real worker count).
        """
        return WdsDataset(self.shards, transform, shuffle=shuffle, shuffle_buffer=shuffle_buffer,
                          seed=seed, rank=rank, world_size=world_size,
                          num_classes=len(self.classes), equalize=equalize,
                          num_workers=num_workers)


class WdsDataset(torch.utils.data.IterableDataset):
    """See WdsSource.dataset. Picklable (spawn), built into a pipeline in each worker."""

    def __init__(self, shards: list[tuple[Path, int]], transform: Callable[[bytes], Any] | None,
                 *, shuffle: bool, shuffle_buffer: int, seed: int, rank: int | None,
                 world_size: int | None, num_classes: int, equalize: bool = True,
                 num_workers: int | None = None) -> None:
        super().__init__()
        self.equalize = equalize
        self.num_workers = num_workers
        self.shards = [(str(p), n) for p, n in shards]
        self.transform = transform
        self.shuffle = shuffle
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.num_classes = num_classes
        self.epoch = 0
        self._iters = 0  # __iter__ calls since set_epoch (persistent workers advance alone)

    def set_epoch(self, epoch: int) -> None:
        """Shuffle for this epoch; call in the main process before iterating."""
        self.epoch = epoch
        self._iters = 0

    def _node(self) -> tuple[int, int]:
        if self.rank is not None and self.world_size is not None:
            return self.rank, self.world_size
        from webdataset.utils import pytorch_worker_info

        rank, world, _, _ = pytorch_worker_info()
        return rank, world

    def _shard_order(self, epoch: int) -> list[tuple[str, int]]:
        order = list(self.shards)
        if self.shuffle:
            random.Random(_seed(self.seed, epoch)).shuffle(order)  # as SimpleShardList does
        return order

    def rank_shards(self, epoch: int | None = None) -> list[tuple[str, int]]:
        """The (shard, samples) this rank reads in `epoch` (default: the next one)."""
        epoch = self.epoch + self._iters if epoch is None else epoch
        rank, world = self._node()
        return self._shard_order(epoch)[rank::world]

    def quotas(self, epoch: int, world: int, num_workers: int) -> list[int] | None:
        """Samples each worker index reads per rank in `epoch` (the same on every rank),
        or None when nothing is equalized (one rank, or equalize=False)."""
        if world <= 1 or not self.equalize:
            return None
        order = self._shard_order(epoch)
        w = max(1, num_workers)
        return [min(sum(n for _, n in order[r::world][k::w]) for r in range(world))
                for k in range(w)]

    def __len__(self) -> int:
        epoch = self.epoch + self._iters
        _, world = self._node()
        q = self.quotas(epoch, world, self.num_workers or 1)
        return sum(q) if q is not None else sum(n for _, n in self.rank_shards())

    def __iter__(self) -> Iterator[tuple[Any, int]]:
        import webdataset as wds

        epoch = self.epoch + self._iters
        self._iters += 1
        rank, world = self._node()
        _, _, worker, num_workers = wds.utils.pytorch_worker_info()
        counts = dict(self.shards)
        stages: list[Any] = [
            wds.SimpleShardList([u for u, _ in self.shards],
                                seed=_seed(self.seed, epoch) if self.shuffle else None),
            (lambda src: islice(src, rank, None, world)) if self.rank is not None
            and self.world_size is not None else wds.split_by_node,
            wds.split_by_worker,
            lambda src: _expand(src, counts, self.num_classes),
        ]
        quotas = self.quotas(epoch, world, num_workers)
        if quotas is not None:
            if rank == 0 and worker == 0:
                self._say_dropped(epoch, world, num_workers, quotas)
            stages.append(lambda src, n=quotas[worker]: islice(src, n))
        if self.shuffle and self.shuffle_buffer > 1:
            stages.append(wds.shuffle(self.shuffle_buffer, initial=min(100, self.shuffle_buffer),
                                      seed=_seed(self.seed, epoch, rank, worker, num_workers)))
        stages.append(wds.map(self._apply))
        return iter(wds.DataPipeline(*stages))

    def _say_dropped(self, epoch: int, world: int, num_workers: int, quotas: list[int]) -> None:
        """The equalization's cost, once per process (rank 0, worker 0)."""
        key = (tuple(self.shards), self.seed, world, num_workers)
        if key in _SAID:
            return
        _SAID.add(key)
        total = sum(n for _, n in self.shards)
        kept = world * sum(quotas)
        if kept < total:
            import warnings

            warnings.warn(
                f"WebDataset shards: {world} ranks x {max(1, num_workers)} workers read "
                f"{sum(quotas):,} samples each rank per epoch ({kept:,} of {total:,}; "
                f"{total - kept:,} dropped, {100 * (total - kept) / total:.1f} %, a different "
                "remainder each epoch) so that every rank takes the same number of steps; "
                "pass equalize=False to read all of them with unequal ranks.", stacklevel=2)

    def _apply(self, sample: dict[str, Any]) -> tuple[Any, int]:
        data, label = sample["image"], sample["label"]
        if self.transform is None:
            return data, label
        try:
            return self.transform(data), label
        except Exception as e:  # noqa: BLE001 (any decoder error: name the sample)
            raise SampleError(f"{sample['__url__']} key {sample['__key__']} ({sample['path']}): "
                              f"cannot decode ({type(e).__name__}: {e}); fix the source image "
                              "and convert again") from None


def _expand(src: Iterator[dict[str, Any]], counts: dict[str, int],
            num_classes: int) -> Iterator[dict[str, Any]]:
    """webdataset stage: shard URLs -> samples, checked (see the module doc)."""
    for item in src:
        url = item["url"]
        expected = counts.get(url, -1)
        n = 0
        for sample in _samples(url, num_classes):
            n += 1
            yield sample
        if expected >= 0 and n != expected:
            raise SampleError(f"{url}: truncated: {n} of the {expected} samples manifest.json "
                              "lists; the shard is damaged (compare its sha256 with the "
                              "manifest): restage or convert again.")


def _samples(url: str, num_classes: int) -> Iterator[dict[str, Any]]:
    cur: dict[str, Any] | None = None
    try:
        for key, suffix, data in iter_members(url):
            if cur is not None and key != cur["__key__"]:
                yield _finish(cur, url, num_classes)
                cur = None
            if cur is None:
                cur = {"__key__": key, "__url__": url}
            if suffix in cur:
                raise ShardFormatError(f"{os.path.basename(url)}: member {key}.{suffix} "
                                       "appears twice")
            cur[suffix] = data
        if cur is not None:
            yield _finish(cur, url, num_classes)
    except ShardFormatError as e:
        raise SampleError(f"{os.path.dirname(url)}/{e}; the shard is damaged or not written by "
                          "autotune convert: restage or convert again") from None


def _finish(cur: dict[str, Any], url: str, num_classes: int) -> dict[str, Any]:
    key = cur["__key__"]
    name = os.path.basename(url)
    images = [s for s in IMAGE_SUFFIXES if s in cur]
    if "cls" not in cur or len(images) != 1:
        raise ShardFormatError(f"{name}: sample {key} has members {sorted(k for k in cur if not k.startswith('__'))}"
                               "; expected KEY.cls, one image and KEY.json")
    try:
        label = int(cur["cls"])
    except ValueError:
        raise ShardFormatError(f"{name}: sample {key}: label {cur['cls'][:20]!r} is not an "
                               "integer") from None
    if not 0 <= label < max(1, num_classes):
        raise ShardFormatError(f"{name}: sample {key}: label {label} outside 0..{num_classes - 1}")
    path = "?"
    if "json" in cur:
        try:
            path = json.loads(cur["json"]).get("path", "?")
        except (ValueError, AttributeError):
            pass
    return {"__key__": key, "__url__": url, "image": cur[images[0]], "label": label,
            "path": path}
