"""WebDataset shards in a bucket: s3://BUCKET/PREFIX/{manifest.json, shard-*.tar}.

The same reader as local shards (autotune_converters.wds.reader: splits by rank and worker,
shuffles, equalizes, checks every member); only where the bytes come from differs: they
are read through the storage (autotune_converters.storage.s3). Each
shard is streamed by one GET, pinned to the ETag of the dataset's LIST, through the same
checked tar parser (autotune_converters.wds.tarfmt.iter_stream: memory stays within about one
member plus a 1 MiB buffer per open stream), and the next shard's GET is started while
this one is read (S3Shards: one shard ahead per reading process). manifest.json is read
once, when the source is built (which also parses the client's models once, for the
DataLoader workers forked after it: autotune_converters.objstore.client).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from autotune_base.errors import AutotuneError, SampleError, UsageError
from autotune_converters.manifest import NAME as MANIFEST, parse_manifest
from autotune_converters.storage.base import Stat
from autotune_converters.storage.s3 import S3Storage
from autotune_converters.wds.reader import WdsSource, checked_max_member
from autotune_converters.wds.tarfmt import MAX_MEMBER_BYTES, ShardFormatError, iter_stream


class S3Shards:
    """members(url, max_member_bytes) for shards in a bucket: one GET If-Match each.
    Picklable (the store makes its client, and this its read-ahead thread, in the process
    that reads).

    Read-ahead: `prefetch(url)` starts the GET of the shard to be read next on one
    background thread, so that its first byte's wait (a round trip or two, 50-100 ms
    behind a distant store) overlaps parsing the current shard; `__call__` then takes that
    body instead of asking again. At most `ahead` (1) GETs wait: each holds its response
    headers and what the socket has buffered, nothing more is read before its turn. The
    read-ahead GET is the same request (If-Match the listing's ETag): a shard changed
    since the LIST is the same SampleError, raised when its turn comes. A body whose
    first read fails (a server that dropped a connection left waiting) is asked for once
    more, fresh; a failure after its first bytes is the error it always was.
    """

    ahead = 1

    def __init__(self, storage: S3Storage, objects: dict[str, Stat]) -> None:
        self.storage, self.objects = storage, objects
        self.store = storage.store
        self._reset()

    def _reset(self) -> None:
        # The parent's thread does not exist after a fork, and its pending GETs are its own.
        self._pid = os.getpid()
        self._pool: ThreadPoolExecutor | None = None
        self._waiting: dict[str, Future[Any]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"storage": self.storage, "store": self.store, "objects": self.objects}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def _here(self) -> None:
        if self._pid != os.getpid():
            self._reset()

    def _open(self, url: str) -> Any:
        return self.storage.open(self.objects[url])

    def prefetch(self, url: str) -> None:
        """Start the GET of `url` (read next) in the background; a no-op when `ahead`
        GETs already wait or `url` is not a shard of this dataset."""
        self._here()
        if url in self._waiting or url not in self.objects or len(self._waiting) >= self.ahead:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="s3-shard-ahead")
        self._waiting[url] = self._pool.submit(self._open, url)

    def discard(self) -> None:
        """Close every read-ahead GET not taken (the pass ended early or failed)."""
        self._here()
        for fut in self._waiting.values():
            fut.add_done_callback(_close_body)
        self._waiting.clear()

    def __call__(self, url: str, max_member_bytes: int = MAX_MEMBER_BYTES
                 ) -> Iterator[tuple[str, str, bytes]]:
        self._here()
        obj = self.objects[url]
        fut = self._waiting.pop(url, None)
        body = (_FirstReadAgain(fut.result(), lambda: self._open(url)) if fut is not None
                else self._open(url))
        name = os.path.basename(obj.name)
        try:
            yield from iter_stream(body, name, obj.size, max_member_bytes)
        except (ShardFormatError, AutotuneError):
            raise
        except Exception as e:  # noqa: BLE001 (a connection dropped mid-shard: name it)
            raise ShardFormatError(f"{name}: the GET broke off ({type(e).__name__}: {e}); "
                                   "rerun (the store may be overloaded)") from None
        finally:
            body.close()


def _close_body(fut: Future[Any]) -> None:
    if not fut.cancelled() and fut.exception() is None:
        fut.result().close()


class _FirstReadAgain:
    """A read-ahead body: when its first read fails, one fresh GET in its place."""

    def __init__(self, body: Any, reopen: Callable[[], Any]) -> None:
        self.body, self.reopen, self.started = body, reopen, False

    def read(self, n: int = -1) -> bytes:
        if self.started:
            return self.body.read(n)
        try:
            data = self.body.read(n)
        except Exception:  # noqa: BLE001 (nothing consumed yet: asking again is safe)
            self.body.close()
            self.body = self.reopen()
            data = self.body.read(n)
        self.started = True
        return data

    def close(self) -> None:
        self.body.close()


class S3WdsSource(WdsSource):
    """The shards of a WebDataset conversion in a bucket (format 'wds')."""

    def __init__(self, root: str, *, store: Any = None,
                 max_member_bytes: int = MAX_MEMBER_BYTES) -> None:
        self.storage = S3Storage(root, store=store)
        self.url, self.store = self.storage.url, self.storage.store
        self.listing = self.storage.listing()
        cut = len(self.url.list_prefix)
        by_name = {o.key[cut:]: Stat(o.key[cut:], o.size, o.etag) for o in self.listing.objects
                   if o.key.startswith(self.url.list_prefix)}
        where = self.storage.where(MANIFEST)
        if MANIFEST not in by_name:
            raise UsageError(f"{where}: missing: {self.url} is not a complete "
                             "autotune conversion (the manifest is written last).")
        manifest = parse_manifest(self.storage.read(by_name[MANIFEST]), where)
        if manifest.format != "wds":
            raise UsageError(f"{where}: format {manifest.format!r}, not 'wds'.")
        shards = [(self.storage.where(s["file"]), int(s["samples"])) for s in manifest.shards]
        missing = [self.storage.where(s["file"]) for s in manifest.shards
                   if s["file"] not in by_name]
        if missing:
            raise SampleError(f"{missing[0]}: missing ({len(missing)} of {len(shards)} shards "
                              "listed in manifest.json); upload or convert again.")
        short = [(self.storage.where(s["file"]), by_name[s["file"]].size, s["bytes"])
                 for s in manifest.shards if by_name[s["file"]].size != s["bytes"]]
        if short:  # from the listing: no request more
            where_, have, want = short[0]
            raise SampleError(f"{where_}: {have:,} bytes but manifest.json says {want:,}"
                              + (f" ({len(short)} of {len(shards)} shards listed in "
                                 "manifest.json)" if len(short) > 1 else "")
                              + "; the upload is incomplete or damaged: upload (or convert) "
                              "again.")
        self.root = str(self.url)  # type: ignore[assignment]  (a URL, not a Path)
        self.max_member_bytes = checked_max_member(max_member_bytes)
        self.manifest = manifest
        self.shards = shards  # type: ignore[assignment]  (URLs, not Paths)
        self.staged_node = None
        self.members = S3Shards(self.storage, {self.storage.where(s["file"]): by_name[s["file"]]
                                               for s in manifest.shards})

    def files(self) -> Iterator[Path]:
        """No local file: nothing of this dataset is in this machine's page cache."""
        return iter(())

    def info(self) -> dict[str, Any]:
        d = super().info()
        d.update(storage="object", endpoint=self.store.config.shown,
                 listed_at=self.listing.listed_at, list_seconds=self.listing.seconds)
        return d
