"""Reading a unit's source files at the disk's speed: readahead hints, no per-file buffers.

A unit's files are read in plan order, which is a seeded shuffle: random on the disk. One
file at a time, each read waits for its own I/O (about 2,500 files/s measured here, cold);
`Prefetch` opens the next files ahead and asks the kernel for them with
`posix_fadvise(POSIX_FADV_WILLNEED)`, which starts their reads at once, so the disk has many
requests queued while this process checks and writes the current one (about 10,000
files/s, same disk, same order: see README "Measured here"). The window is bounded in files
and bytes, so the page cache it fills stays small.

`read_into` reads a whole file into a caller's buffer (a slice of a shard's staging buffer,
or a reused LMDB value buffer): a fresh `bytes` per file costs page faults of its own
(measured: 64 us against 20 us for an 86 KB file from the page cache).

`fetch_ahead` is the same window for a bucket SRC: the next objects' GETs in flight
(autotune_converters.storage.s3), each pinned to the ETag its plan's LIST gave.
"""

from __future__ import annotations

import collections
import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from functools import lru_cache
from typing import Any, TypeVar

from autotune_base.fsutil import open_noatime
from autotune_converters.records import Entry, SkippedFile

T = TypeVar("T")
WINDOW_FILES = 64
WINDOW_BYTES = 32 << 20
ETAGS = "etags.json"  # the plan directory's ETags of a bucket SRC's objects (its LIST)
INFLIGHT = 16         # a bucket SRC's GETs in flight (bytes: WINDOW_BYTES)


def _open_ahead(path: str) -> int | OSError:
    try:
        fd = open_noatime(path)
    except OSError as e:
        return e
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except (OSError, AttributeError):
        pass  # a hint only: a filesystem that refuses it is read as usual
    return fd


def _ahead(entries: Iterable[Entry], start: Callable[[Entry], T], release: Callable[[T], None],
           *, files: int, nbytes: int) -> Iterator[tuple[Entry, T]]:
    """(entry, start(entry)), in order, with the next entries already started: up to
    `files` of them and `nbytes` of their sizes (at least one). Those started and not
    taken are released when the iterator is closed."""
    it = iter(entries)
    ahead: collections.deque[tuple[Entry, T]] = collections.deque()
    ahead_bytes = 0
    done = False
    try:
        while True:
            while not done and (not ahead or (len(ahead) < files and ahead_bytes < nbytes)):
                e = next(it, None)
                if e is None:
                    done = True
                    break
                ahead.append((e, start(e)))
                ahead_bytes += e.size
            if not ahead:
                return
            e, h = ahead.popleft()
            ahead_bytes -= e.size
            yield e, h
    finally:
        for _, h in ahead:
            release(h)


class _Window:
    """The window `_ahead_in_thread` shares between its opener thread and the consumer:
    the started entries in order, their bytes, and the end (None) or the opener's error."""

    def __init__(self, files: int, nbytes: int) -> None:
        self.cond = threading.Condition()
        self.items: collections.deque[tuple[Entry, Any] | None] = collections.deque()
        self.files, self.nbytes, self.bytes = files, nbytes, 0
        self.stopped = False
        self.error: BaseException | None = None

    def room(self) -> bool:
        """Wait until one more may be started (at least one always may); False once the
        consumer has stopped."""
        with self.cond:
            while not self.stopped and self.items and (
                    len(self.items) >= self.files or self.bytes >= self.nbytes):
                self.cond.wait()
            return not self.stopped

    def put(self, item: tuple[Entry, Any] | None) -> bool:
        """Hand one started entry (or the end) over; False, and nothing taken, once the
        consumer has stopped."""
        with self.cond:
            if self.stopped and item is not None:
                return False
            self.items.append(item)
            self.bytes += item[0].size if item is not None else 0
            self.cond.notify_all()
            return True

    def take(self) -> tuple[Entry, Any] | None:
        with self.cond:
            while not self.items:
                self.cond.wait()
            item = self.items.popleft()
            self.bytes -= item[0].size if item is not None else 0
            self.cond.notify_all()
            return item

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()


