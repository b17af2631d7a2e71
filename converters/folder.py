"""The `folder` format: an image folder, ROOT/CLASS/.../IMAGE.jpg (torchvision's ImageFolder).

Read-only (nothing converts into it); it is what every other format is converted from,
and what `detect` falls back to for a directory without a manifest.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from autotune_base.errors import SampleError, UsageError
from autotune_converters.source import IMG_EXTENSIONS, SampleSource


def sniff(path: Path) -> bool:
    """A directory: anything else is ruled out when the folder is scanned."""
    return path.is_dir()


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
