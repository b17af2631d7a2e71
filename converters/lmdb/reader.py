"""Map-style reader of an autotune LMDB conversion that does not collapse on cold storage.

The usual idiom, `lmdb.open(path, readonly=True, lock=False, readahead=False)` then
`txn.get(key)`, reads a value through the memory map: on a cold cache every 4 KiB page of
the value faults in as its own I/O (readahead is off), so a 110 KB image costs ~28 I/Os;
at a 300-IOPS cap that is ~12 images/s, slower than the loose files it replaced. With
readahead on instead, every fault reads a whole readahead window around it (read_ahead_kb
of the device, often 128 KiB, here 8 MiB): right for a sequential pass, a waste of
bandwidth for random access to a dataset larger than RAM.

This reader (io="pread", the default) never asks LMDB for a value: the conversion's index
(data.idx, see lmdb_layout) says where each value lies in data.mdb, and the value's byte
range is read with one `os.pread`: one I/O per image for random access (a small random
read is read as is), while a sequential pass still gets the kernel's readahead on the
file descriptor. (Asking LMDB where a value is does not help: py-lmdb 3's get() touches
every page of the value, even with buffers=True.)

io modes:
    "pread"             (default) index + one pread per value; random and sequential access
    "mmap"              LMDB get() with readahead=True (sequential passes)
    "mmap-noreadahead"  the usual idiom, readahead=False: for measurements only

LMDB handles (the mmap modes) are opened lazily, in the process that reads, read-only with
lock=False (no reader-table slot, no lock file needed, works on read-only storage), and
reopened when the process changes (a DataLoader worker after fork); pickling drops them
(spawn). py-lmdb allows one open handle per environment and process, and its registry of
open handles is inherited across fork: readers of one environment in one process share a
handle (reference counted), and a forked child closes its inherited copy (a process-local
munmap and close with lock=False) before opening its own. The pread mode holds only a file
descriptor and the index, also reopened per process. Handles are released when the source
is freed (a finalizer per process: a forked child's copy never closes by the parent's
numbers) or by close().

Opening checks the folder against the manifest before any read: data.mdb and data.idx
regular files, not symbolic links (the folder itself may be one), of their listed bytes,
and data.idx one record per `num_samples`; data.mdb is opened O_NOFOLLOW, data.idx read
beneath the folder with its size checked first.
"""

from __future__ import annotations

import errno
import os
import stat
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune_converters.lmdb.layout import (
    INDEX_FILE,
    INDEX_RECORD,
    decode_value,
    index_dtype,
    key,
)
from autotune_base.beneath import open_dir, read_bytes
from autotune_base.errors import UsageError
from autotune_converters.manifest import Manifest, check_files, fd_limit, read_manifest
from autotune_converters.source import SampleError, SampleSource

IO_MODES = ("pread", "mmap", "mmap-noreadahead")
_RUN = 4 << 20
DATA_FILE = "data.mdb"


# realpath of the environment directory -> [pid, env, readahead, users]
_ENVS: dict[str, list[Any]] = {}


def _acquire_env(root: str, readahead: bool, size: int) -> Any:
    """This process's shared read-only handle of the environment at `root`."""
    import lmdb

    real = os.path.realpath(root)
    e = _ENVS.get(real)
    if e is not None and e[0] != os.getpid():
        try:  # inherited across fork: drop the copy, never use it
            e[1].close()
        except lmdb.Error:
            pass
        del _ENVS[real]
        e = None
    if e is None:
        try:
            env = lmdb.open(real, readonly=True, lock=False, subdir=True, readahead=readahead,
                            max_readers=1, map_size=max(size, 1 << 20))
        except lmdb.Error as err:
            raise SampleError(f"{real}/{DATA_FILE}: cannot open the LMDB environment ({err}); "
                              "the file is damaged or not an LMDB: check its sha256 against "
                              "manifest.json or convert again.") from None
        info, psize = env.info(), env.stat()["psize"]
        if (info["last_pgno"] + 1) * psize > size:
            env.close()
            raise SampleError(f"{real}/{DATA_FILE}: truncated: {size:,} bytes, the environment "
                              f"needs {(info['last_pgno'] + 1) * psize:,}; copy (or convert) "
                              "again.")
        e = _ENVS[real] = [os.getpid(), env, readahead, 0]
    elif e[2] != readahead:
        raise SampleError(f"{real}: already open in this process with readahead={e[2]}; use one "
                          "io mode per environment and process.")
    e[3] += 1
    return e[1]


