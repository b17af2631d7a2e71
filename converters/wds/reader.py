"""Reader of autotune WebDataset shards, built on the webdataset library's pipeline.

    src = WdsSource("/data/train-wds")
    ds = src.dataset(transform)             # an IterableDataset of (transform(bytes), label)
    loader = DataLoader(ds, batch_size=256, num_workers=8)   # no sampler, no shuffle=
    for epoch in range(E):
        ds.set_epoch(epoch)                 # as DistributedSampler.set_epoch
        for images, labels in loader: ...

Pipeline (webdataset stages): this rank's shards (autotune_converters.wds.split: by node first,
then by local rank, the same every epoch, so that `autotune stage --node-rank R --nnodes
N` can copy to each node just what its ranks read) -> SimpleShardList shuffled with a seed
shared by the rank's workers (seed, epoch, rank) -> split_by_worker (DataLoader worker) ->
autotune's checked tar expansion -> a shuffle buffer (webdataset's algorithm, seeded per
rank, worker and epoch; the default one bounded in bytes too: wds/shuffle.py) -> map to
(transform(bytes), label). Each split is a partition: every sample is read at most once per
epoch across all ranks and workers (exactly once with one rank, or equalize=False). Rank
and world size come from RANK/WORLD_SIZE or torch.distributed, as webdataset reads them, or from
`rank=`/`world_size=`; ranks per node from LOCAL_WORLD_SIZE / SLURM_NTASKS_PER_NODE or
`local_world_size=`.

A copy staged for one node (DST/node.json, written by `autotune stage --node-rank`) holds
only that node's shards: it is read by the ranks of that node, and a rank of another node
is told which node to stage instead.

Equal ranks: with more than one rank, every rank reads the same number of samples per
epoch, so that DDP's collectives (one all_reduce per step) never wait forever for a rank
that has run out. Shards hold slightly different counts; from the manifest's per-shard
counts each DataLoader worker gets a quota, the same on every rank for the same worker
index (min over ranks of what that worker's shards hold), and stops there: the
remainder (the tail of some shards, a different one each epoch) is dropped, and
said once (a warning from rank 0's `set_epoch` in the training process when `num_workers=`
was given, else from its first worker, once per process: then, with non-persistent
DataLoader workers, once an epoch). Per-worker equality is what makes the batch counts
equal: equal totals split differently over workers can still give a rank one batch
more. `pad=True` equalizes the other way: each worker index reads the max over ranks,
and a worker whose shards hold fewer reads the first samples of its own shards again
(as DistributedSampler(drop_last=False) pads); every sample is read at least once.
`equalize=False` reads every sample once (then ranks may differ).

Length: `len(ds)` is the exact number of samples this rank reads in the coming epoch,
summed from the manifest's per-shard counts (with `num_workers=` the DataLoader's, when
ranks are equalized: quotas are per worker).

Opening checks what the manifest says against the folder, once, before any epoch
(autotune_converters.manifest: the counts when it is parsed, `check_files` here): every
shard this copy holds present, a regular file reached without following a symbolic link
(the dataset's folder itself is the user's path: a link to it is followed), and of its
listed bytes; one stat a shard. A shard's own open follows no link either
(tarfmt.open_shard), so what was checked cannot be swapped for a link behind it.

Tar members are read from the stream in memory and never extracted. A member that is a
link, a directory or a device, a sparse member, a name with a path, '..' or an absolute
path, a member larger than `max_member_bytes` (default 256 MiB) or than the rest of its
shard, a truncated shard, or a shard with fewer or more samples than the manifest lists
raises SampleError naming the shard. A KEY.json that cannot be parsed (however deeply
nested) only loses the informational original path ("?").
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from collections.abc import Callable, Iterator
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any

import torch.utils.data

from autotune_base.beneath import open_dir, read_bytes
from autotune_base.errors import UsageError
from autotune_converters.manifest import Manifest, check_files, read_manifest
from autotune_converters.source import SampleError, SampleSource
from autotune_converters.wds.shuffle import SHUFFLE_BUFFER, SHUFFLE_BUFFER_BYTES, shuffled
from autotune_converters.wds.split import NODE_FILE, local_world_size, node_shards, placement, rank_shards
from autotune_converters.wds.tarfmt import (
    MAX_MEMBER_BYTES,
    ShardFormatError,
    ShardNotRegular,
    iter_members,
)

_SAID: set[Any] = set()  # equalizations already warned about in this process
IMAGE_SUFFIXES = ("jpg", "jpeg", "png", "webp", "bmp", "tiff", "tif", "ppm", "pgm", "gif")


def _seed(*parts: int) -> int:
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little")


def checked_max_member(max_member_bytes: Any) -> int:
    """max_member_bytes as given, or UsageError when it is not a positive whole number."""
    if not isinstance(max_member_bytes, int) or max_member_bytes < 1:
        raise UsageError(f"max_member_bytes must be a positive number of bytes, but got "
                         f"{max_member_bytes!r}.", setting="max_member_bytes")
    return max_member_bytes


class WdsSource(SampleSource):
    """The shards of a WebDataset conversion. Streamed: use `dataset()`, not `read(i)`.

    `iterable = True` tells a loader builder (bench) to iterate `dataset(transform)` with
    no sampler instead of indexing.

    max_member_bytes: the largest tar member read (default 256 MiB); a larger one is an
        error naming the shard, the member and its size, before anything is allocated.
    """

    format = "wds"
    iterable = True

    def __init__(self, root: str | os.PathLike[str], *, manifest: Manifest | None = None,
                 max_member_bytes: int = MAX_MEMBER_BYTES) -> None:
        super().__init__(root)
        self.max_member_bytes = checked_max_member(max_member_bytes)
        self.members: Any = None  # local files (see WdsDataset.members)
        self.manifest = manifest or read_manifest(self.root, expect_format="wds")
        self.shards = [(self.root / s["file"], int(s["samples"])) for s in self.manifest.shards]
        self.staged_node = read_staged_node(self.root)  # (node, nnodes) of a node's copy
        entries = self.manifest.shards if self.staged_node is None else node_shards(
            self.manifest.shards, *self.staged_node)
        # Every shard this copy holds, now rather than when an epoch reaches it: present,
        # not a link, of its listed bytes (one stat each).
        check_files(self.root, entries, unit="shards",
                    scope=(f" for node {self.staged_node[0]} of {self.staged_node[1]}"
                           if self.staged_node else ""))

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
        for s in _expand(({"url": str(p)} for p, _ in self.shards), counts, len(self.classes),
                         self.max_member_bytes, self.members, str(self.root)):
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
                shuffle_buffer: int | None = None, seed: int = 0, rank: int | None = None,
                world_size: int | None = None, local_world_size: int | None = None,
                equalize: bool = True, num_workers: int | None = None,
                pad: bool = False, cls: type[WdsDataset] | None = None,
                shuffle_buffer_bytes: int | None = None) -> WdsDataset:
        """An IterableDataset of (transform(image bytes), label); bytes when no transform.

        shuffle: the order of this rank's shards (seed, epoch) and a sample buffer per
            reader (DataLoader worker): by default SHUFFLE_BUFFER samples (1,000) holding at
            most SHUFFLE_BUFFER_BYTES (64 MiB) of stored images; a `shuffle_buffer` given is
            that many samples whatever their bytes, unless `shuffle_buffer_bytes` is given
            too. False reads shards and samples in stored order (already seeded-shuffled
            once at conversion).
        rank, world_size: override RANK/WORLD_SIZE / torch.distributed.
        local_world_size: ranks per node (default LOCAL_WORLD_SIZE / SLURM_NTASKS_PER_NODE,
            else 1): shards are split by node first, then by local rank.
        equalize: with several ranks, the same number of samples on every rank (and for
            each worker index), the remainder dropped (see the module doc).
        num_workers: the DataLoader's, for an exact `len()` when ranks are equalized
            (iteration itself always uses the real worker count).
        pad: equalize by reading some samples twice instead of dropping the remainder.
        cls: the WdsDataset subclass to build (autotune.open_dataset's decodes and names
            the sample when the user's transform raises).
        """
        ds = (cls or WdsDataset)(self.shards, transform, shuffle=shuffle, shuffle_buffer=shuffle_buffer,
                        seed=seed, rank=rank, world_size=world_size,
                        num_classes=len(self.classes), local_world_size=local_world_size,
                        staged_node=self.staged_node, root=str(self.root),
                        equalize=equalize, num_workers=num_workers,
                        max_member_bytes=self.max_member_bytes, pad=pad)
        if shuffle_buffer_bytes is not None:
            ds.shuffle_buffer_bytes = shuffle_buffer_bytes
        ds.members = self.members
        return ds


class WdsDataset(torch.utils.data.IterableDataset):
    """See WdsSource.dataset. Picklable (spawn), built into a pipeline in each worker."""

    # What the equalization warning tells the caller to pass instead, in this class's own
    # arguments (a subclass built by another function names that function's).
    PAD_INSTEAD = "pass equalize=False to read all of them with unequal ranks, or " \
        "drop_last=False (pad=True) to pad instead"
    DROP_INSTEAD = "pass drop_last=True (pad=False) to drop the remainder instead"

    def __init__(self, shards: list[tuple[Path, int]], transform: Callable[[bytes], Any] | None,
                 *, shuffle: bool, shuffle_buffer: int | None, seed: int, rank: int | None,
                 world_size: int | None, num_classes: int, local_world_size: int | None = None,
                 staged_node: tuple[int, int] | None = None, root: str = "",
                 equalize: bool = True, num_workers: int | None = None,
                 max_member_bytes: int = MAX_MEMBER_BYTES, pad: bool = False) -> None:
        super().__init__()
        self.pad = pad
        self.max_member_bytes = max_member_bytes
        # How a shard's members are read: None for a local file (iter_members), else a
        # picklable f(url, max_member_bytes) -> members (shards in a bucket: one GET each).
        self.members: Callable[[str, int], Iterator[tuple[str, str, bytes]]] | None = None
        self.local_world_size = local_world_size
        self.staged_node = staged_node
        self.root = root
        self.equalize = equalize
        self.num_workers = num_workers
        self.shards = [(str(p), n) for p, n in shards]
        self.transform = transform
        # A clock that times each sample's read, decode and transform (duck-typed: its
        # add(read=, decode=, transform=, samples=); autotune.data.stages), or None.
        self.stage_clock: Any = None
        self.shuffle = shuffle
        # The default buffer is bounded in bytes too; a size the user gave is theirs (None:
        # samples only), unless they bound its bytes as well (WdsSource.dataset).
        self.shuffle_buffer = SHUFFLE_BUFFER if shuffle_buffer is None else shuffle_buffer
        self.shuffle_buffer_bytes = SHUFFLE_BUFFER_BYTES if shuffle_buffer is None else None
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
        # The equalization's cost said here, in the training process, when the workers'
        # count is known: the DataLoader's workers, forked from it at each epoch, then know
        # it was said (said in a worker, it came again with each epoch's new workers).
        rank, world = self._node()
        if rank != 0 or not self.num_workers or self._said_key(world, self.num_workers) in _SAID:
            return   # the quotas (every rank's shard order) only when there is a word to say
        quotas = self.quotas(epoch, world, self.num_workers)
        if quotas is not None:
            self._say_dropped(epoch, world, self.num_workers, quotas)

    def _node(self) -> tuple[int, int]:
        if self.rank is not None and self.world_size is not None:
            return self.rank, self.world_size
        from webdataset.utils import pytorch_worker_info

        rank, world, _, _ = pytorch_worker_info()
        return rank, world

    def _local_world(self) -> int:
        return self.local_world_size or local_world_size()

    def rank_shards(self, epoch: int | None = None) -> list[tuple[str, int]]:
        """The (shard, samples) this rank reads in `epoch` (default: the next one), in the
        order it reads them: the set is the same every epoch, the order is not."""
        epoch = self.epoch + self._iters if epoch is None else epoch
        rank, world = self._node()
        return self._rank_order(epoch, rank, world)

    def _rank_order(self, epoch: int, rank: int, world: int) -> list[tuple[str, int]]:
        mine = rank_shards(self.shards, rank, world, self._local_world())
        if self.shuffle:  # the permutation _ShardList makes of the same list's URLs
            random.Random(_seed(self.seed, epoch, rank)).shuffle(mine)
        return mine

    def _check_staged(self, rank: int, world: int) -> None:
        if self.staged_node is None:
            return
        node, nnodes, _ = placement(rank, world, self._local_world())
        if (node, nnodes) != tuple(self.staged_node):
            raise SampleError(
                f"{self.root}: holds the shards of node {self.staged_node[0]} of "
                f"{self.staged_node[1]} (autotune stage --node-rank {self.staged_node[0]} "
                f"--nnodes {self.staged_node[1]}), but rank {rank} of {world} is on node {node} "
                f"of {nnodes}: stage with --node-rank {node} --nnodes {nnodes} on this node.")

    def quotas(self, epoch: int, world: int, num_workers: int) -> list[int] | None:
        """Samples each worker index reads per rank in `epoch` (the same on every rank),
        or None when nothing is equalized (one rank, or equalize=False): the least any
        rank's worker of that index holds, or with `pad` the most."""
        if world <= 1 or not self.equalize:
            return None
        w = max(1, num_workers)
        orders = [self._rank_order(epoch, r, world) for r in range(world)]
        most = max if self.pad else min
        return [most(sum(n for _, n in o[k::w]) for o in orders) for k in range(w)]

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
        self._check_staged(rank, world)
        _, _, worker, num_workers = wds.utils.pytorch_worker_info()
        counts = dict(self.shards)
        mine = [u for u, _ in rank_shards(self.shards, rank, world, self._local_world())]

        def expand(src: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
            return _expand(src, counts, self.num_classes, self.max_member_bytes, self.members,
                           self.root or None)

        def read_mine() -> Iterator[dict[str, Any]]:
            """This worker's samples of this rank, in this epoch's shard order."""
            return iter(wds.DataPipeline(
                _ShardList(mine, _seed(self.seed, epoch, rank) if self.shuffle else None),
                wds.split_by_worker, expand))

        stages: list[Any] = [read_mine]
        quotas = self.quotas(epoch, world, num_workers)
        if quotas is not None:
            if rank == 0 and worker == 0:
                self._say_dropped(epoch, world, num_workers, quotas)
            if self.pad:
                stages.append(lambda src, n=quotas[worker]: _padded(src, n, read_mine))
            else:
                stages.append(lambda src, n=quotas[worker]: islice(src, n))
        if self.shuffle and self.shuffle_buffer > 1:
            stages.append(partial(shuffled, bufsize=self.shuffle_buffer,
                                  max_bytes=self.shuffle_buffer_bytes,
                                  initial=min(100, self.shuffle_buffer),
                                  seed=_seed(self.seed, epoch, rank, worker, num_workers)))
        if self.stage_clock is not None:
            stages.append(_timed_reads)
        stages.append(wds.map(self._apply))
        return iter(wds.DataPipeline(*stages))

    def _said_key(self, world: int, num_workers: int) -> tuple[Any, ...]:
        return (tuple(self.shards), self.seed, world, num_workers, self.pad)

    def _say_dropped(self, epoch: int, world: int, num_workers: int, quotas: list[int]) -> None:
        """The equalization's cost, once per process (rank 0, worker 0)."""
        key = self._said_key(world, num_workers)
        if key in _SAID:
            return
        _SAID.add(key)
        total = sum(n for _, n in self.shards)
        kept = world * sum(quotas)
        if self.pad and kept > total:
            import warnings

            warnings.warn(
                f"WebDataset shards: {world} ranks x {max(1, num_workers)} workers read "
                f"{sum(quotas):,} samples each rank per epoch ({kept:,} for {total:,} samples; "
                f"{kept - total:,} read twice, padded) so that every rank takes the same "
                f"number of steps; {self.DROP_INSTEAD}.", stacklevel=2)
        elif kept < total:
            import warnings

            warnings.warn(
                f"WebDataset shards: {world} ranks x {max(1, num_workers)} workers read "
                f"{sum(quotas):,} samples each rank per epoch ({kept:,} of {total:,}; "
                f"{total - kept:,} dropped, {100 * (total - kept) / total:.1f} %, a different "
                "remainder each epoch) so that every rank takes the same number of steps; "
                f"{self.PAD_INSTEAD}.", stacklevel=2)

    def _apply(self, sample: dict[str, Any]) -> tuple[Any, int]:
        data, label = sample["image"], sample["label"]
        if self.transform is None:
            return data, label
        clock = self.stage_clock
        t0 = time.perf_counter()
        try:
            if clock is None:
                return self.transform(data), label
            run = getattr(self.transform, "run", None)
            out, decode_s = run(data) if run is not None else (self.transform(data), 0.0)
        except Exception as e:  # noqa: BLE001 (any decoder error: name the sample)
            raise SampleError(f"{sample['__url__']} key {sample['__key__']} ({sample['path']}): "
                              f"cannot decode ({type(e).__name__}: {e}); fix the source image "
                              "and convert again") from None
        clock.add(read=sample.get("__read_s__", 0.0), decode=decode_s,
                  transform=time.perf_counter() - t0 - decode_s, samples=1)
        return out, label


def _padded(src: Iterator[dict[str, Any]], n: int, again: Callable[[], Iterator[dict[str, Any]]]
            ) -> Iterator[dict[str, Any]]:
    """`n` samples: `src`'s, then its samples again from the start (`again()`) until n."""
    k = 0
    for s in src:
        if k == n:
            return
        yield s
        k += 1
    while k < n:
        got = 0
        for s in again():
            if k == n:
                return
            yield s
            k += 1
            got += 1
        if not got:  # nothing to repeat: this worker has no shard
            return


class _ShardList(torch.utils.data.IterableDataset):
    """This rank's shard URLs as webdataset's SimpleShardList yields them (shuffled with
    `seed`), also when the rank has none."""

    def __init__(self, urls: list[str], seed: int | None) -> None:
        super().__init__()
        self.urls, self.seed = list(urls), seed

    def __iter__(self) -> Iterator[dict[str, str]]:
        urls = list(self.urls)
        if self.seed is not None:
            random.Random(self.seed).shuffle(urls)
        for u in urls:
            yield {"url": u}


def read_staged_node(root: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(node rank, nnodes) of a copy staged for one node (DST/node.json), else None."""
    p = Path(root) / NODE_FILE
    try:  # beneath the folder, not through a link; a few bytes at most
        fd = open_dir(root)
        try:
            d = json.loads(read_bytes(fd, NODE_FILE, 1 << 20))
        finally:
            os.close(fd)
        return int(d["node_rank"]), int(d["nnodes"])
    except FileNotFoundError:
        return None
    except OSError as e:
        raise SampleError(f"{p}: unreadable ({e.strerror}); stage the node again.") from None
    except (ValueError, KeyError, TypeError) as e:
        raise SampleError(f"{p}: unreadable ({e}); stage the node again.") from None


def _timed_reads(src: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """webdataset stage: each sample with the seconds its upstream took to produce it
    (`__read_s__`: the shard's GET or read and the tar member, the shuffle buffer's fill),
    for a stage clock (autotune.data.stages; duck-typed: `clock.add(read=...)`)."""
    it = iter(src)
    while True:
        t0 = time.perf_counter()
        try:
            sample = next(it)
        except StopIteration:
            return
        sample["__read_s__"] = time.perf_counter() - t0
        yield sample


def _expand(src: Iterator[dict[str, Any]], counts: dict[str, int], num_classes: int,
            max_member_bytes: int = MAX_MEMBER_BYTES, members: Any = None,
            root: str | None = None) -> Iterator[dict[str, Any]]:
    """webdataset stage: shard URLs -> samples, checked (see the module doc).

    Where `members` can read ahead (a duck-typed `prefetch(url)` and `discard()`: shards
    in a bucket), the next shard's request is started once the current one's first sample
is read (its own request taken), so
    that its first byte's wait overlaps reading this one (one shard ahead, no more)."""
    prefetch = getattr(members, "prefetch", None)
    try:
        yield from _expand_ahead(src, counts, num_classes, max_member_bytes, members, prefetch,
                                 root)
    finally:
        if prefetch is not None:  # an abandoned pass (quota, error, break): close the GET
            members.discard()


def _expand_ahead(src: Iterator[dict[str, Any]], counts: dict[str, int], num_classes: int,
                  max_member_bytes: int, members: Any, prefetch: Callable[[str], None] | None,
                  root: str | None = None) -> Iterator[dict[str, Any]]:
    it = iter(src)
    nxt = next(it, None)
    while nxt is not None:
        item, nxt = nxt, next(it, None)
        url = item["url"]
        expected = counts.get(url, -1)
        n = 0
        samples = _samples(url, num_classes, max_member_bytes, members, root)
        for sample in samples:
            n += 1
            if n == 1 and prefetch is not None and nxt is not None:
                prefetch(nxt["url"])  # now: this shard's own GET has been taken
            if 0 <= expected < n:  # never yield past the manifest: len() and quotas rely on it
                _too_many(url, expected, n, samples)
            yield sample
        if expected >= 0 and n != expected:
            raise SampleError(f"{url}: truncated: {n} of the {expected} samples manifest.json "
                              "lists; the shard is damaged (compare its sha256 with the "
                              "manifest): restage or convert again.")


def _too_many(url: str, expected: int, n: int, rest: Iterator[dict[str, Any]]) -> None:
    """Raise for a shard holding more samples than its manifest lists, with both counts
    (the rest counted, an error path only; a damaged rest makes it 'at least')."""
    more = ""
    try:
        n += sum(1 for _ in rest)
    except SampleError:
        more = "at least "
    raise SampleError(f"{url}: holds {more}{n} samples but manifest.json lists {expected}; "
                      "the shard and the manifest do not belong together (compare its sha256 "
                      "with the manifest): restage or convert again.")


def _samples(url: str, num_classes: int, max_member_bytes: int = MAX_MEMBER_BYTES,
             members: Any = None, root: str | None = None) -> Iterator[dict[str, Any]]:
    """The samples of shard `url`: read by `members`, or, None, from a local file beneath
    the dataset's folder `root` (no link followed: tarfmt.open_shard)."""
    cur: dict[str, Any] | None = None
    try:
        for key, suffix, data in (members(url, max_member_bytes) if members is not None
                                  else iter_members(url, max_member_bytes, beneath=root)):
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
    except ShardNotRegular as e:
        raise SampleError(f"{os.path.dirname(url)}/{e}.") from None
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
        except (ValueError, AttributeError, RecursionError):  # informational only: "?"
            pass
    return {"__key__": key, "__url__": url, "image": cur[images[0]], "label": label,
            "path": path}
