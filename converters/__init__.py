"""Storage, formats and conversion (installed as `autotune_converters`): dataset formats
(read and write), conversion, staging.

    from autotune_converters import ConvertOptions, convert, open_source
    res = convert("/data/train", "/fast/train-wds", ConvertOptions(format="wds", workers=4))
    src = open_source("/fast/train-wds")          # a WdsSource, by its manifest

Guarantees of `convert` (tested in tests/converters):
- Deterministic: the same files and options give byte-identical shards / data.mdb and a
  manifest equal but for "created", whatever `workers` is.
- Resumable: kill it at any point (kill -9 included) and rerun the same command; it keeps
  every finished unit and ends with exactly what an uninterrupted run writes; a SRC that
  changed since it began (a rescan gives another plan) is refused, never half-mixed.
- Nothing partial under a final name: shards and data.mdb are renamed into place after
  fsync and sha256; manifest.json is written last, so its presence means complete.
- Bad input is skipped and listed (or, with on_error="fail", stops the run naming the
  file); Pillow's global LOAD_TRUNCATED_IMAGES is never set.

The house (this package imports nothing from `autotune`; autotune imports it; both stand
on `autotune_base`: errors.py, the exception tree; fsutil.py, atomic writes, fsync_dir, the
pid lock; units.py, sizes and rates):
    source.py      the reader contract (SampleSource); writer.py the writer contract
                   (FormatWriter, which owns the lifecycle of an output)
    registry.py    name -> reader, writer, sniff: every format choice reads it
    folder.py      the image folder format (read-only)
    wds/, lmdb/    one folder per format: reader, writer, layout
    manifest.py    manifest.json, the versioned index a writer publishes last
    scan, plan, images, pool, workdir, conversion: the conversion itself
    ranks, ray_engine: beyond one machine (ranks writing one DST; Ray tasks); `convert`
                   is ranks.convert: one process, or one rank of several
    stage.py       verified, atomic, resumable copies to local disk, from a local folder
                   or any storage (stagesrc.py)
    storage/       where the bytes live: one interface (list, stat, read, open, write
                   atomically), local and s3 (over objstore/'s client)

Readers yield the encoded bytes the folder reader yields, so the same decode pipeline
applies; errors are SampleError naming the file, shard or key. A streamed reader
(`iterable = True`, WdsSource) is read through `source.dataset(transform, seed=...)`.

Names are imported lazily: `import autotune_converters` does not import torch or lmdb.
"""

from __future__ import annotations

from typing import Any

from autotune_converters import registry
from autotune_converters.registry import Format, open_source, register

__all__ = ["convert", "finalize", "ConvertOptions", "ConvertResult", "ConvertProgress", "ConvertError",
           "Format", "FolderSource", "LmdbSource", "Manifest", "SampleError", "SampleSource",
           "UsageError", "WdsDataset", "WdsSource", "open_converted", "open_source",
           "read_manifest", "register", "registry"]

_WHERE = {"convert": "ranks", "finalize": "ranks", "ConvertOptions": "options", "ConvertResult": "conversion",
          "ConvertProgress": "options", "ConvertError": "autotune_base.errors", "SampleError": "autotune_base.errors",
          "UsageError": "autotune_base.errors", "LmdbSource": "lmdb.reader", "WdsSource": "wds.reader",
          "WdsDataset": "wds.reader", "FolderSource": "folder", "SampleSource": "source",
          "Manifest": "manifest", "read_manifest": "manifest"}


def open_converted(path: Any, **kw: Any) -> Any:
    """The reader of a conversion directory, by its manifest's format; `kw` go to the
    reader (e.g. LmdbSource's io=)."""
    from autotune_converters.manifest import read_manifest

    m = read_manifest(path)
    return registry.get(m.format).reader_class()(path, manifest=m, **kw)


def __getattr__(name: str) -> Any:
    import importlib

    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name] if "." in _WHERE[name] and _WHERE[name].startswith("autotune_")
                                           else f"autotune_converters.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'converters' has no attribute {name!r}")
