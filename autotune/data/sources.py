"""Where samples come from: one interface, one reader per on-disk format.

A `SampleSource` maps an index to (encoded image bytes, label). The sample pipeline
(decode, resize, crop) is the same whatever the format, so a bench of an image folder and
of its LMDB or WebDataset conversion differs only in how bytes reach the decoder, which is
exactly what the comparison must isolate.

Formats: `folder` (class subfolders, as torchvision's ImageFolder) is implemented here.
`lmdb` and `wds` (from `--format` or the `manifest.json` that `autotune convert` writes)
are read by converters.LmdbSource (map-style) and converters.WdsSource (iterable: a
loader iterates `source.dataset(transform)`; `source.iterable` is True).
A reader must open its files lazily in the process that reads (DataLoader workers fork
after the dataset is built: an LMDB environment must never cross a fork).
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path

from autotune.errors import UsageError

FORMATS = ("auto", "folder", "lmdb", "wds")
MANIFEST = "manifest.json"

# torchvision.datasets.folder.IMG_EXTENSIONS: the files ImageFolder would pick up.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class SampleError(RuntimeError):
    """A sample that cannot be read or decoded; the message names the file.

    A RuntimeError subclass taking one message argument, so that a DataLoader worker can
    re-raise it in the main process with its type intact.
    """


class SampleSource(ABC):
    """Encoded samples by index. Subclasses must be picklable and cheap to fork."""

    format: str = "?"

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    @abstractmethod
    def __len__(self) -> int: ...

    @property
    @abstractmethod
    def classes(self) -> list[str]:
        """Class names; label i is classes[i]."""

    @abstractmethod
    def read(self, index: int) -> tuple[bytes, int]:
        """The encoded image and its label. Raises SampleError naming the file."""

    @abstractmethod
    def describe(self, index: int) -> str:
        """Where sample `index` lives (a path, or shard and key), for error messages."""

    @abstractmethod
    def files(self) -> Iterator[Path]:
        """Every file a full pass reads: what a cold measurement evicts from the cache."""

    def info(self) -> dict:
        return {"path": str(self.root), "format": self.format, "images": len(self),
                "classes": len(self.classes)}


class FolderSource(SampleSource):
    """An image folder: ROOT/CLASS/.../IMAGE.jpg, labels = sorted class names.

    Same rules as torchvision's ImageFolder: classes are the sorted subdirectory names,
    images are the files with an image extension (case-insensitive) anywhere below a
    class directory, in sorted order; symlinked directories are followed. Hidden entries
    (starting with '.') are skipped. Raises UsageError when there is no class, or a class
    has no image (ImageFolder refuses that too).
    """

    format = "folder"

    def __init__(self, root: str | os.PathLike[str]) -> None:
        super().__init__(root)
        self._classes, self._samples = _scan_folder(self.root)

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def classes(self) -> list[str]:
        return self._classes

    def read(self, index: int) -> tuple[bytes, int]:
        path, label = self._samples[index]
        try:
            with open(path, "rb") as f:
                return f.read(), label
        except OSError as e:
            raise SampleError(f"{path}: cannot read ({e.strerror or e})") from None

    def describe(self, index: int) -> str:
        return self._samples[index][0]

    def files(self) -> Iterator[Path]:
        return (Path(p) for p, _ in self._samples)


class MemorySource(SampleSource):
    """A random subset of another source, its encoded bytes held in this process's memory.

    For the CPU ceiling: decode cost with storage and the page cache out of the picture
    (nothing to evict, nothing another process can drop). Workers forked after it is
    built share the bytes copy-on-write.
    """

    format = "memory"

    def __init__(self, base: SampleSource, images: int, seed: int = 0) -> None:
        super().__init__(base.root)
        import random

        n = min(images, len(base))
        picked = sorted(random.Random(seed).sample(range(len(base)), n))
        self._base_classes = base.classes
        self._names = [base.describe(i) for i in picked]
        self._samples = [base.read(i) for i in picked]

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def classes(self) -> list[str]:
        return self._base_classes

    def read(self, index: int) -> tuple[bytes, int]:
        return self._samples[index]

    def describe(self, index: int) -> str:
        return f"{self._names[index]} (held in memory)"

    def files(self) -> Iterator[Path]:
        return iter(())

    def info(self) -> dict:
        return {**super().info(), "in_memory_bytes": sum(len(b) for b, _ in self._samples)}


def _scan_folder(root: Path) -> tuple[list[str], list[tuple[str, int]]]:
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
    samples: list[tuple[str, int]] = []
    empty: list[str] = []
    for label, cls in enumerate(classes):
        n0 = len(samples)
        base = root / cls
        for dirpath, _dirs, filenames in sorted(os.walk(base, followlinks=True)):
            if any(part.startswith(".") for part in Path(dirpath).relative_to(base).parts):
                continue
            for name in sorted(filenames):
                if not name.startswith(".") and name.lower().endswith(IMG_EXTENSIONS):
                    samples.append((os.path.join(dirpath, name), label))
        if len(samples) == n0:
            empty.append(cls)
    if empty:
        shown = ", ".join(empty[:5]) + (f" and {len(empty) - 5} more" if len(empty) > 5 else "")
        raise UsageError(f"{root}: {len(empty)} class folder(s) without images ({shown}); "
                         f"images need one of the extensions {', '.join(IMG_EXTENSIONS)}.")
    return classes, samples


def detect_format(path: str | os.PathLike[str]) -> str:
    """'folder', 'lmdb' or 'wds': what `manifest.json` at `path` says, else 'folder'."""
    p = Path(path)
    m = p / MANIFEST
    if not m.is_file():
        return "folder"
    try:
        fmt = json.loads(m.read_text()).get("format")
    except (OSError, ValueError, AttributeError) as e:
        raise UsageError(f"{m}: not a readable autotune manifest ({e}); pass --format "
                         "folder to read the directory as an image folder.") from e
    if fmt not in ("folder", "lmdb", "wds"):
        raise UsageError(f"{m}: unknown format {fmt!r} (expected lmdb or wds); pass --format "
                         "explicitly.")
    return fmt


def resolve_format(path: str | os.PathLike[str], format: str = "auto") -> str:
    """The format to read `path` with; raises UsageError when it is unknown, missing or
    not yet supported (lmdb, wds), without scanning the dataset."""
    if format not in FORMATS:
        raise UsageError(f"format must be one of {', '.join(FORMATS)}, but got {format!r}.")
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{p}: no such file or directory.")
    fmt = detect_format(p) if format == "auto" else format
    if fmt in ("lmdb", "wds") and not (p / MANIFEST).is_file():
        raise UsageError(f"{p}: format {fmt} needs the manifest.json that `autotune convert` "
                         "writes last; this directory is not a complete conversion (rerun "
                         "`autotune convert` to finish it).")
    return fmt


def open_source(path: str | os.PathLike[str], format: str = "auto") -> SampleSource:
    """The SampleSource for a dataset directory.

    format: 'auto' (the manifest's format, else folder), 'folder', 'lmdb' or 'wds'.
    Raises UsageError for a missing path, an unknown or not yet supported format, or a
    folder that is not an image folder.
    """
    fmt = resolve_format(path, format)
    if fmt in ("lmdb", "wds"):
        from converters import open_converted

        src = open_converted(path)
        if src.format != fmt:
            raise UsageError(f"{path}: manifest.json says format {src.format}, not {fmt}.")
        return src
    return FolderSource(path)
