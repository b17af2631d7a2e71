"""`autotune.open_dataset`: the user's training reads what autotune made.

    dataset = autotune.open_dataset("/local/nvme/train-wds", transform=my_transform)
    loader = torch.utils.data.DataLoader(dataset, batch_size=256, num_workers=8)
    for epoch in range(epochs):
        dataset.set_epoch(epoch)          # WebDataset: this epoch's shuffle
        for images, labels in loader: ...

One call for every dataset autotune reads: an image folder (PATH/CLASS/IMAGE.jpg), a
conversion (`autotune convert`: LMDB or WebDataset shards), a staged copy (`autotune
stage`), local or `s3://BUCKET/PREFIX`. The formats' own readers do the reading
(autotune_converters.registry: FolderSource, LmdbSource, WdsSource and their s3 twins); this module
decodes, applies the user's transform and names the sample when the transform raises.

Labels are the source folder's classes in every format: the index of a class is its
place among the sorted class folder names, which the converters record in the manifest
(`classes`), so a folder, its WebDataset and its LMDB conversion give the same label to
the same image.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.utils.data

from autotune_base.errors import DatasetError, SampleError, StoreDenied, UsageError
from autotune_converters.source import SampleSource
from autotune_converters.workdir import NAME as CONVERT_WORK
from autotune_converters.wds.reader import WdsDataset

MANIFEST = "manifest.json"
LOOKED_FOR = ("looked for an LMDB or WebDataset conversion or a staged copy (PATH/manifest.json, "
              "written by `autotune convert` or `autotune stage`) and an image folder "
              "(PATH/CLASS/IMAGE.jpg)")

Transform = Callable[[Any], Any]


def open_dataset(path: str | os.PathLike[str], transform: Transform | None = None, *,
                 decode: bool = True, format: str = "auto", shuffle: bool = True,
                 seed: int = 0, shuffle_buffer: int | None = None, rank: int | None = None,
                 world_size: int | None = None, drop_last: bool = True,
                 num_workers: int | None = None, iterable: bool | None = None
                 ) -> MapDataset | ShardDataset:
    """A torch Dataset of `(transform(sample), label)` over anything autotune reads.

    Args:
        path: an image folder (PATH/CLASS/IMAGE.jpg), an `autotune convert` output (LMDB or
            WebDataset), or an `autotune stage` copy of either; local or `s3://BUCKET/PREFIX`
            (image folders and WebDataset shards; credentials the usual boto3 way).
        transform: called on each sample: the decoded image (a PIL image in RGB), or its
            encoded bytes with `decode=False`. An exception it raises is raised again as
            `SampleError` naming the sample's key and its file or shard (the original
            chained as its cause).
        decode: False: the sample is the image file's bytes as stored, undecoded.
        format: "auto" (the manifest's format, else an image folder), "folder", "lmdb", "wds".
        iterable: None (default): map-style for a folder and LMDB, iterable for WebDataset. True
            for LMDB: read it in its stored order (shuffled once, with the conversion's seed,
            when it was written) in blocks of consecutive samples, each block one sequential
            pass of large reads, the blocks shuffled per epoch and split across ranks and
            workers as shards are: on storage slower than the dataset is large (cold, throttled,
            network), one I/O per image is what random access costs, and this avoids it.

    Map-style (folder, LMDB): `len()` and `dataset[i]`; the DataLoader's sampler orders
    and splits it: `shuffle=True` on the DataLoader, or `DistributedSampler(dataset,
    drop_last=...)` for DDP ranks. The arguments below are then not used.

    Iterable (WebDataset shards, or LMDB with `iterable=True`): the dataset orders and
    splits itself; give the DataLoader no `shuffle=` and no sampler, and call
    `dataset.set_epoch(epoch)` before each epoch (as `DistributedSampler.set_epoch`):

        shuffle: shard order seeded per epoch (`seed`, epoch, rank) and a buffer of
            `shuffle_buffer` samples a worker (default 1,000 within 64 MiB; a number given:
            that many); False reads in stored order (shuffled once when written).
        rank, world_size: this process's rank; default torch.distributed when it is
            initialized, else the RANK and WORLD_SIZE environment variables, else one rank.
            Shards are split across ranks and then across DataLoader workers; each reader
            (workers x ranks) needs a shard of its own (DatasetError otherwise, naming both numbers).
        drop_last: with several ranks every rank reads the same number of samples per
            epoch (DDP's collectives would otherwise wait for a rank that has run out):
            True drops the remainder (a different one each epoch), False pads, reading the
            first samples of a rank's shards again. With one rank every sample is read
            exactly once per epoch either way. What was dropped or padded is said once in
            a warning.
        num_workers: the DataLoader's, checked against the shards now (rather than in the
            first worker) and used for an exact `len()` with several ranks.

    The result has `.classes` (label i is `classes[i]`), `.class_to_idx`, `.format` and
    `.path`. Raises DatasetError (a ValueError, exit status 2 in the CLI) for a path that
    holds nothing readable, an unfinished conversion, or a manifest written by a newer
    autotune.
    """
    src = _checked_source(path, format, iterable)
    if not src.iterable and not (src.format == "lmdb" and iterable):
        return MapDataset(src, transform, decode=decode)
    return _shard_dataset(src, path, transform, decode, iterable, dict(
        shuffle=shuffle, shuffle_buffer=shuffle_buffer, seed=seed, rank=rank,
        world_size=world_size, num_workers=num_workers, pad=not drop_last))


def _checked_source(path: str | os.PathLike[str], format: str,
                    iterable: bool | None) -> SampleSource:
    """The format's reader, or UsageError when `iterable` asks what the format cannot do."""
    src = _source(path, format)
    if iterable is not None and iterable != src.iterable and src.format != "lmdb":
        raise UsageError(f"{path}: format {src.format} is read "
                         + ("as a stream of shards: it has no random access; leave iterable "
                            "unset" if src.iterable else "by index: it has no stored order "
                            "to stream (convert it: `autotune convert`); leave iterable unset")
                         + ".", setting="iterable")
    return src


def _shard_dataset(src: SampleSource, path: str | os.PathLike[str],
                   transform: Transform | None, decode: bool, iterable: bool | None,
                   stream: dict[str, Any]) -> ShardDataset:
    """The iterable dataset: WebDataset shards, or LMDB read in blocks of stored order."""
    if src.format == "lmdb" and iterable:
        ds: ShardDataset = _lmdb_blocks(src, transform, stream)
    else:
        ds = src.dataset(transform, cls=ShardDataset, **stream)  # type: ignore[assignment]
    assert isinstance(ds, ShardDataset)
    ds.decode, ds.classes, ds.path = decode, list(src.classes), str(path)
    if stream["num_workers"] is not None:
        ds.check_readers(max(1, stream["num_workers"]))
    return ds


def _source(path: str | os.PathLike[str], format: str) -> SampleSource:
    """The format's reader, or DatasetError naming the path and what was looked for."""
    from autotune_converters.registry import open_source

    s3 = isinstance(path, str) and path.startswith("s3://")
    if not s3:
        p = Path(path)
        if not p.exists():
            raise DatasetError(f"{p}: no such file or directory; {LOOKED_FOR}.")
        if not p.is_dir():
            raise DatasetError(f"{p}: a file, not a dataset directory; {LOOKED_FOR}.")
        if (p / MANIFEST).is_file():
            from autotune_converters.manifest import read_manifest

            read_manifest(p)  # its version first (a staged folder's too)
        elif (p / CONVERT_WORK).is_dir():
            raise DatasetError(f"{p}: an unfinished conversion ({CONVERT_WORK}/ and no "
                               f"{MANIFEST}); rerun the same `autotune convert` to finish it "
                               "(it resumes), then open it.")
        elif format in ("auto", "folder") and not _has_class_folder(p):
            files = sum(1 for e in os.scandir(p) if e.is_file())
            raise DatasetError(f"{p}: nothing autotune can read ({files} file(s), no class "
                               f"folder, no {MANIFEST}); {LOOKED_FOR}.")
    try:
        return open_source(path, format)
    except (DatasetError, StoreDenied):
        raise
    except UsageError as e:
        if s3 and "no objects PREFIX/CLASS/NAME" in str(e):
            raise DatasetError(f"{path}: nothing autotune can read ({e}); {LOOKED_FOR}.") from None
        raise


# LMDB read as a stream: blocks of consecutive samples, at most BLOCK_SAMPLES each, and at
# least MIN_BLOCKS of them where there are samples enough (each reader needs a block).
BLOCK_SAMPLES = 1000
MIN_BLOCKS = 64


def _lmdb_blocks(src: Any, transform: Transform | None, stream: dict[str, Any]) -> ShardDataset:
    """An LMDB conversion as a ShardDataset whose "shards" are blocks of its index."""
    n = len(src)
    size = max(1, min(BLOCK_SAMPLES, -(-n // MIN_BLOCKS)))
    data = str(Path(src.root) / "data.mdb")
    blocks = [(f"{data}#{a}-{min(a + size, n)}", min(a + size, n) - a) for a in range(0, n, size)]
    ds = ShardDataset(blocks, transform, num_classes=len(src.classes),  # type: ignore[arg-type]
                      root=str(src.root), **stream)
    ds.members = _LmdbBlocks(src)
    ds.format = "lmdb"
    return ds


class _LmdbBlocks:
    """members(url, max_member_bytes) of a block 'ROOT/data.mdb#START-STOP': its samples in
    index order, one sequential pass (LmdbSource.records: runs of up to 4 MiB a read), as
    the tar members a shard would hold. Picklable (the source reopens per process)."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def __call__(self, url: str, max_member_bytes: int = 0) -> Any:
        import json

        from autotune_converters.lmdb.layout import key

        start, stop = (int(x) for x in url.rpartition("#")[2].split("-"))
        for i, (img, label, path) in enumerate(self.source.records(start, stop), start):
            k = key(i).decode()
            yield k, "cls", b"%d" % label
            yield k, "jpg", img   # the member's suffix only marks the image: PIL reads any
            yield k, "json", json.dumps({"path": path}).encode()


def _has_class_folder(p: Path) -> bool:
    with os.scandir(p) as it:
        return any(not e.name.startswith(".") and e.is_dir(follow_symlinks=True) for e in it)


def _decode(data: bytes) -> Any:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return im.convert("RGB")


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


class _Classes:
    """`.classes` and `.class_to_idx` (torchvision's ImageFolder names)."""

    classes: list[str]

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.classes)}


class MapDataset(_Classes, torch.utils.data.Dataset):
    """An image folder or an LMDB conversion, by index: `(transform(sample), label)`.
    Built by `open_dataset`; order and split it with the DataLoader's sampler."""

    def __init__(self, source: SampleSource, transform: Transform | None = None, *,
                 decode: bool = True) -> None:
        self.source = source
        self.transform = transform
        self.decode = decode
        self.classes = list(source.classes)
        self.format = source.format
        self.path = str(source.root)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        data, label = self.source.read(index)
        return _apply(data, label, self.decode, self.transform,
                      lambda: self.source.describe(index)), label

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.path!r}, format={self.format!r}, "
                f"samples={len(self)}, classes={len(self.classes)})")


class ShardDataset(_Classes, WdsDataset):
    """WebDataset shards (a conversion or its staged copy), streamed: split across ranks
    and DataLoader workers, shuffled per epoch (`set_epoch`). Built by `open_dataset`."""

    format = "wds"
    decode = True
    path = ""
    # open_dataset's own argument (it takes no equalize= and no pad=).
    PAD_INSTEAD = "pass drop_last=False to open_dataset to pad instead"
    DROP_INSTEAD = "pass drop_last=True to open_dataset to drop the remainder instead"

    def check_readers(self, workers: int) -> None:
        """DatasetError when the readers (workers x ranks) outnumber this copy's shards:
        a reader without a shard would read nothing, and ranks could not be equal."""
        _, world = self._node()
        readers = workers * world
        shards = len(self.shards)  # all nodes' (a node's staged copy holds its part)
        if readers > shards:
            fit = max(1, shards // world)
            unit = "blocks" if self.format == "lmdb" else "shards"
            more = ("" if self.format == "lmdb" else
                    f", or convert again with `autotune convert --readers {readers}`")
            raise DatasetError(
                f"{self.root}: {readers} readers ({workers} DataLoader worker(s) x {world} "
                f"rank(s)) but {shards} {unit}: each reader needs one of its own; use "
                f"num_workers={fit} or fewer{more}.", setting="num_workers")

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        self.check_readers(info.num_workers if info is not None else 1)
        return super().__iter__()

    def _apply(self, sample: dict[str, Any]) -> tuple[Any, int]:
        def where() -> str:
            return f"{sample['__url__']} key {sample['__key__']} ({sample.get('path', '?')})"

        return _apply(sample["image"], sample["label"], self.decode, self.transform,
                      where), sample["label"]

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.path!r}, format={self.format!r}, shards={len(self.shards)}, "
                f"classes={len(self.classes)})")


def _apply(data: bytes, label: int, decode: bool, transform: Transform | None,
           where: Callable[[], str]) -> Any:
    """The sample as the user asked for it; errors name the sample (`where()`)."""
    sample: Any = bytes(data)
    if decode:
        try:
            sample = _decode(sample)
        except Exception as e:  # noqa: BLE001 (any decoder error: name the file)
            raise SampleError(f"{where()}: cannot decode ({type(e).__name__}: {e}); fix or "
                              "remove the source image (and convert again)") from e
    if transform is None:
        return sample
    try:
        return transform(sample)
    except Exception as e:  # noqa: BLE001 (the user's transform: name the sample, chain it)
        raise SampleError(f"{where()} (label {label}): the transform {_name(transform)} raised "
                          f"{type(e).__name__}: {e}") from e


__all__ = ["DatasetError", "MapDataset", "ShardDataset", "open_dataset"]
