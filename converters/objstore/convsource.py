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
- `fetch_ahead`: the unit's objects, in plan order, with up to `inflight` GETs ahead
  (bounded in objects and bytes), each pinned to its ETag. An object deleted or changed
  since the LIST is a skipped sample naming it; a store that stops answering (retries
  exhausted) or refuses stops the run (finished units are kept; rerun resumes).
"""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any

from autotune_base.beneath import plain_name
from autotune_base.errors import SampleError, UnsafeName
from autotune_converters.objstore.client import Listing, ObjectInfo, S3Config, Store
from autotune_converters.objstore.url import S3Url, parse
from autotune_converters.records import Entry, SkippedFile
from autotune_converters.source import IMG_EXTENSIONS

ETAGS = "etags.json"
INFLIGHT = 16
WINDOW_BYTES = 32 << 20

_STORES: dict[S3Config, Store] = {}


def process_store(endpoint_url: str | None = None) -> Store:
    """This process's Store for the endpoint (default: the environment's, as the CLI's
    --endpoint-url leaves it; region from the environment): one per endpoint and process,
    its client made on first use."""
    cfg = S3Config.from_env(endpoint_url)
    st = _STORES.get(cfg)
    if st is None:
        st = _STORES[cfg] = Store(cfg)
    return st


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
    if obj.size == 0:
        sink.skip(rel, "empty file (0 bytes)")
        return False
    sink.add(label, rel, obj.size)
    return True


def _write_etags(path: Path, etags: dict[str, str]) -> None:
    from autotune_base.fsutil import write_json_atomic

    write_json_atomic(path, etags)


@lru_cache(maxsize=4)
def _etags(plan_dir: str) -> dict[str, str]:
    try:
        with open(os.path.join(plan_dir, ETAGS), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def fetch_ahead(root: str, plan_dir: str, entries: Iterable[Entry], *,
                inflight: int = INFLIGHT, window_bytes: int = WINDOW_BYTES,
                store: Store | None = None, endpoint_url: str | None = None
                ) -> Iterator[tuple[Entry, bytes | SkippedFile]]:
    """(entry, its object's bytes or the SkippedFile saying why not), in order, with the
    next objects' GETs already in flight. StoreUnreachable / StoreDenied propagate."""
    url = parse(root)
    st = store or process_store(endpoint_url)
    etags = _etags(plan_dir)
    it = iter(entries)
    ahead: collections.deque[tuple[Entry, Future[bytes]]] = collections.deque()
    ahead_bytes = 0
    pool = ThreadPoolExecutor(max_workers=inflight, thread_name_prefix="s3get")
    done = False
    try:
        while True:
            while not done and (not ahead or (len(ahead) < inflight
                                              and ahead_bytes < window_bytes)):
                e = next(it, None)
                if e is None:
                    done = True
                    break
                obj = ObjectInfo(url.key(e.relpath), e.size, etags.get(e.relpath, ""))
                ahead.append((e, pool.submit(st.get, url.bucket, obj)))
                ahead_bytes += e.size
            if not ahead:
                return
            e, fut = ahead.popleft()
            ahead_bytes -= e.size
            try:
                got: bytes | SkippedFile = fut.result()
            except SampleError as err:  # deleted or changed since the LIST: this sample only
                got = SkippedFile(e.relpath, f"unreadable ({err})")
            yield e, got
    finally:
        for _, fut in ahead:
            fut.cancel()
        pool.shutdown(wait=True)


__all__ = ["classify", "fetch_ahead", "process_store", "scan_bucket"]
