"""Many paths, one integer each (a label, a size), without a Python object per path.

A list of (path, int) tuples costs about 190 bytes a file, and DataLoader workers forked
from the process holding it copy its pages as they read it (every read touches a
reference count): at ImageNet's 1.28 million files that is about 240 MB in each process.
`PathTable` keeps the paths below a root as one UTF-8 blob (undecodable names kept by
surrogateescape, as os.fsdecode does), their end offsets and the integers in arrays: a
file costs its relative path's length plus 12 or 16 bytes, and reads never write to the
buffers, so forked workers keep sharing them. It reads as a sequence of (path, int).
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterator


class PathTable:
    """(path, int) pairs: `append(relpath, n)`, `table[i] -> (os.path.join(root, relpath), n)`.

    `typecode` is the integers' array type: "i" (labels), "q" (sizes, the default).
    """

    __slots__ = ("root", "_blob", "_ends", "_values")

    def __init__(self, root: str = "", typecode: str = "q") -> None:
        self.root = root
        self._blob = bytearray()
        self._ends = array("q")
        self._values = array(typecode)

    def append(self, relpath: str, value: int) -> None:
        self._blob += relpath.encode("utf-8", "surrogateescape")
        self._ends.append(len(self._blob))
        self._values.append(value)

    def values(self) -> array:
        """The integers, in order (one array: sum() it, index it)."""
        return self._values

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, index: int) -> tuple[str, int]:
        if index < 0:
            index += len(self._ends)
            if index < 0:
                raise IndexError("PathTable index out of range")
        end = self._ends[index]   # IndexError past the end, as a list's
        start = self._ends[index - 1] if index > 0 else 0
        rel = self._blob[start:end].decode("utf-8", "surrogateescape")
        return os.path.join(self.root, rel), self._values[index]

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return (self[i] for i in range(len(self)))


class PathsView:
    """The paths of a PathTable as a sequence of str (for code that wants paths only)."""

    __slots__ = ("table",)

    def __init__(self, table: PathTable) -> None:
        self.table = table

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, index: int) -> str:
        return self.table[index][0]

    def __iter__(self) -> Iterator[str]:
        return (p for p, _ in self.table)
