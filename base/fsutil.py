"""File-system helpers both packages need: atomic writes, durable renames, a pid lock.

Whatever a crash interrupts, a reader sees the old file or the whole new one: text goes
to a temporary file in the same directory, is fsynced, and replaces the target by rename;
`fsync_dir` makes the rename itself durable. The file gets the process's umask like any
other file (0644 under the usual 022): a manifest is for every reader of the dataset.
A lock file is opened without following a link and truncated only once its flock is
held and it is a regular file of ours (a planted `lock -> /etc/x` is refused, untouched).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune_base.beneath import open_dir
from autotune_base.errors import AutotuneError, UsageError


def fsync_dir(path: str | os.PathLike[str] | int) -> None:
    """Make the renames done in directory `path` (or descriptor) durable."""
    if isinstance(path, int):
        os.fsync(path)
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: str | os.PathLike[str], text: str | bytes, *, durable: bool = True,
                      dir_fd: int | None = None, tmp_dir_fd: int | None = None) -> None:
    """Write `text` to `path` via a temporary file (fsynced when `durable`) and rename:
    readers see the old file or the whole new one, never half of it. With `dir_fd`,
    `path` is a name in that directory (no link followed: the rename replaces a link
    there, never its target). `tmp_dir_fd`: a directory on the same filesystem for the
    temporary file (a work folder the next run empties), so that a process killed before
    the rename leaves nothing in the user's folder. Mode: 0666 less the umask, set at
    creation, before the rename makes it visible."""
    own = dir_fd is None
    p = Path(path)
    d = open_dir(p.parent) if own else dir_fd
    t = d if tmp_dir_fd is None else tmp_dir_fd
    leaf = p.name
    tmp = f".{leaf}.{secrets.token_hex(4)}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o666, dir_fd=t)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(text if isinstance(text, bytes) else text.encode("utf-8"))
                f.flush()
                if durable:
                    os.fsync(f.fileno())
            os.replace(tmp, leaf, src_dir_fd=t, dst_dir_fd=d)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=t)
            except OSError:
                pass
            raise
    except OSError as e:  # name the file by its full path, as an open by path would
        if e.filename is None or os.path.isabs(str(e.filename)):
            raise
        where = str(p.parent) if own else _fd_path(d)
        raise type(e)(e.errno, e.strerror, os.path.join(where, str(e.filename))) from None
    finally:
        if own:
            os.close(d)


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "."


def write_json_atomic(path: str | os.PathLike[str], obj: Any, *, indent: int | None = None,
                      durable: bool = True, tmp_dir: str | os.PathLike[str] | None = None) -> None:
    """JSON to `path`, atomically (see write_text_atomic). ASCII and fixed separators keep
    the bytes reproducible between runs (a manifest of the same input is the same file)."""
    text = json.dumps(obj, ensure_ascii=True, sort_keys=False, indent=indent,
                      separators=(",", ": ") if indent else (",", ":")) + "\n"
    if tmp_dir is None:
        write_text_atomic(path, text, durable=durable)
        return
    t = open_dir(tmp_dir)
    try:
        write_text_atomic(path, text, durable=durable, tmp_dir_fd=t)
    finally:
        os.close(t)


_NOATIME = getattr(os, "O_NOATIME", 0)


def open_noatime(path: str | os.PathLike[str], flags: int = os.O_RDONLY) -> int:
    """os.open(path, flags) with O_NOATIME where the kernel allows it: to root and to the
    file's owner, the usual case for a user's own dataset. A first read after a write
    updates the atime (relatime): an inode write per file, and after a cache drop the
    inode-table block read back in first. A file someone else owns refuses the flag
    (EPERM) and is opened without it."""
    try:
        return os.open(path, flags | _NOATIME)
    except PermissionError as e:
        if not _NOATIME or e.errno != errno.EPERM:
            raise
        return os.open(path, flags)


def sha256_file(path: str | os.PathLike[str], *, drop_cache: bool = False,
                chunk: int = 4 << 20) -> tuple[int, str]:
    """(bytes, sha256 hex) of a file; `drop_cache` reads what is on the disk, not the
    pages just written (they are dropped first)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return sha256_fd(fd, drop_cache=drop_cache, chunk=chunk)
    finally:
        os.close(fd)


def sha256_fd(fd: int, *, drop_cache: bool = False, chunk: int = 4 << 20) -> tuple[int, str]:
    """(bytes, sha256 hex) of an open file, read from offset 0 (see sha256_file)."""
    h = hashlib.sha256()
    n = 0
    buf = memoryview(bytearray(chunk))  # reused: a fresh 4 MiB bytes per read faults
    if drop_cache:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    while True:
        k = os.preadv(fd, [buf], n)
        if not k:
            return n, h.hexdigest()
        h.update(buf[:k])
        n += k


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> int:
    """All of `data` written into `fd` at `offset` (pwrite may write less); len(data)."""
    view, off = memoryview(data), offset
    while view:
        k = os.pwrite(fd, view, off)
        view, off = view[k:], off + k
    return len(data)


