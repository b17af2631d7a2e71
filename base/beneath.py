"""Names from a dataset, and file operations that cannot leave the tree they name.

A manifest, a plan or a state file comes with the dataset, and the dataset may come from
a stranger: a name in it is used only when it is a plain relative path (`plain_name`),
and every file operation on such a name walks it one component at a time beneath a
directory descriptor, never following a symbolic link (O_NOFOLLOW, O_DIRECTORY for the
directories). A file is opened O_NONBLOCK (a FIFO does not hang the open) and is used
only when fstat on that very descriptor says it is a regular file, so nothing changes
between the check and the use. The rules are those of Python's tarfile `data` filter
(PEP 706) and Go's archive/tar insecure-path check, for files on disk.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from autotune_base.errors import UnsafeName

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def plain_name(name: Any, where: str, entry: str) -> str:
    """`name` when it is a plain relative path inside a tree ("a/b.tar"), else UnsafeName
    naming the file (`where`) and the entry: not a string, empty, NUL, absolute, a `.`
    or `..` component, an empty component (`a//b`, a trailing `/`)."""
    why = None
    if not isinstance(name, str):
        why = "not a string, so not a file name"
    elif not name:
        why = "empty"
    elif "\0" in name:
        why = "contains a NUL byte"
    elif name.startswith("/"):
        why = "an absolute path"
    elif any(c in ("", ".", "..") for c in name.split("/")):
        why = "not a plain relative path (an empty, `.` or `..` component)"
    if why:
        raise UnsafeName(f"{where}: {entry} names {name!r}: {why}; a dataset may name only "
                         "files inside its own folder. Convert again, or fix the entry.")
    return name


def open_dir(path: str | os.PathLike[str]) -> int:
    """A descriptor of the directory the user named (SRC, DST: their own path, links in
    it are theirs)."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def subdir(dir_fd: int, name: str, *, create: bool = False) -> int:
    """A descriptor of directory `name` (one component) beneath `dir_fd`, created when
    `create`; a symbolic link there raises OSError(ELOOP or ENOTDIR)."""
    if create:
        try:
            os.mkdir(name, 0o777, dir_fd=dir_fd)
        except FileExistsError:
            pass
    try:
        return os.open(name, _DIR, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            kind = "a symbolic link" if _is_link(dir_fd, name) else "not a directory"
            raise OSError(e.errno, f"{kind}, not followed", name) from None
        raise


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


@contextmanager
def parent_of(root_fd: int, name: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
    """(descriptor of the directory holding `name`, its last component), walked beneath
    `root_fd` one component at a time without following links; closed on exit."""
    *dirs, leaf = name.split("/")
    fd = os.dup(root_fd)
    try:
        for d in dirs:
            nxt = subdir(fd, d, create=create)
            os.close(fd)
            fd = nxt
        yield fd, leaf
    finally:
        os.close(fd)


def open_regular(dir_fd: int, leaf: str, flags: int = os.O_RDONLY) -> tuple[int, os.stat_result]:
    """Open file `leaf` of `dir_fd` (no link followed, no blocking on a FIFO) and fstat it:
    (fd, stat) of a regular file; OSError(EINVAL, "a FIFO, not a regular file") otherwise."""
    try:
        fd = os.open(leaf, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(e.errno, "a symbolic link, not followed", leaf) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{_kind(st.st_mode)}, not a regular file", leaf)
    # O_NONBLOCK was for the open alone: some cluster file systems (Lustre) give reads and
    # locks of a non-blocking descriptor EAGAIN under contention.
    os.set_blocking(fd, True)
    return fd, st


def stat_regular(root_fd: int, name: str) -> os.stat_result:
    """stat of regular file `name` beneath `root_fd`, no link followed: FileNotFoundError
    when absent; OSError(ELOOP, "a symbolic link, not followed", the link's component) when
    it is a link or is reached through one; OSError(EINVAL, "<kind>, not a regular file")
    for anything else. A name without a directory part costs one fstatat."""
    if "/" in name:
        with parent_of(root_fd, name) as (d, leaf):
            st = os.stat(leaf, dir_fd=d, follow_symlinks=False)
    else:
        st = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        raise OSError(errno.ELOOP, "a symbolic link, not followed", name)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, f"{_kind(st.st_mode)}, not a regular file", name)
    return st


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return what
    return "not a regular file"


def read_bytes(root_fd: int, name: str, limit: int = 1 << 30) -> bytes:
    """The bytes of regular file `name` beneath `root_fd` (see open_regular)."""
    with parent_of(root_fd, name) as (d, leaf):
        fd, st = open_regular(d, leaf)
    try:
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"{st.st_size:,} bytes, more than {limit:,}", name)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit + 1)[:limit]
    finally:
        os.close(fd)


def lstat(root_fd: int, name: str) -> os.stat_result | None:
    """stat of `name` beneath `root_fd`, the link itself when it is one; None when absent
    or reached only through a link."""
    try:
        with parent_of(root_fd, name) as (d, leaf):
            return os.stat(leaf, dir_fd=d, follow_symlinks=False)
    except OSError:
        return None


def unlink_file(root_fd: int, name: str) -> bool:
    """Remove `name` beneath `root_fd` when it is a regular file or a link (unlink never
    follows one); a directory, or a path through a link, is left alone. True if removed."""
    try:
        with parent_of(root_fd, name) as (d, leaf):
            st = os.stat(leaf, dir_fd=d, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                return False
            os.unlink(leaf, dir_fd=d)
            return True
    except OSError:
        return False


__all__ = ["lstat", "open_dir", "open_regular", "parent_of", "plain_name", "read_bytes",
           "stat_regular", "subdir", "unlink_file"]


def remove_tree(dir_fd: int, name: str) -> None:
    """Remove directory `name` (one component) beneath `dir_fd` and all it holds, through
    descriptors: a link anywhere in it is removed itself, never followed; what cannot be
    removed stays, silently (shutil.rmtree(dir_fd=) does this from Python 3.11 only, and
    the package supports 3.10). Iterative, so a deep tree cannot exhaust the stack; each
    folder is listed once, so one that cannot be emptied ends the walk there."""
    try:
        top = subdir(dir_fd, name)
    except OSError:
        return
    # (descriptor, its parent's descriptor, its name there, its folders still to remove)
    stack: list[tuple[int, int, str, list[str]]] = [(top, dir_fd, name, _empty_files(top))]
    while stack:
        fd, parent, leaf, folders = stack[-1]
        if folders:
            child = folders.pop()
            try:
                cfd = subdir(fd, child)
            except OSError:
                continue
            stack.append((cfd, fd, child, _empty_files(cfd)))
            continue
        stack.pop()
        os.close(fd)
        try:
            os.rmdir(leaf, dir_fd=parent)
        except OSError:
            pass


def _empty_files(fd: int) -> list[str]:
    """Unlink everything in the folder `fd` that is not a folder (files, links, FIFOs);
    the names of the folders it holds."""
    folders = []
    try:
        with os.scandir(fd) as it:
            entries = list(it)
    except OSError:
        return []
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False):
                folders.append(e.name)
            else:
                os.unlink(e.name, dir_fd=fd)
        except OSError:
            pass
    return folders
