"""The reader contract: what every on-disk format gives a data loader.

A `SampleSource` maps an index to (encoded image bytes, label). The sample pipeline
(decode, resize, crop) is the same whatever the format, so a bench of an image folder and
of its LMDB or WebDataset conversion differs only in how bytes reach the decoder, which is
exactly what the comparison must isolate.

Two kinds of reader:
- map-style (`iterable = False`): `read(i)`, wrapped in a torch Dataset by the caller;
- streamed (`iterable = True`, e.g. WebDataset shards): the loader iterates
  `source.dataset(transform, shuffle=..., seed=...)`, an IterableDataset that shuffles
  and splits by rank and worker itself (no sampler, no `shuffle=` on the DataLoader), and
  `readers_note(num_workers, world_size)` warns when readers outnumber shards.

A reader opens its files lazily in the process that reads (DataLoader workers fork after
the dataset is built: an LMDB environment must never cross a fork), is picklable, and
raises `SampleError` naming the file, shard or key. Readers are found by format name in
`autotune_converters.registry`.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from autotune_base.errors import SampleError

# torchvision.datasets.folder.IMG_EXTENSIONS: the files ImageFolder would pick up.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class SampleSource(ABC):
    """Encoded samples by index. Subclasses must be picklable and cheap to fork."""

    format: str = "?"
    iterable: bool = False

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

    def file_paths(self) -> Sequence[str]:
        """`files()` as a sequence of str (a format with many files serves it from its own
        table, without an object per file)."""
        return [os.fspath(p) for p in self.files()]

    def info(self) -> dict[str, Any]:
        return {"path": str(self.root), "format": self.format, "images": len(self),
                "classes": len(self.classes)}

    # Streamed readers (iterable = True) implement these two.
    def dataset(self, transform: Callable[[bytes], Any] | None = None, *, shuffle: bool = True,
                seed: int = 0, **kw: Any) -> Any:
        """An IterableDataset of (transform(bytes), label) that shuffles and splits by rank
        and worker itself."""
        raise TypeError(f"{type(self).__name__} is map-style (iterable = False): wrap it in "
                        "a map-style Dataset and index it with read(i); dataset() is for "
                        "streamed formats.")

    def readers_note(self, num_workers: int, world_size: int = 1) -> str | None:
        """A warning when the readers (workers x ranks) cannot all get data."""
        return None


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

    def info(self) -> dict[str, Any]:
        return {**super().info(), "in_memory_bytes": sum(len(b) for b, _ in self._samples)}


__all__ = ["IMG_EXTENSIONS", "MemorySource", "SampleError", "SampleSource"]
