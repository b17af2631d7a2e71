"""Storage: where a dataset's bytes live, behind one interface the formats read through.

    base.py    Storage (list, stat, read a whole object or a byte range, open a stream,
               write atomically) and Stat (a name, its size, its version tag)
    local.py   LocalStorage: a directory, every name opened beneath it, no link followed
    s3.py      S3Storage: an s3://BUCKET/PREFIX over autotune_converters.objstore's client
               (one boto3 client per process, retries, reads pinned to the listing's ETag)

    storage = open_storage("s3://bucket/train")     # or a local directory
    raw = storage.read("manifest.json")

A format names files relative to its root and never asks where they live; stage and
the conversion engine pick the storage from the address (`open_storage`).
"""

from __future__ import annotations

import os
from typing import Any

from autotune_converters.objstore.url import is_s3
from autotune_converters.storage.base import Stat, Storage


def open_storage(root: str | os.PathLike[str], *, store: Any = None) -> Storage:
    """The storage holding `root`: S3Storage for an s3:// address (`store`: its client,
    default this process's for the environment's endpoint), else LocalStorage."""
    if is_s3(root):
        from autotune_converters.storage.s3 import S3Storage

        return S3Storage(str(root), store=store)
    from autotune_converters.storage.local import LocalStorage

    return LocalStorage(root)


__all__ = ["Stat", "Storage", "is_s3", "open_storage"]