def rmdir_quietly(d: Path, removed: list[Path]) -> None:
    """Remove an empty directory and note it; one still in use (not empty) stays."""
    try:
        d.rmdir()
        removed.append(d)
    except OSError:
        pass


def _holder(fd: int) -> str:
    """What the holder of a PidLock wrote. It writes just after it takes the lock: one
    that has only just taken it is given a moment (two requeued jobs started together
    read each other's empty file and said 'in use by ?')."""
    import time

    for _ in range(20):
        text = os.pread(fd, 200, 0).decode(errors="replace").strip()
        if text:
            return text
        time.sleep(0.025)
    return "another process (it has not written its name)"


class PidLock:
    """An exclusive flock on `path` that records its holder, held while the owner works.

    The kernel drops the lock when the process dies, however it dies, so a killed run
    never leaves a stale lock; the file stays (unlinking it would race a new holder).
    `busy(holder)` builds the error raised when another process holds it; `holder` is
    what that process wrote (by default its pid). With `dir_fd`, `path` is a name in that
    directory. The file is opened O_NOFOLLOW | O_CREAT (never O_TRUNC) and written only
    once the flock is held and fstat says it is a regular file of ours with one link.
    """

    def __init__(self, path: str | os.PathLike[str], busy: Callable[[str], AutotuneError],
                 *, tag: str | None = None, dir_fd: int | None = None) -> None:
        self.path = Path(path)
        self.busy = busy
        self.tag = tag
        self.dir_fd = dir_fd
        self._fd: int | None = None

    def _open(self, flags: int) -> int:
        """The lock file's descriptor; a link (or a FIFO, a device) there is refused."""
        flags |= os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            if self.dir_fd is not None:
                return os.open(self.path.name, flags, 0o644, dir_fd=self.dir_fd)
            return os.open(self.path, flags, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise UsageError(f"{self.path}: a symbolic link where a lock file belongs; "
                                 "it is not followed: remove it and rerun.") from None
            raise

    def _check_ours(self, fd: int) -> None:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
            os.close(fd)
            raise UsageError(f"{self.path}: not a lock file of this user (mode "
                             f"{stat.filemode(st.st_mode)}, uid {st.st_uid}, {st.st_nlink} "
                             "links); it is left untouched: remove it and rerun.")

    def acquire(self, wait: float = 0.0) -> PidLock:
        """Take the lock; when another process holds it, retry for up to `wait` seconds,
        then raise `busy(holder)`."""
        import time

        if self.dir_fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = self._open(os.O_RDWR | os.O_CREAT)
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN) and time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                busy = e.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
                holder = _holder(fd) if busy else ""
                os.close(fd)
                if busy:
                    raise self.busy(holder) from None
                raise
        self._check_ours(fd)  # only now: another's file is never truncated
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{self.tag or os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def held_elsewhere(self) -> str | None:
        """The holder's tag when another process holds the lock now, else None (the lock
        is taken and released at once to find out)."""
        try:
            fd = self._open(os.O_RDONLY)
        except (FileNotFoundError, UsageError):
            return None  # no lock file, or a link: nobody holds that
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return _holder(fd)
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


def unwritable_reason(path: str | os.PathLike[str]) -> tuple[Path, str | None]:
    """Whether this user can make `path` (a file or folder, its missing folders made too):
    (the nearest existing folder at or above it, None) when it can, else (that path, why
    not: "is a file, not a folder" or "cannot be written (read-only or not this user's)").
    Nothing is created."""
    top = Path(path)
    try:
        while not os.path.lexists(top) and top != top.parent:
            top = top.parent
        if top.is_dir():
            ok = os.access(top, os.W_OK | os.X_OK)
            return top, None if ok else "cannot be written (read-only or not this user's)"
        if top.exists():
            return top, "is a file, not a folder"
    except PermissionError:   # a folder above it this user cannot search
        pass
    return top, "cannot be written (read-only or not this user's)"


def user_cache_dir() -> Path | None:
    """$XDG_CACHE_HOME, else ~/.cache: this user's cache folder, autotune's below it; None
    where the process has no home to put it in: HOME unset and no passwd entry for its
    uid (a container started with `--user 12345`, env cleared). `~/.cache` would then
    stay relative, and a folder named `~` appeared in whatever the working directory was."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):   # the XDG spec: a relative value is to be ignored
        return Path(xdg)
    home = os.path.expanduser("~")
    return Path(home) / ".cache" if os.path.isabs(home) else None


__all__ = ["PidLock", "fsync_dir", "pwrite_all", "rmdir_quietly", "sha256_fd", "sha256_file", "unwritable_reason",
           "user_cache_dir",
           "write_json_atomic", "write_text_atomic"]
