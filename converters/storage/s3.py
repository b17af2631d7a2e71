"""S3Storage: an s3://BUCKET/PREFIX over autotune_converters.objstore's client.

Names are keys below the prefix. `list()` is one fresh paginated LIST (`listing()`: the
process's cached one, autotune_converters.objstore.client); a read given a Stat from
either is a GET pinned to its ETag, a read by name alone is a plain GET (a manifest read
before anything is listed). A write is one PUT: S3 makes an object visible whole or not
at all, as a rename does a file.
"""

from __future__ import annotations

from typing import Any

from autotune_converters.objstore.client import Listing, ObjectInfo, S3Config, Store
from autotune_converters.objstore.url import S3Url, parse
from autotune_converters.storage.base import Stat, Storage

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


class S3Storage(Storage):
    """Objects below s3://BUCKET/PREFIX (see the module doc). Picklable: the store's
    settings cross to other processes, each makes its own client."""

    def __init__(self, root: str | S3Url, *, store: Store | None = None) -> None:
        self.url = parse(root) if isinstance(root, str) else root
        self.store = store or Store(S3Config.from_env())
        self.root = str(self.url)

    def where(self, name: str) -> str:
        return self.url.url(self.url.key(name))

    def key(self, name: str) -> str:
        return self.url.key(name)

    def _stats(self, listing: Listing) -> list[Stat]:
        cut = len(self.url.list_prefix)
        return [Stat(o.key[cut:], o.size, o.etag) for o in listing.objects]

    def list(self) -> list[Stat]:
        """One fresh paginated LIST of the prefix."""
        return self._stats(self.store.list(self.url))

    def listing(self) -> Listing:
        """The prefix's listing, from this process's cache (one LIST per dataset)."""
        return self.store.listing(self.url)

    def stat(self, name: str) -> Stat | None:
        head = self.head(name)
        if head is None:
            return None
        return Stat(name, int(head.get("ContentLength", -1)), str(head.get("ETag", "")))

    def head(self, name: str) -> dict[str, Any] | None:
        """The object's HEAD answer (size, metadata), or None when there is none."""
        from autotune_base.errors import SampleError

        key = self.url.key(name)
        try:
            return self.store.call(self.where(name), self.url.bucket,
                                   lambda c: c.head_object(Bucket=self.url.bucket, Key=key))
        except SampleError:
            return None

    def object(self, st: Stat) -> ObjectInfo:
        return ObjectInfo(self.url.key(st.name), st.size, st.tag)

    def read(self, what: str | Stat, byte_range: tuple[int, int] | None = None) -> bytes:
        if isinstance(what, Stat):
            return self.store.get(self.url.bucket, self.object(what), byte_range)
        key, bucket = self.url.key(what), self.url.bucket
        kw: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if byte_range is not None:
            kw["Range"] = f"bytes={byte_range[0]}-{byte_range[1] - 1}"
        return self.store.call(self.url.url(key), bucket,
                               lambda c: c.get_object(**kw)["Body"].read())

    def read_range_into(self, st: Stat, byte_range: tuple[int, int] | None, fd: int,
                        offset: int) -> int:
        """The range streamed into `fd` a chunk at a time (boto3): a stage's ranged GETs
        (4 shards x 8 parts of 8 MiB) held 320 MiB whole."""
        return self.store.get_into(self.url.bucket, self.object(st), byte_range, fd, offset)

    def open(self, what: str | Stat) -> Any:
        st = what if isinstance(what, Stat) else Stat(what, -1)
        return self.store.open(self.url.bucket, self.object(st))

    def write_atomic(self, name: str, data: bytes, *, content_type: str | None = None,
                     **meta: str) -> None:
        """One PUT, `meta` as the object's metadata (x-amz-meta-*)."""
        key, bucket = self.url.key(name), self.url.bucket
        kw: dict[str, Any] = {"Bucket": bucket, "Key": key, "Body": data, "Metadata": meta}
        if content_type:
            kw["ContentType"] = content_type
        self.store.call(self.url.url(key), bucket, lambda c: c.put_object(**kw))


__all__ = ["S3Storage", "process_store"]
