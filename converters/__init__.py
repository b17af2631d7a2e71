"""Dataset converters (image folder -> LMDB / WebDataset shards) and their readers.

    from converters import ConvertOptions, convert, LmdbSource, WdsSource
    res = convert("/data/train", "/fast/train-wds", ConvertOptions(format="wds", workers=4))
    src = WdsSource("/fast/train-wds")            # or LmdbSource("/fast/train-lmdb")

Guarantees of `convert` (tested in tests/converters):
- Deterministic: the same files and options give byte-identical shards / data.mdb and a
  manifest equal but for "created", whatever `workers` is.
- Resumable: kill it at any point (kill -9 included) and rerun the same command; it keeps
  every finished unit and ends with exactly what an uninterrupted run writes.
- Nothing partial under a final name: shards and data.mdb are renamed into place after
  fsync and sha256; manifest.json is written last, so its presence means complete.
- Bad input is skipped and listed (or, with on_error="fail", stops the run naming the
  file); Pillow's global LOAD_TRUNCATED_IMAGES is never set.

Readers, for bench and search (both yield the encoded bytes the folder reader yields, so
the same decode pipeline applies; errors are autotune.data.sources.SampleError naming the
file, shard or key):
- `LmdbSource(root)`: a map-style SampleSource (`len`, `classes`, `read(i) -> (bytes,
  label)`, `describe`, `files`); wrap it in ImageDataset like a FolderSource. Default
  io="pread" never collapses on cold storage (see lmdb_reader).
- `WdsSource(root)`: `iterable = True`; build the loader from
  `WdsSource.dataset(transform, seed=...)`, an IterableDataset of (transform(bytes),
  label) with shard shuffle, a sample shuffle buffer, splitting by rank and DataLoader
  worker and an exact `len`; no sampler or shuffle= on the DataLoader. `readers_note(
  num_workers, world_size)` says when there are more readers than shards.
- `open_converted(root)` picks the reader from manifest.json; `files()` lists what a cold
  measurement must evict.

Modules: scan (streaming scan), plan (seeded shuffle, units), images (per-sample checks,
re-encode), tarfmt (reproducible and safe tar), wds_writer / wds_reader, lmdb_layout /
lmdb_writer / lmdb_reader, manifest, workdir (resume state), pool (worker processes),
conversion (orchestration), _base (shared records and the writer base class).

Names are imported lazily: `import converters` does not import torch or lmdb.
"""

from __future__ import annotations

from typing import Any

__all__ = ["convert", "ConvertOptions", "ConvertResult", "ConvertProgress", "ConvertError",
           "LmdbSource", "WdsSource", "WdsDataset", "Manifest", "read_manifest",
           "open_converted"]

_WHERE = {"convert": "conversion", "ConvertOptions": "conversion", "ConvertResult": "conversion",
          "ConvertProgress": "conversion", "ConvertError": "_base", "LmdbSource": "lmdb_reader",
          "WdsSource": "wds_reader", "WdsDataset": "wds_reader", "Manifest": "manifest",
          "read_manifest": "manifest"}


def open_converted(path: Any, **kw: Any) -> Any:
    """The reader for a conversion directory, by its manifest's format:
    LmdbSource (map-style) or WdsSource (iterable: use `.dataset(transform)`)."""
    from converters.manifest import read_manifest

    m = read_manifest(path)
    if m.format == "lmdb":
        from converters.lmdb_reader import LmdbSource
        return LmdbSource(path, manifest=m, **kw)
    from converters.wds_reader import WdsSource
    return WdsSource(path, manifest=m, **kw)


def __getattr__(name: str) -> Any:
    import importlib

    if name in _WHERE:
        return getattr(importlib.import_module(f"converters.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'converters' has no attribute {name!r}")
