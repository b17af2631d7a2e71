"""File-system helpers both packages need: atomic writes, durable renames, a pid lock.

Whatever a crash interrupts, a reader sees the old file or the whole new one: text goes
to a temporary file in the same directory, is fsynced, and replaces the target by rename;
`fsync_dir` makes the rename itself durable.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from converters.errors import AutotuneError


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the renames done in directory `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: str | os.PathLike[str], text: str, *, durable: bool = True) -> None:
    """Write `text` to `path` via a temporary file (fsynced when `durable`) and rename:
    readers see the old file or the whole new one, never half of it."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json_atomic(path: str | os.PathLike[str], obj: Any, *, indent: int | None = None,
                      durable: bool = True) -> None:
    """JSON to `path`, atomically (see write_text_atomic). ASCII and fixed separators keep
    the bytes reproducible between runs (a manifest of the same input is the same file)."""
    text = json.dumps(obj, ensure_ascii=True, sort_keys=False, indent=indent,
                      separators=(",", ": ") if indent else (",", ":")) + "\n"
    write_text_atomic(path, text, durable=durable)


def sha256_file(path: str | os.PathLike[str], *, drop_cache: bool = False,
                chunk: int = 4 << 20) -> tuple[int, str]:
    """(bytes, sha256 hex) of a file; `drop_cache` reads what is on the disk, not the
    pages just written (they are dropped first)."""
    h = hashlib.sha256()
    n = 0
    buf = memoryview(bytearray(chunk))  # reused: a fresh 4 MiB bytes per read faults
    fd = os.open(path, os.O_RDONLY)
    try:
        if drop_cache:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while True:
            k = os.readv(fd, [buf])
            if not k:
                return n, h.hexdigest()
            h.update(buf[:k])
            n += k
    finally:
        os.close(fd)


def rmdir_quietly(d: Path, removed: list[Path]) -> None:
    """Remove an empty directory and note it; one still in use (not empty) stays."""
    try:
        d.rmdir()
        removed.append(d)
    except OSError:
        pass


class PidLock:
    """An exclusive flock on `path` that records its holder, held while the owner works.

    The kernel drops the lock when the process dies, however it dies, so a killed run
    never leaves a stale lock; the file stays (unlinking it would race a new holder).
    `busy(holder)` builds the error raised when another process holds it; `holder` is
    what that process wrote (by default its pid).
    """

    def __init__(self, path: str | os.PathLike[str], busy: Callable[[str], AutotuneError],
                 *, tag: str | None = None) -> None:
        self.path = Path(path)
        self.busy = busy
        self.tag = tag
        self._fd: int | None = None

    def acquire(self, wait: float = 0.0) -> PidLock:
        """Take the lock; when another process holds it, retry for up to `wait` seconds,
        then raise `busy(holder)`."""
        import time

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN) and time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise self.busy(holder) from None
                raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{self.tag or os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def held_elsewhere(self) -> str | None:
        """The holder's tag when another process holds the lock now, else None (the lock
        is taken and released at once to find out)."""
        if not self.path.exists():
            return None
        fd = os.open(self.path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return os.pread(fd, 200, 0).decode(errors="replace").strip() or "?"
            raise
        finally:
            os.close(fd)
        return None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the flock
            self._fd = None

    def __enter__(self) -> PidLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


__all__ = ["PidLock", "fsync_dir", "rmdir_quietly", "sha256_file", "write_json_atomic", "write_text_atomic"]