def _ahead_in_thread(entries: Iterable[Entry], start: Callable[[Entry], T],
                     release: Callable[[T], None], *, files: int, nbytes: int
                     ) -> Iterator[tuple[Entry, T]]:
    """`_ahead`, with start() called by a thread of its own: opening a file and its
    WILLNEED hint submit the file's reads in the calling thread (page allocation, block
    requests: about 60 us a file, measured), which `_ahead` adds to the consumer's own
    work; here that runs beside it, on the other core (both syscalls release the GIL).
    The same window: at most `files` started and not taken, `nbytes` of their sizes."""
    w = _Window(files, nbytes)

    def run() -> None:
        try:
            for e in entries:
                if not w.room():
                    return
                h = start(e)
                if not w.put((e, h)):
                    release(h)
                    return
        except BaseException as err:  # noqa: BLE001 (raised in the consumer)
            w.error = err
        w.put(None)  # the end

    t = threading.Thread(target=run, name="autotune-open-ahead", daemon=True)
    t.start()
    try:
        while (item := w.take()) is not None:
            yield item
        if w.error is not None:
            raise w.error
    finally:
        w.stop()
        t.join()
        for item in w.items:
            if item is not None:
                release(item[1])


def _close(fd: int | OSError) -> None:
    if isinstance(fd, int):
        os.close(fd)


def prefetch(root: str, entries: Iterable[Entry], *, window_files: int = WINDOW_FILES,
             window_bytes: int = WINDOW_BYTES, thread: bool = False
             ) -> Iterator[tuple[Entry, int | OSError]]:
    """(entry, open fd or the OSError of opening it), in order, with the next files'
    reads already started (by a thread of their own with `thread`). The fd is closed
    when the next item is asked for (or the iterator is closed): use it before that."""
    ahead_fn = _ahead_in_thread if thread else _ahead
    with closing(ahead_fn(entries, lambda e: _open_ahead(os.path.join(root, e.relpath)),
                          _close, files=window_files, nbytes=window_bytes)) as ahead:
        for e, fd in ahead:
            try:
                yield e, fd
            finally:
                _close(fd)


@lru_cache(maxsize=4)
def _etags(plan_dir: str) -> dict[str, str]:
    try:
        with open(os.path.join(plan_dir, ETAGS), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def fetch_ahead(root: str, plan_dir: str, entries: Iterable[Entry], *,
                inflight: int = INFLIGHT, window_bytes: int = WINDOW_BYTES,
                store: Any = None, endpoint_url: str | None = None
                ) -> Iterator[tuple[Entry, bytes | SkippedFile]]:
    """The objects of a bucket SRC (s3://BUCKET/PREFIX) as prefetch gives a folder's
    files: (entry, its object's bytes or the SkippedFile saying why not), in order, with
    the next objects' GETs already in flight (bounded in objects and bytes), each pinned
    to the ETag the plan's LIST gave (the plan directory's etags.json). An object deleted
    or changed since the LIST is a skipped sample naming it; StoreUnreachable /
    StoreDenied propagate (a store that stops answering, or refuses, stops the run)."""
    from autotune_base.errors import SampleError
    from autotune_converters.storage.base import Stat
    from autotune_converters.storage.s3 import S3Storage, process_store

    storage = S3Storage(root, store=store or process_store(endpoint_url))
    etags = _etags(plan_dir)
    pool = ThreadPoolExecutor(max_workers=inflight, thread_name_prefix="s3get")
    try:
        with closing(_ahead(entries, lambda e: pool.submit(
                storage.read, Stat(e.relpath, e.size, etags.get(e.relpath, ""))),
                lambda fut: fut.cancel(), files=inflight, nbytes=window_bytes)) as ahead:
            for e, fut in ahead:
                try:
                    got: bytes | SkippedFile = fut.result()
                except SampleError as err:  # deleted or changed since the LIST: this sample only
                    got = SkippedFile(e.relpath, f"unreadable ({err})")
                yield e, got
    finally:
        pool.shutdown(wait=True)


def read_into(fd: int, dest: memoryview) -> int | bytes:
    """Read the file behind `fd` from its start into `dest`; returns the byte count, or
    the whole content as bytes when it does not fit (a file that grew since the scan)."""
    n = 0
    while n < len(dest):
        k = os.preadv(fd, [dest[n:]], n)
        if k == 0:
            return n
        n += k
    more = [bytes(dest)]
    while True:  # dest is full: the file may be larger
        b = os.pread(fd, 1 << 20, n)
        if not b:
            break
        more.append(b)
        n += len(b)
    return n if len(more) == 1 else b"".join(more)


def read_whole(fd: int, size_hint: int) -> bytes:
    """The whole file as bytes, with one allocation when the scan's size still holds."""
    data = os.pread(fd, size_hint + 1, 0)
    if len(data) <= size_hint:
        return data
    chunks = [data]
    off = len(data)
    while True:
        b = os.pread(fd, 1 << 20, off)
        if not b:
            return b"".join(chunks)
        chunks.append(b)
        off += len(b)
