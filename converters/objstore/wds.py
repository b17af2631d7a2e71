"""WebDataset shards in a bucket: s3://BUCKET/PREFIX/{manifest.json, shard-*.tar}.

The same reader as local shards (converters.wds.reader: splits by rank and worker,
shuffles, equalizes, checks every member); only where the bytes come from differs. Each
shard is streamed by one GET, pinned to the ETag of the dataset's LIST, through the same
checked tar parser (converters.wds.tarfmt.iter_stream: memory stays within about one
member plus a 1 MiB buffer). manifest.json is read once, when the source is built.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from converters.errors import SampleError, UsageError
from converters.manifest import NAME as MANIFEST, parse_manifest
from converters.objstore.client import ObjectInfo, S3Config, Store
from converters.objstore.url import parse
from converters.wds.reader import WdsSource
from converters.wds.tarfmt import MAX_MEMBER_BYTES, ShardFormatError, iter_stream


class S3Shards:
    """members(url, max_member_bytes) for shards in a bucket: one GET If-Match each.
    Picklable (the store makes its client in the process that reads)."""

    def __init__(self, store: Store, bucket: str, objects: dict[str, ObjectInfo]) -> None:
        self.store, self.bucket, self.objects = store, bucket, objects

    def __call__(self, url: str, max_member_bytes: int = MAX_MEMBER_BYTES
                 ) -> Iterator[tuple[str, str, bytes]]:
        obj = self.objects[url]
        body = self.store.open(self.bucket, obj)
        name = os.path.basename(obj.key)
        try:
            yield from iter_stream(body, name, obj.size, max_member_bytes)
        except ShardFormatError:
            raise
        except Exception as e:  # noqa: BLE001 (a connection dropped mid-shard: name it)
            raise ShardFormatError(f"{name}: the GET broke off ({type(e).__name__}: {e}); "
                                   "rerun (the store may be overloaded)") from None
        finally:
            body.close()


class S3WdsSource(WdsSource):
    """The shards of a WebDataset conversion in a bucket (format 'wds')."""

    def __init__(self, root: str, *, store: Store | None = None,
                 max_member_bytes: int = MAX_MEMBER_BYTES) -> None:
        self.url = parse(root)
        self.store = store or Store(S3Config.from_env())
        self.listing = self.store.listing(self.url)
        by_key = {o.key: o for o in self.listing.objects}
        mkey = self.url.key(MANIFEST)
        if mkey not in by_key:
            raise UsageError(f"{self.url.url(mkey)}: missing: {self.url} is not a complete "
                             "autotune conversion (the manifest is written last).")
        manifest = parse_manifest(self.store.get(self.url.bucket, by_key[mkey]),
                                  self.url.url(mkey))
        if manifest.format != "wds":
            raise UsageError(f"{self.url.url(mkey)}: format {manifest.format!r}, not 'wds'.")
        shards = [(self.url.url(self.url.key(s["file"])), int(s["samples"]))
                  for s in manifest.shards]
        missing = [u for u, _ in shards if u[len(f"s3://{self.url.bucket}/"):] not in by_key]
        if missing:
            raise SampleError(f"{missing[0]}: missing ({len(missing)} of {len(shards)} shards "
                              "listed in manifest.json); upload or convert again.")
        self.root = str(self.url)  # type: ignore[assignment]  (a URL, not a Path)
        if not isinstance(max_member_bytes, int) or max_member_bytes < 1:
            raise UsageError(f"max_member_bytes must be a positive number of bytes, but got "
                             f"{max_member_bytes!r}.", setting="max_member_bytes")
        self.max_member_bytes = max_member_bytes
        self.manifest = manifest
        self.shards = shards  # type: ignore[assignment]  (URLs, not Paths)
        self.staged_node = None
        cut = len(f"s3://{self.url.bucket}/")
        self.members = S3Shards(self.store, self.url.bucket,
                                {u: by_key[u[cut:]] for u, _ in shards})

    def files(self) -> Iterator[Path]:
        """No local file: nothing of this dataset is in this machine's page cache."""
        return iter(())

    def info(self) -> dict[str, Any]:
        d = super().info()
        d.update(storage="object", endpoint=self.store.config.shown,
                 listed_at=self.listing.listed_at, list_seconds=self.listing.seconds)
        return d