def _release_env(root: str) -> None:
    real = os.path.realpath(root)
    e = _ENVS.get(real)
    if e is not None and e[0] == os.getpid():
        e[3] -= 1
        if e[3] <= 0:
            e[1].close()
            del _ENVS[real]


def _release(pid: int, fd: int, txn: Any, root: str | None) -> None:
    """Release the handles one LmdbSource opened in process `pid`: nothing in another
    process (a forked child's copy of the finalizer: the numbers are not its own)."""
    if pid != os.getpid():
        return
    if txn is not None:
        try:
            txn.abort()
        except Exception:  # noqa: BLE001 (lmdb.Error of an environment closed already)
            pass
    if root is not None:
        _release_env(root)
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


class LmdbSource(SampleSource):
    """Samples of an LMDB conversion by index: `read(i) -> (image bytes, label)`.

    Args:
        root: the conversion's directory (manifest.json + data.mdb).
        io: "pread" (default), "mmap" or "mmap-noreadahead" (see the module doc).
    """

    format = "lmdb"

    def __init__(self, root: str | os.PathLike[str], *, io: str = "pread",
                 manifest: Manifest | None = None) -> None:
        super().__init__(root)
        if io not in IO_MODES:
            raise ValueError(f"io must be one of {', '.join(IO_MODES)}, but got {io!r}")
        self.io = io
        self.manifest = manifest or read_manifest(self.root, expect_format="lmdb")
        self.path = self.root / DATA_FILE
        self.index_path = self.root / INDEX_FILE
        self._n = self.manifest.num_samples
        # Every file listed, and data.mdb however listed: present, not a link (never read
        # through one), of its listed bytes: a short file (a partial copy) would be read
        # through the map as SIGBUS, or give short preads: refuse it now, naming it.
        listed = {f["file"] for f in self.manifest.shards}
        stats = check_files(self.root, [*self.manifest.shards, *(
            [{"file": DATA_FILE, "bytes": None}] if DATA_FILE not in listed else [])])
        if INDEX_FILE not in listed and (io == "pread" or os.path.lexists(self.index_path)):
            if not os.path.lexists(self.index_path):
                raise SampleError(f"{self.index_path}: missing; it tells the reader where each "
                                  "image lies in data.mdb. Convert again (or pass io='mmap').")
            stats.update(check_files(self.root, [{"file": INDEX_FILE, "bytes": None}]))
        self._check_count(stats)
        self._pid = -1
        self._env: Any = None
        self._txn: Any = None
        self._fd = -1
        self._index: Any = None
        self._size = 0
        self._closer: Any = None  # weakref.finalize releasing this process's handles

    def _check_count(self, stats: dict[str, os.stat_result]) -> None:
        """num_samples as the files bound it, before anything is sized from it: data.idx
        holds one INDEX_RECORD per sample; without it, a sample takes a byte of data.mdb
        at least. UsageError naming manifest.json and both figures."""
        n, where = self._n, self.root / "manifest.json"
        idx = stats.get(INDEX_FILE)
        if idx is not None and idx.st_size != INDEX_RECORD * n:
            raise UsageError(f"{where}: num_samples is {n:,} but {INDEX_FILE} holds "
                             f"{idx.st_size:,} bytes, {idx.st_size / INDEX_RECORD:,.0f} "
                             f"entries of {INDEX_RECORD} bytes; the manifest was edited or "
                             "the files do not belong together: convert again.")
        mdb = stats[DATA_FILE].st_size
        if idx is None and n > mdb:
            raise UsageError(f"{where}: num_samples is {n:,}, more than {DATA_FILE} has bytes "
                             f"({mdb:,}); the manifest was edited or damaged: convert again.")

    # -- per-process handles -------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        d.update(_pid=-1, _env=None, _txn=None, _fd=-1, _index=None, _closer=None)
        return d

    def _open(self) -> None:
        if self._closer is not None:
            # Another process's handles (inherited by fork: the parent's descriptor is a
            # copy here, ours to close; its LMDB handle is dropped by _acquire_env), or
            # ours, closed: the old finalizer never runs again (in a child it would close
            # a descriptor number this process may have reused).
            self._closer.detach()
            self._closer = None
            if self._fd >= 0 and self._pid != os.getpid():
                try:
                    os.close(self._fd)
                except OSError:
                    pass
        self._env = self._txn = None
        self._fd = -1
        if self.io == "pread":
            try:  # never through a link (checked when opened; and if swapped since)
                fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError as e:
                raise SampleError(self._unreadable(e)) from None
            try:
                self._size = os.fstat(fd).st_size
                if self._index is None:
                    self._index = self._load_index()
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
        else:
            st = os.stat(self.path, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):  # LMDB opens it by name: check the name
                raise SampleError(self._unreadable(OSError(
                    errno.ELOOP if stat.S_ISLNK(st.st_mode) else errno.EINVAL,
                    "not a regular file")))
            self._size = st.st_size
            self._env = _acquire_env(str(self.root), self.io == "mmap", self._size)
            self._txn = self._env.begin(buffers=True)
        self._pid = os.getpid()
        self._arm()

    def _unreadable(self, e: OSError) -> str:
        if limit := fd_limit(self.path, e):
            return limit
        if e.errno == errno.ELOOP:
            return (f"{self.path}: a symbolic link, not followed; a dataset is read only from "
                    "inside its own folder: replace the link with the file itself.")
        return (f"{self.path}: cannot be opened ({e.strerror}); it must be a regular file in "
                "the dataset's folder: copy (or convert) again.")

    def _arm(self) -> None:
        """(Re)register the finalizer of this process's handles: released when this
        source is freed without close() (each open_dataset of an LMDB otherwise kept a
        descriptor until the process ended). Never `self` in its arguments, or the source
        would never be freed."""
        if self._closer is not None:
            self._closer.detach()
        self._closer = weakref.finalize(self, _release, self._pid, self._fd, self._txn,
                                        str(self.root) if self._env is not None else None)

    def _load_index(self) -> Any:
        import numpy as np

        want = INDEX_RECORD * self._n
        fd = -1
        try:  # beneath the folder, no link followed; its size checked before it is read
            fd = open_dir(self.root)
            raw = read_bytes(fd, INDEX_FILE, want)
        except OSError as e:
            raise SampleError(fd_limit(self.index_path, e) or f"{self.index_path}: cannot be "
                              f"read ({e.strerror}); convert again.") from None
        finally:
            if fd >= 0:
                os.close(fd)
        if len(raw) != want:
            raise SampleError(f"{self.index_path}: {len(raw):,} bytes, expected "
                              f"{INDEX_RECORD * self._n:,} for {self._n} samples; convert again.")
        idx = np.frombuffer(raw, dtype=index_dtype())
        end = int((idx["offset"] + idx["length"]).max()) if self._n else 0
        if end > self._size:
            raise SampleError(f"{self.index_path}: points {end:,} bytes into data.mdb, which has "
                              f"{self._size:,}; the files do not belong together: convert again.")
        return idx

    def close(self) -> None:
        """Release this process's handles (reopened on the next read)."""
        if self._closer is not None and self._pid == os.getpid():
            self._closer()  # once: a finalizer called is dead
        self._env = self._txn = None
        self._fd = -1
        self._pid = -1

    # -- SampleSource --------------------------------------------------------------------

    def __len__(self) -> int:
        return self._n

    @property
    def classes(self) -> list[str]:
        return self.manifest.classes

    def _value(self, index: int) -> bytes | memoryview:
        if not 0 <= index < self._n:
            raise IndexError(f"sample {index} out of range 0..{self._n - 1}")
        if self._pid != os.getpid():
            self._open()
        if self._fd >= 0:
            off, n = int(self._index["offset"][index]), int(self._index["length"][index])
            data = os.pread(self._fd, n, off)
            while len(data) < n:  # a short read is legal; finish it
                more = os.pread(self._fd, n - len(data), off + len(data))
                if not more:
                    raise SampleError(f"{self.path}: ends at {off + len(data):,} inside sample "
                                      f"{index}; the file is truncated: copy or convert again.")
                data += more
            return data
        try:
            mv = self._txn.get(key(index))
        except Exception as e:  # noqa: BLE001 (lmdb is imported lazily: its Error, named)
            import lmdb

            if not isinstance(e, lmdb.Error):
                raise
            self._renew_txn()  # LMDB invalidates a transaction that met a damaged page
            raise SampleError(f"{self.path}: key {key(index).decode()}: LMDB cannot read it "
                              f"({type(e).__name__}: {e}); the environment is damaged: check "
                              "its sha256 against manifest.json or convert again.") from None
        if mv is None:
            raise SampleError(f"{self.path}: key {key(index).decode()} missing (manifest says "
                              f"{self._n} samples); the environment is damaged: convert again.")
        return bytes(mv)

    def record(self, index: int) -> tuple[bytes, int, str]:
        """(image bytes, label, original relative path) of sample `index`."""
        v = self._value(index)
        try:
            label, path, img = decode_value(v)
        except ValueError as e:
            raise SampleError(f"{self.path}: key {key(index).decode()}: {e}; the environment "
                              "was not written by this autotune version or is damaged.") from None
        self._check_label(index, label)
        return bytes(img), label, path

    def _renew_txn(self) -> None:
        """A fresh read transaction (the next read reports its own error, not BAD_TXN)."""
        import lmdb

        try:
            self._txn.abort()
            self._txn = self._env.begin(buffers=True)
            self._arm()  # the finalizer aborts the new transaction, not the old
        except lmdb.Error:
            self._txn = None
            self.close()  # reopened on the next read

    def _check_label(self, index: int, label: int) -> None:
        """A label outside the manifest's classes, refused as the WebDataset reader does
        (a loss function would index out of range, or silently train on it)."""
        n = len(self.manifest.classes)
        if not 0 <= label < max(1, n):
            raise SampleError(f"{self.path}: key {key(index).decode()}: label {label} outside "
                              f"0..{n - 1} (manifest.json lists {n} classes); the environment "
                              "is damaged or not this manifest's: convert again.")

    def records(self, start: int = 0, stop: int | None = None
                ) -> Iterator[tuple[bytes, int, str]]:
        """Every sample in index order (of `start`..`stop`, default all): (image bytes,
        label, original path).

        With the index (io="pread"), a sequential pass reads data.mdb in runs of values
        of up to 4 MiB, each with one read into a reused buffer (values were appended in
        index order, so a run is one stretch of the file), not one read per value."""
        stop = self._n if stop is None else min(stop, self._n)
        if self.io != "pread":
            for i in range(start, stop):
                yield self.record(i)
            return
        if self._pid != os.getpid():
            self._open()
        idx = self._index
        offs, lens = idx["offset"][start:stop].tolist(), idx["length"][start:stop].tolist()
        buf = bytearray(_RUN)
        i = start
        while i < stop:
            lo = offs[i - start]
            j = i + 1
            while (j < stop and offs[j - start] >= offs[j - 1 - start]
                   and offs[j - start] + lens[j - start] - lo <= _RUN):
                j += 1
            hi = offs[j - 1 - start] + lens[j - 1 - start]
            if hi - lo > len(buf):
                buf = bytearray(hi - lo)
            mv = memoryview(buf)[:hi - lo]
            got = 0
            while got < len(mv):
                k = os.preadv(self._fd, [mv[got:]], lo + got)
                if not k:
                    raise SampleError(f"{self.path}: ends at {lo + got:,} inside sample {i}; "
                                      "the file is truncated: copy or convert again.")
                got += k
            for n in range(i, j):
                v = mv[offs[n - start] - lo:offs[n - start] - lo + lens[n - start]]
                try:
                    label, path, img = decode_value(v)
                except ValueError as e:
                    raise SampleError(f"{self.path}: key {key(n).decode()}: {e}; the "
                                      "environment was not written by this autotune version "
                                      "or is damaged.") from None
                self._check_label(n, label)
                yield bytes(img), label, path
            mv.release()
            i = j

    def read(self, index: int) -> tuple[bytes, int]:
        data, label, _ = self.record(index)
        return data, label

    def describe(self, index: int) -> str:
        try:
            _, _, path = self.record(index)
        except Exception:  # noqa: BLE001 (describing must not fail while reporting a failure)
            path = "?"
        return f"{self.path} key {key(index).decode()} ({path})"

    def files(self) -> Iterator[Path]:
        return iter([self.path, self.index_path])

    def info(self) -> dict:
        d = super().info()
        d["io"] = self.io
        return d
