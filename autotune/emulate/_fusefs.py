"""The FUSE side of slowfs: a read-only passthrough on pyfuse3 that adds latency.

Imported only by the server process (`python -m autotune.emulate.slowfs SRC MNT`), so the
rest of autotune does not need pyfuse3. Every delay is a `trio.sleep` and every backing
syscall runs in a worker thread, so concurrent requests overlap both their delay and
their disk I/O: more readers hide latency, as on NFS.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pyfuse3
import trio

T = TypeVar("T")

# Kernel caches names/attributes this long (like NFS attribute caching); data is never
# kept across opens (keep_cache=False), so every open re-reads through the delay.
ATTR_TIMEOUT_S = 1.0


async def _io(fn: Callable[..., T], *args: Any) -> T:
    """Run a blocking syscall in a worker thread; OSError becomes the FUSE errno."""
    try:
        return await trio.to_thread.run_sync(fn, *args)
    except OSError as e:
        raise pyfuse3.FUSEError(e.errno or errno.EIO) from None


def _pread_full(fd: int, size: int, off: int) -> bytes:
    # FUSE treats a short reply as end of file, so keep reading until size or real EOF.
    chunks, got = [], 0
    while got < size:
        b = os.pread(fd, size - got, off + got)
        if not b:
            break
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def _list_dir(path: bytes) -> list[tuple[bytes, os.stat_result]]:
    out = []
    with os.scandir(path) as it:
        for e in it:
            try:
                out.append((e.name, e.stat(follow_symlinks=False)))
            except OSError:
                continue  # vanished between listing and stat
    out.sort()
    return out


class SlowFS(pyfuse3.Operations):
    """Mirror of `src` (bytes path) with `delay_s` added to each open and read request,
    and to lookup/getattr/readdir too when `delay_metadata` is set."""

    enable_writeback_cache = False

    def __init__(self, src: bytes, delay_s: float, delay_metadata: bool = False) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.delay_metadata = delay_metadata
        self._statvfs_path = src
        st = os.lstat(src)
        root = pyfuse3.ROOT_INODE
        # Own inode numbers: source st_ino may collide across submounts or equal 1 (root).
        self._path: dict[int, bytes] = {root: src}
        self._key: dict[int, tuple[int, int]] = {root: (st.st_dev, st.st_ino)}
        self._inode: dict[tuple[int, int], int] = {(st.st_dev, st.st_ino): root}
        self._lookups: dict[int, int] = {}
        self._next_inode = root + 1
        self._dirs: dict[int, tuple[bytes, list[tuple[bytes, os.stat_result]] | None]] = {}
        self._next_dirfh = 1

    # -- helpers ---------------------------------------------------------------------

    async def _delay(self, metadata: bool = False) -> None:
        if self.delay_s > 0 and (not metadata or self.delay_metadata):
            await trio.sleep(self.delay_s)

    def _path_of(self, inode: int) -> bytes:
        try:
            return self._path[inode]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    def _inode_for(self, st: os.stat_result, path: bytes) -> tuple[int, bool]:
        key = (st.st_dev, st.st_ino)
        ino = self._inode.get(key)
        if ino is not None:
            return ino, False
        ino, self._next_inode = self._next_inode, self._next_inode + 1
        self._inode[key], self._key[ino], self._path[ino] = ino, key, path
        return ino, True

    def _forget_one(self, inode: int) -> None:
        key = self._key.pop(inode, None)
        self._path.pop(inode, None)
        self._lookups.pop(inode, None)
        if key is not None:
            self._inode.pop(key, None)

    @staticmethod
    def _attrs(st: os.stat_result, inode: int) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = inode
        a.generation = 0
        a.entry_timeout = a.attr_timeout = ATTR_TIMEOUT_S
        # Read-only mirror: strip write bits so tools do not expect to write.
        a.st_mode = st.st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
        a.st_nlink, a.st_uid, a.st_gid, a.st_rdev = st.st_nlink, st.st_uid, st.st_gid, st.st_rdev
        a.st_size, a.st_blksize, a.st_blocks = st.st_size, st.st_blksize, st.st_blocks
        a.st_atime_ns, a.st_mtime_ns, a.st_ctime_ns = st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns
        return a

    # -- metadata --------------------------------------------------------------------

    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        await self._delay(metadata=True)
        parent = self._path_of(parent_inode)
        if name == b".":
            path = parent
        elif name == b"..":
            path = parent if parent_inode == pyfuse3.ROOT_INODE else os.path.dirname(parent)
        else:
            path = os.path.join(parent, name)
        st = await _io(os.lstat, path)
        ino, _ = self._inode_for(st, path)
        self._lookups[ino] = self._lookups.get(ino, 0) + 1
        return self._attrs(st, ino)

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for ino, n in inode_list:
            if ino == pyfuse3.ROOT_INODE:
                continue
            left = self._lookups.get(ino, 0) - n
            if left > 0:
                self._lookups[ino] = left
            else:
                self._forget_one(ino)

    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        await self._delay(metadata=True)
        st = await _io(os.lstat, self._path_of(inode))
        return self._attrs(st, inode)

    async def readlink(self, inode: int, ctx: Any) -> bytes:
        return await _io(os.readlink, self._path_of(inode))

    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        v = await _io(os.statvfs, self._statvfs_path)
        s = pyfuse3.StatvfsData()
        for f in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
                  "f_files", "f_ffree", "f_favail", "f_namemax"):
            setattr(s, f, getattr(v, f))
        return s

    # -- directories -----------------------------------------------------------------

    async def opendir(self, inode: int, ctx: Any) -> int:
        path = self._path_of(inode)
        fh, self._next_dirfh = self._next_dirfh, self._next_dirfh + 1
        self._dirs[fh] = (path, None)  # listed on first readdir, then stable for offsets
        return fh

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        path, entries = self._dirs[fh]
        if entries is None:
            await self._delay(metadata=True)
            entries = await _io(_list_dir, path)
            self._dirs[fh] = (path, entries)
        for i in range(start_id, len(entries)):
            name, st = entries[i]
            ino, new = self._inode_for(st, os.path.join(path, name))
            if not pyfuse3.readdir_reply(token, name, self._attrs(st, ino), i + 1):
                if new:
                    self._forget_one(ino)
                break
            # readdirplus: the kernel counts each reported entry as a lookup.
            self._lookups[ino] = self._lookups.get(ino, 0) + 1

    async def releasedir(self, fh: int) -> None:
        self._dirs.pop(fh, None)

    # -- files -----------------------------------------------------------------------

    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            raise pyfuse3.FUSEError(errno.EROFS)
        path = self._path_of(inode)
        await self._delay()
        fd = await _io(os.open, path, os.O_RDONLY)
        return pyfuse3.FileInfo(fh=fd, keep_cache=False, direct_io=False)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        await self._delay()
        return await _io(_pread_full, fh, size, off)

    async def release(self, fh: int) -> None:
        os.close(fh)


async def _stop_on(signals: set[int], parent_pid: int | None, stop: Callable[[], None]) -> None:
    async def watch_parent() -> None:
        # A parent killed with SIGKILL cannot unmount us: notice we were re-parented.
        while os.getppid() == parent_pid:
            await trio.sleep(0.5)
        stop()

    async with trio.open_nursery() as n:
        if parent_pid:
            n.start_soon(watch_parent)
        with trio.open_signal_receiver(*signals) as sigs:
            async for _ in sigs:
                stop()
                break
        n.cancel_scope.cancel()


def serve(src: str, mnt: str, delay_ms: float, *, delay_metadata: bool = False,
          max_tasks: int = 64, allow_other: bool = False, parent_pid: int | None = None) -> None:
    """Mount `src` at `mnt` with the delay and serve until SIGINT/SIGTERM or an unmount.

    Blocks; unmounts before returning. `parent_pid`: also stop when that process dies.
    """
    ops = SlowFS(os.fsencode(os.path.abspath(src)), delay_ms / 1000.0, delay_metadata)
    opts = {"fsname=slowfs", "subtype=slowfs", "ro", "default_permissions"}
    if allow_other:
        opts.add("allow_other")
    # Until trio installs its own handlers, let SIGTERM unwind like Ctrl-C (so `finally`
    # still unmounts) instead of killing us with the mount left behind.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    pyfuse3.init(ops, mnt, opts)

    async def run() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(_stop_on, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP},
                         parent_pid, pyfuse3.terminate)
            # pyfuse3 starts another request task whenever all are busy, up to max_tasks:
            # this is what lets delayed requests overlap.
            await pyfuse3.main(min_tasks=1, max_tasks=max_tasks)
            n.cancel_scope.cancel()

    try:
        trio.run(run)
    finally:
        pyfuse3.close(unmount=True)
