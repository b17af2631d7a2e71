"""LocalStorage: a directory; every name opened beneath it without following a link."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from autotune_base.beneath import lstat, open_dir, open_regular, parent_of, read_bytes
from autotune_base.fsutil import write_text_atomic
from autotune_converters.storage.base import Stat, Storage


class LocalStorage(Storage):
    """A directory (the user's own path: links in it are theirs; names below it are
    walked one component at a time, no link followed)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.path = Path(root)
        self.root = str(self.path)

    def where(self, name: str) -> str:
        return str(self.path / name)

    def list(self, *, skip_dirs: tuple[str, ...] = ()) -> list[Stat]:
        """Every regular file below the root (symlinks neither listed nor followed),
        directories named in `skip_dirs` left out; sorted as a walk of sorted names."""
        out = []
        for dirpath, dirs, files in os.walk(self.path):
            dirs[:] = sorted(d for d in dirs if d not in skip_dirs)
            for name in sorted(files):
                p = Path(dirpath) / name
                if p.is_symlink() or not p.is_file():
                    continue
                out.append(Stat(str(p.relative_to(self.path)), p.stat().st_size))
        return out

    def stat(self, name: str) -> Stat | None:
        fd = open_dir(self.path)
        try:
            st = lstat(fd, name)
        finally:
            os.close(fd)
        if st is None or not _regular(st):
            return None
        return Stat(name, st.st_size, str(st.st_mtime_ns))

    def read(self, what: str | Stat, byte_range: tuple[int, int] | None = None) -> bytes:
        name = what.name if isinstance(what, Stat) else what
        fd = open_dir(self.path)
        try:
            if byte_range is None:
                return read_bytes(fd, name)
            with parent_of(fd, name) as (d, leaf):
                f, _ = open_regular(d, leaf)
            try:
                return os.pread(f, byte_range[1] - byte_range[0], byte_range[0])
            finally:
                os.close(f)
        finally:
            os.close(fd)

    def open(self, what: str | Stat) -> Any:
        name = what.name if isinstance(what, Stat) else what
        fd = open_dir(self.path)
        try:
            with parent_of(fd, name) as (d, leaf):
                f, _ = open_regular(d, leaf)
        finally:
            os.close(fd)
        return os.fdopen(f, "rb")

    def write_atomic(self, name: str, data: bytes, **meta: str) -> None:
        fd = open_dir(self.path)
        try:
            with parent_of(fd, name, create=True) as (d, leaf):
                write_text_atomic(leaf, data, dir_fd=d)
        finally:
            os.close(fd)


def _regular(st: os.stat_result) -> bool:
    import stat

    return stat.S_ISREG(st.st_mode)


__all__ = ["LocalStorage"]
