#!/usr/bin/env python3
"""The LitData and Mosaic Streaming peers of scripts/bench_s3.py's readers (not a test).

bench_s3.py's section 3 calls this module: `prepare` converts the same image folder into
each peer's own format, locally, with that library's writer (litdata.optimize; streaming's
MDSWriter), at shards of about the size autotune's WebDataset shards have (10 MB), and
uploads each to the same bucket (s3://BUCKET/train-litdata, s3://BUCKET/train-mds);
`dataset` is each peer's S3 reader pointed at the same delaying proxy:

- LitData (`litdata`): StreamingDataset(input_dir="s3://...", storage_options=
  {"endpoint_url": PROXY}) (its S3Client hands storage_options to boto3), a fresh
  cache_dir per run (cold). Its chunk GETs would go through obstore where that is
  installed, but obstore's client options there are fixed and do not allow http://, so
  a plain-http endpoint fails ("builder error: BadScheme"); it is read through its boto3
  path, as where obstore is not installed.
- Mosaic Streaming (`mosaicml-streaming`): StreamingDataset(remote="s3://...", local=a
  fresh directory) with S3_ENDPOINT_URL=PROXY (its S3 downloader's endpoint setting;
  boto3 underneath). `import streaming` imports its torchvision-based example datasets
  (streaming.vision); where torchvision is not installed an empty stand-in for that one
  subpackage is put in its place: the reader under test does not use it.

Each is read bytes only (the image's bytes, counted) or with the `resnet50` pipeline
(autotune's preset transform: decode, random resized crop, flip, normalize), in the
DataLoader workers, with the same workers and batch as every other reader.

Install by hand (no extra of autotune-loader: with their declared pins pip would pull
another torch, a CUDA build, for litdata's torchvision, and numpy<2.2 for
mosaicml-streaming): `.venv/bin/python -m pip install --no-deps
litdata mosaicml-streaming lightning-utilities obstore tifffile 'xxhash<4' zstd catalogue
Brotli python-snappy 'transformers<5'`. Measured with litdata 0.2.76 and
mosaicml-streaming 0.13.0 (both read here with numpy 2.4 and no torchvision).
"""

from __future__ import annotations

import os
import sys
import tempfile
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch.utils.data

PEERS = ("litdata", "mosaic")
CHUNK_BYTES = 10 * 2**20  # about the size of autotune convert's WebDataset shards here


def available(kind: str) -> str | None:
    """None when `kind` can be measured here, else why not (one line)."""
    try:
        if kind == "litdata":
            import litdata  # noqa: F401
        else:
            _import_streaming()
    except Exception as e:  # noqa: BLE001 (any import failure: the reason in the table)
        return f"not installed or not importable ({type(e).__name__}: {e})"[:200]
    return None


def _import_streaming() -> Any:
    """`streaming`, with an empty streaming.vision where torchvision is missing."""
    try:
        import torchvision  # noqa: F401
    except ImportError:
        sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
    import streaming

    return streaming


def _images(root: Path) -> list[tuple[str, int]]:
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    return [(str(f), i) for i, c in enumerate(classes) for f in sorted((root / c).iterdir())
            if f.is_file()]


def _litdata_item(item: tuple[str, int]) -> dict[str, Any]:
    return {"image": Path(item[0]).read_bytes(), "label": item[1]}


def prepare(kind: str, images_root: Path, out: Path) -> Path:
    """Convert the image folder into `kind`'s format under `out`; the directory."""
    items = _images(images_root)
    import random

    random.Random(0).shuffle(items)  # as autotune convert does: no whole-class shards
    if kind == "litdata":
        from litdata import optimize

        optimize(fn=_litdata_item, inputs=items, output_dir=str(out), chunk_bytes=CHUNK_BYTES,
                 num_workers=2, verbose=False, reorder_files=False)
        return out
    MDSWriter = _import_streaming().MDSWriter  # noqa: N806 (the library's class)
    with MDSWriter(out=str(out), columns={"image": "bytes", "label": "int"},
                   size_limit=CHUNK_BYTES) as w:
        for path, label in items:
            w.write({"image": Path(path).read_bytes(), "label": label})
    return out


class Images(torch.utils.data.IterableDataset):
    """A peer's items as image bytes (or transform(bytes)), in the worker that reads them."""

    def __init__(self, inner: Any, transform: Callable[[bytes], Any] | None,
                 cache: str) -> None:
        super().__init__()
        self.inner, self.transform, self.cache = inner, transform, cache

    def __iter__(self) -> Iterator[Any]:
        for item in self.inner:
            data = item["image"]
            yield data if self.transform is None else self.transform(data)


def dataset(kind: str, endpoint: str, bucket: str, prefix: str, batch: int,
            transform: Callable[[bytes], Any] | None) -> Any:
    """`kind`'s S3 dataset of s3://BUCKET/PREFIX through `endpoint`: image bytes, or
    transform(bytes) when a transform is given."""
    cache = tempfile.mkdtemp(prefix=f"bench-{kind}-", dir="/var/tmp")
    if kind == "litdata":
        from litdata import StreamingDataset
        from litdata.streaming import downloader

        # Its chunk GETs go through obstore where that is installed, with fixed client
        # options that do not allow http:// (a local or proxied endpoint): "builder error,
        # BadScheme". Without obstore it GETs through the boto3 client that storage_options
        # configure, as it does where obstore is not installed.
        downloader._OBSTORE_AVAILABLE = False
        ds = StreamingDataset(f"s3://{bucket}/{prefix}", cache_dir=cache, shuffle=False,
                              storage_options={"endpoint_url": endpoint})
    else:
        os.environ["S3_ENDPOINT_URL"] = endpoint
        ds = _import_streaming().StreamingDataset(remote=f"s3://{bucket}/{prefix}",
                                                  local=cache, shuffle=False, batch_size=batch)
        # Its constructor GETs index.json with a boto3 client kept on the stream, pooled
        # keep-alive connection and all. DataLoader workers fork after this, so every
        # worker inherited that one socket and used it at once: one worker read the bytes
        # of another's response, the other waited out botocore's 60 s read timeout (its
        # downloader drops the client only on a retry; its __getstate__ drops it, but a
        # fork does not pickle). Dropped here, each worker makes its own, as under spawn.
        for stream in ds.streams:
            stream._downloader.clean_up()  # noqa: SLF001 (the one way to drop it)
    return Images(ds, transform, cache)  # the caller removes `cache` after the pass
