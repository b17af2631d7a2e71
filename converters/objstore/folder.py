"""The image-folder format on object storage: s3://BUCKET/PREFIX/CLASS/.../NAME.jpg.

The same rules as the local folder reader (autotune_converters.folder, torchvision's ImageFolder):
classes are the sorted first path parts below the prefix, images the keys with an image
extension (case-insensitive) anywhere below a class, sorted; hidden parts ('.x') are
skipped. One paginated LIST when the source is built (cached per process), then
`read(i)` is one GET of the object, pinned to the ETag the LIST gave (a changed object is
a SampleError, never a mix). Picklable: the listing and the store's settings cross to
DataLoader workers, each worker makes its own client on its first read.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune_base.errors import UsageError
from autotune_converters.objstore.client import Listing, ObjectInfo, S3Config, Store
from autotune_converters.objstore.url import parse
from autotune_converters.source import IMG_EXTENSIONS, SampleSource


class S3FolderSource(SampleSource):
    """An image folder in a bucket: read(i) = one GET. Format name 'folder' (the layout is
    the folder's; only the storage differs)."""

    format = "folder"

    def __init__(self, root: str, *, store: Store | None = None) -> None:
        self.url = parse(root)
        self.root = str(self.url)  # type: ignore[assignment]  (a URL, not a Path)
        self.store = store or Store(S3Config.from_env())
        self.listing = self.store.listing(self.url)
        self._classes, self._samples = _scan(self.listing)

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def classes(self) -> list[str]:
        return self._classes

    def read(self, index: int) -> tuple[bytes, int]:
        obj, label = self._samples[index]
        return self.store.get(self.url.bucket, obj), label

    def describe(self, index: int) -> str:
        return self.url.url(self._samples[index][0].key)

    def files(self) -> Iterator[Path]:
        """No local file: nothing of this dataset is in this machine's page cache."""
        return iter(())

    def objects(self) -> list[ObjectInfo]:
        """The image objects, in sample order."""
        return [o for o, _ in self._samples]

    def info(self) -> dict[str, Any]:
        d = super().info()
        d.update(storage="object", endpoint=self.store.config.shown,
                 listed_at=self.listing.listed_at, list_seconds=self.listing.seconds,
                 bytes=sum(o.size for o, _ in self._samples))
        return d


def _scan(listing: Listing) -> tuple[list[str], list[tuple[ObjectInfo, int]]]:
    url = listing.url
    cut = len(url.list_prefix)
    by_class: dict[str, list[ObjectInfo]] = {}
    for obj in listing.objects:
        parts = obj.key[cut:].split("/")
        if len(parts) < 2 or any(p.startswith(".") or not p for p in parts):
            continue
        by_class.setdefault(parts[0], [])
        if parts[-1].lower().endswith(IMG_EXTENSIONS):
            by_class[parts[0]].append(obj)
    if not by_class:
        raise UsageError(f"{url}: no objects PREFIX/CLASS/NAME.jpg below it ({len(listing.objects)} "
                         "keys listed); an image folder in a bucket is s3://BUCKET/PREFIX/CLASS/"
                         "IMAGE.jpg (labels are the sorted CLASS names).")
    classes = sorted(by_class)
    empty = [c for c in classes if not by_class[c]]
    if empty:
        raise UsageError(f"{url}: {len(empty)} class prefix(es) without images "
                         f"({', '.join(empty[:5])}); images need one of the extensions "
                         f"{', '.join(IMG_EXTENSIONS)}.")
    samples = [(o, label) for label, c in enumerate(classes)
               for o in sorted(by_class[c], key=lambda o: o.key)]
    return classes, samples


def sniff(path: Any) -> bool:
    """Any s3:// prefix can be read as a folder (the scan rules out the rest)."""
    return isinstance(path, str) and path.startswith("s3://")


__all__ = ["S3FolderSource", "sniff"]
