"""The `folder` format: an image folder, ROOT/CLASS/.../IMAGE.jpg (torchvision's ImageFolder).

Read-only (nothing converts into it); it is what every other format is converted from,
and what `detect` falls back to for a directory without a manifest.

The same layout in a bucket, s3://BUCKET/PREFIX/CLASS/.../NAME.jpg, is S3FolderSource:
the same rules applied to one paginated LIST (cached per process), then `read(i)` is one
read through the storage (autotune_converters.storage.s3), pinned to the ETag the LIST
gave (a changed object is a SampleError, never a mix). Picklable: the listing and the
store's settings cross to DataLoader workers, each worker makes its own client on its
first read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from autotune_base.errors import SampleError, UsageError
from autotune_base.pathtable import PathsView, PathTable
from autotune_converters.source import IMG_EXTENSIONS, SampleSource


def sniff(path: Path) -> bool:
    """A directory: anything else is ruled out when the folder is scanned."""
    return path.is_dir()


class FolderSource(SampleSource):
    """An image folder: ROOT/CLASS/.../IMAGE.jpg, labels = sorted class names.

    Same rules as torchvision's ImageFolder: classes are the sorted subdirectory names,
    images are the files with an image extension (case-insensitive) anywhere below a
    class directory, in sorted order; symlinked directories are followed, except a link back
    to a folder above it (a loop, not entered). Hidden entries
    (starting with '.') are skipped. Raises UsageError when there is no class, or a class
    has no image (ImageFolder refuses that too).
    """

    format = "folder"

    def __init__(self, root: str | os.PathLike[str]) -> None:
        super().__init__(root)
        classes, self._samples = _scan_folder(self.root)
        self._classes = list(classes)   # the table is shared, read-only; the list is the caller's

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def classes(self) -> list[str]:
        return self._classes

    def read(self, index: int) -> tuple[bytes, int]:
        path, label = self._samples[index]
        try:
            # Not O_NOATIME (convert's read-ahead uses it): training reads the tree every
            # epoch, and a scratch purge that goes by atime must see it read. relatime
            # writes each file's atime once a day at most.
            with open(path, "rb") as f:
                return f.read(), label
        except OSError as e:
            raise SampleError(f"{path}: cannot read ({e.strerror or e})") from None

    def describe(self, index: int) -> str:
        return self._samples[index][0]

    def files(self) -> Iterator[Path]:
        return (Path(p) for p, _ in self._samples)

    def file_paths(self) -> Sequence[str]:
        return PathsView(self._samples)


# The last folders listed in this process, by root: a search lists its dataset for the
# decode ceiling, the first batch, the whole run's bytes and every trial's cache
# eviction; at 1.28 million files each listing took seconds and a table of its own.
_LISTED: dict[str, tuple[tuple[Any, ...], tuple[list[str], PathTable]]] = {}
_LISTED_MAX = 2


def _folder_state(root: Path) -> tuple[Any, ...] | None:
    """What changes when a class or an image is added or removed one level down (the
    root's and each class folder's inode and mtime); None when it cannot be read."""
    try:
        st = os.stat(root)
        state: list[Any] = [st.st_ino, st.st_mtime_ns]
        with os.scandir(root) as it:
            for e in it:
                if not e.name.startswith(".") and e.is_dir(follow_symlinks=True):
                    cs = e.stat(follow_symlinks=True)
                    state.append((e.name, cs.st_ino, cs.st_mtime_ns))
    except OSError:
        return None
    return tuple(sorted(state[2:])) + tuple(state[:2])


def _scan_folder(root: Path) -> tuple[list[str], PathTable]:
    """The folder's classes and (path, label) table, listed once per process while no
    class folder changes (images in sub-folders of a class: listed again only when a
    class folder's own entries change)."""
    state = _folder_state(root)
    key = str(root)
    hit = _LISTED.get(key)
    if state is not None and hit is not None and hit[0] == state:
        return hit[1]
    listed = _list_folder(root)
    if state is not None:
        _LISTED.pop(key, None)
        while len(_LISTED) >= _LISTED_MAX:
            _LISTED.pop(next(iter(_LISTED)))
        _LISTED[key] = (state, listed)
    return listed


def _list_folder(root: Path) -> tuple[list[str], PathTable]:
    if not root.is_dir():
        raise UsageError(f"{root}: not a directory (an image folder is DATASET/CLASS/IMAGE.jpg).")
    try:
        with os.scandir(root) as it:
            classes = sorted(e.name for e in it
                             if not e.name.startswith(".") and e.is_dir(follow_symlinks=True))
    except OSError as e:
        raise UsageError(f"{root}: cannot list ({e.strerror}).") from e
    if not classes:
        raise UsageError(f"{root}: no class subfolders; an image folder is "
                         "DATASET/CLASS/IMAGE.jpg (labels are the sorted CLASS names).")
    top = str(root)
    # (path, label) pairs without an object per file: see autotune_base.pathtable.
    samples = PathTable(top, "i")
    empty: list[str] = []
    above = _nodes(root, *root.resolve().parents)
    for label, cls in enumerate(classes):
        n0 = len(samples)
        base = root / cls
        for dirpath, filenames in _walk(base, above):
            rel = os.path.relpath(dirpath, top)
            for name in sorted(filenames):
                if not name.startswith(".") and name.lower().endswith(IMG_EXTENSIONS):
                    samples.append(os.path.join(rel, name), label)
        if len(samples) == n0:
            empty.append(cls)
    if empty:
        shown = ", ".join(empty[:5]) + (f" and {len(empty) - 5} more" if len(empty) > 5 else "")
        raise UsageError(f"{root}: {len(empty)} class folder(s) without images ({shown}); "
                         f"images need one of the extensions {', '.join(IMG_EXTENSIONS)}.")
    return classes, samples


def _nodes(*folders: Path) -> frozenset[tuple[int, int]]:
    """The (device, inode) of each folder that can be read (a loop's target is one)."""
    out = set()
    for folder in folders:
        try:
            st = os.stat(folder)
        except OSError:
            continue
        out.add((st.st_dev, st.st_ino))
    return frozenset(out)


def _walk(base: Path, above: frozenset[tuple[int, int]]) -> list[tuple[str, list[str]]]:
    """Each folder below `base` (itself included) with its file names, sorted by path, as
    `sorted(os.walk(base, followlinks=True))` lists them, less hidden folders and loops: a
    linked folder that is one of its own ancestors, or one of the folders `above` (the
    dataset's root and those above it: `up -> ..`, `all -> /`), is not entered. os.walk
    enters such a link again at each level until the path no longer resolves (40 links
    deep), and two of them in one folder made the listing of a stranger's dataset never
    end."""
    found: list[tuple[str, list[str]]] = []
    real = base.resolve()   # a linked class: the folders above its target too
    seen = above | _nodes(real, *(real.parents if base.is_symlink() else ()))
    todo: list[tuple[str, frozenset[tuple[int, int]]]] = [(str(base), seen)]
    while todo:
        path, above = todo.pop()
        files: list[str] = []
        try:
            with os.scandir(path) as it:
                entries = list(it)
        except OSError:
            continue   # as os.walk: a folder that cannot be listed is passed over
        for e in entries:
            try:
                is_dir = e.is_dir(follow_symlinks=True)
            except OSError:
                is_dir = False
            if not is_dir:
                files.append(e.name)
                continue
            if e.name.startswith("."):
                continue
            try:
                dst = e.stat(follow_symlinks=True)
            except OSError:
                continue
            node = (dst.st_dev, dst.st_ino)
            if node not in above:
                todo.append((e.path, above | {node}))
        found.append((path, files))
    found.sort()
    return found


class S3FolderSource(FolderSource):
    """An image folder in a bucket: read(i) = one GET. Format name 'folder' (the layout is
    the folder's; only the storage differs). Same rules as the local folder: classes are
    the sorted first path parts below the prefix, images the keys with an image extension
    (case-insensitive) anywhere below a class, sorted; hidden parts ('.x') are skipped."""

    def __init__(self, root: str, *, store: Any = None) -> None:
        from autotune_converters.storage.s3 import S3Storage

        self.storage = S3Storage(root, store=store)
        self.url, self.store = self.storage.url, self.storage.store
        self.root = str(self.url)  # type: ignore[assignment]  (a URL, not a Path)
        self.listing = self.storage.listing()
        self._classes, self._samples = _scan_listing(self.listing)  # type: ignore[assignment]

    def read(self, index: int) -> tuple[bytes, int]:
        st, label = self._samples[index]
        return self.storage.read(st), label  # type: ignore[arg-type]

    def describe(self, index: int) -> str:
        return self.storage.where(self._samples[index][0].name)  # type: ignore[union-attr]

    def files(self) -> Iterator[Path]:
        """No local file: nothing of this dataset is in this machine's page cache."""
        return iter(())

    def objects(self) -> list[Any]:
        """The image objects (ObjectInfo), in sample order."""
        return [self.storage.object(st) for st, _ in self._samples]  # type: ignore[arg-type]

    def info(self) -> dict[str, Any]:
        d = super().info()
        d.update(storage="object", endpoint=self.store.config.shown,
                 listed_at=self.listing.listed_at, list_seconds=self.listing.seconds,
                 bytes=sum(st.size for st, _ in self._samples))  # type: ignore[union-attr]
        return d


def _scan_listing(listing: Any) -> tuple[list[str], list[tuple[Any, int]]]:
    """The folder rules on a bucket's listing: (classes, [(Stat, label)] in sample order)."""
    from autotune_converters.storage.base import Stat

    url = listing.url
    cut = len(url.list_prefix)
    by_class: dict[str, list[Stat]] = {}
    for obj in listing.objects:
        parts = obj.key[cut:].split("/")
        if len(parts) < 2 or any(p.startswith(".") or not p for p in parts):
            continue
        by_class.setdefault(parts[0], [])
        if parts[-1].lower().endswith(IMG_EXTENSIONS):
            by_class[parts[0]].append(Stat(obj.key[cut:], obj.size, obj.etag))
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
    samples = [(st, label) for label, c in enumerate(classes)
               for st in sorted(by_class[c], key=lambda st: st.name)]
    return classes, samples
