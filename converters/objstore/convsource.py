"""Converting from a bucket: s3://BUCKET/PREFIX/CLASS/NAME.jpg scanned into a plan and read.

The plan depends on the relative names (the key below the prefix) and the sizes only, as
a local folder's does on its relative paths and sizes, so a bucket converts to the same
shards, byte for byte, as the same files in a local folder:

- `scan_bucket`: one fresh paginated LIST, classified by autotune_converters.scan's folder rules
  (classes: the sorted first parts below the prefix that are not hidden; images: keys
  with an image extension below a class, hidden parts skipped; other keys ignored and
  counted; a 0-byte image skipped as "empty file"). Every relative key passes
  autotune_base.beneath.plain_name: a key with an empty, '.' or '..' part is skipped with
  the reason (never turned into a path). Each object's ETag goes to the plan directory
  (etags.json), so a resumed run reads the objects the plan was made from.
- reading the objects (the unit's, in plan order, GETs ahead, each pinned to its ETag)
  is autotune_converters.sourceread.fetch_ahead, beside the folder's read-ahead.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune_base.beneath import plain_name
from autotune_base.errors import UnsafeName
from autotune_converters.objstore.client import Listing, ObjectInfo, Store
from autotune_converters.objstore.url import S3Url
from autotune_converters.source import IMG_EXTENSIONS
from autotune_converters.sourceread import ETAGS
from autotune_converters.storage.s3 import process_store


def scan_bucket(url: S3Url, sink: Any, store: Store | None = None,
                progress: Callable[[int, int], None] | None = None,
                endpoint_url: str | None = None) -> Any:
    """LIST `url` and add its images to `sink` (a autotune_converters.scan.ScanSink); returns the
    ScanResult (sink closed), as autotune_converters.scan.scan_folder does for a folder."""
    import time

    from autotune_converters.scan import folder_result

    t0 = time.monotonic()
    listing = (store or process_store(endpoint_url)).list(url)
    classes, found, ignored = classify(listing)
    etags: dict[str, str] = {}
    empty = []
    for label, cls in enumerate(classes):
        n0 = len(sink)
        for rel, obj in found[cls]:
            if _add(sink, rel, obj, label):
                etags[rel] = obj.etag
                if progress and len(sink) % 4096 == 0:
                    progress(len(sink), sink.bytes)
        if len(sink) == n0:
            empty.append(cls)
    plan_dir = Path(sink.records_path).parent
    _write_etags(plan_dir / ETAGS, etags)
    return folder_result(sink, classes, time.monotonic() - t0, ignored, empty)


def classify(listing: Listing) -> tuple[list[str], dict[str, list[tuple[str, ObjectInfo]]], int]:
    """(sorted classes, {class: [(relative key, object)]} of image keys, keys ignored)."""
    from autotune_base.errors import UsageError

    cut = len(listing.url.list_prefix)
    found: dict[str, list[tuple[str, ObjectInfo]]] = {}
    ignored = 0
    for obj in listing.objects:
        rel = obj.key[cut:]
        parts = rel.split("/")
        if len(parts) < 2 or not parts[0] or parts[0].startswith("."):
            continue  # a key beside the classes (SRC/README.txt), as a folder's files are
        found.setdefault(parts[0], [])
        if rel.endswith("/") or any(p.startswith(".") and p not in (".", "..")
                                    for p in parts[1:]):
            continue  # a directory marker; hidden entries, skipped as a folder's are
        if parts[-1].lower().endswith(IMG_EXTENSIONS):
            found[parts[0]].append((rel, obj))
        else:
            ignored += 1
    if not found:
        raise UsageError(f"{listing.url}: no objects PREFIX/CLASS/NAME.jpg below it "
                         f"({len(listing.objects)} keys listed); an image folder in a bucket "
                         "is s3://BUCKET/PREFIX/CLASS/IMAGE.jpg (labels are the sorted CLASS "
                         "names).")
    return sorted(found), found, ignored


def _add(sink: Any, rel: str, obj: ObjectInfo, label: int) -> bool:
    try:
        plain_name(rel, "the bucket's listing", f"object key {obj.key!r}")
    except UnsafeName:
        sink.skip(rel, "unsafe object key (an empty, '.' or '..' part, or a NUL: it cannot "
                       "be a file name inside the dataset)")
        return False
    return sink.add_nonempty(label, rel, obj.size)


def _write_etags(path: Path, etags: dict[str, str]) -> None:
    from autotune_base.fsutil import write_json_atomic

    write_json_atomic(path, etags)


__all__ = ["classify", "scan_bucket"]
