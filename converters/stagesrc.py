"""What `stage` copies from: a local folder or a conversion in another storage (s3://).

Both give stage's engine (autotune_converters.stage) the same three things: the files to
stage with the manifest that lists them (`entries`), a check of each file before its copy
starts (`opened`: missing, of another size), and the copy itself into a temporary file
(the `fill` it yields), which raises StageError naming the file for a failure of that
file only.

- LocalSource: files opened beneath SRC's descriptor without following a link, hashed
  while copied, checked unchanged (size, mtime, inode) after; a plain folder (no
  manifest) is every regular file below it; a folder holding a conversion's work folder
  and no manifest is an unfinished conversion, refused before anything is copied.
- StorageSource: the manifest read first (one GET), then one LIST for each shard's size
  and version; each shard fetched by parallel ranged reads pinned to that version (an
  object replaced mid-copy is an error, never a mix), fsynced, read back (pages dropped
  with --verify sha256) and checked against the manifest's sha256 -- an ETag is not a
  checksum. A shard already under its final name that the resume state does not know is
  kept when it hashes right (`adopts`: reading it back costs far less than fetching it).
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISDIR

from autotune_base.beneath import lstat, open_dir, open_regular, parent_of, read_bytes
from autotune_base.errors import SampleError, StageError, UsageError
from autotune_base.fsutil import sha256_fd
from autotune_converters.manifest import Manifest, parse_manifest
from autotune_converters.storage.base import ShortRead, Stat, Storage
from autotune_converters.storage.local import LocalStorage
from autotune_converters.workdir import NAME as CONVERT_WORK

WORK = ".autotune-stage"
MANIFEST = "manifest.json"
CHUNK = 4 << 20
PART = 8 << 20          # bytes per ranged read of a large shard
PARTS_IN_FLIGHT = 8     # ranged reads at once per shard

Fill = Callable[[int], tuple[int, str]]  # fill(fd of the temporary copy) -> (bytes, sha256)


@dataclass
class FileEntry:
    name: str          # path relative to SRC (and DST)
    bytes: int
    sha256: str | None  # from the manifest; None for a plain folder (computed on copy)


def list_source(src: Path, src_fd: int) -> tuple[list[FileEntry], Manifest | None, bytes | None]:
    """The files to stage: the manifest's shards when SRC is a conversion (read once, by
    the manifest loader, which refuses any name outside SRC), else every regular file
    under SRC (no symlinks followed), hashes computed while copying. Also the manifest
    and its bytes (published as read). UsageError for an unfinished conversion (its work
    folder and no manifest), before anything is copied."""
    try:
        raw = read_bytes(src_fd, MANIFEST)
    except FileNotFoundError:
        raw = None
    except OSError as e:
        raise StageError(f"{src / MANIFEST}: cannot be read ({e.strerror}); it must be a "
                         "regular file: replace it, or stage the folder without it.") from None
    if raw is not None:
        m = parse_manifest(raw, str(src / MANIFEST))
        return [FileEntry(sh["file"], sh["bytes"], sh.get("sha256")) for sh in m.shards], m, raw
    st = lstat(src_fd, CONVERT_WORK)
    if st is not None and S_ISDIR(st.st_mode):
        # Its shards so far, the plan and the lock are not a dataset: staged as a folder
        # they would get a manifest that says complete.
        raise UsageError(f"{src}: an unfinished conversion ({CONVERT_WORK}/ and no "
                         f"{MANIFEST}); rerun the same `autotune convert` to finish it (it "
                         "resumes), then stage it.")
    return [FileEntry(s.name, s.size, None) for s in LocalStorage(src).list(skip_dirs=(WORK,))
            ], None, None


class LocalSource:
    """A local folder (see the module doc)."""

    adopts = False

    def __init__(self, path: Path) -> None:
        self.path, self.shown = path, str(path)
        self.fd = open_dir(path)

    def close(self) -> None:
        os.close(self.fd)

    def entries(self) -> tuple[list[FileEntry], Manifest | None, bytes | None]:
        return list_source(self.path, self.fd)

    def ready(self, entries: list[FileEntry]) -> None:
        """Nothing to learn before copying: each file is checked as it is opened."""

    @contextmanager
    def opened(self, e: FileEntry, verify: str, dst: Path) -> Iterator[Fill]:
        fi, st0 = _open_source(self.fd, e)
        try:
            if st0.st_size != e.bytes:
                raise StageError(f"{e.name}: source is {st0.st_size:,} bytes, the manifest "
                                 f"says {e.bytes:,}; the source changed after conversion: "
                                 "convert again")

            def fill(fo: int) -> tuple[int, str]:
                n, src_sha = _copy_bytes(fi, fo)
                _check_copy(self.fd, e, st0, fi, n, src_sha)
                if verify == "sha256":
                    got = sha256_fd(fo, drop_cache=True)[1]  # pages dropped: the disk's bytes
                    if got != src_sha:
                        raise StageError(f"{e.name}: the copy on {dst} reads back as sha256 "
                                         f"{got[:12]}…, not {src_sha[:12]}…: the destination "
                                         "disk corrupted it")
                return n, src_sha

            yield fill
        finally:
            os.close(fi)


def _open_source(src_fd: int, e: FileEntry) -> tuple[int, os.stat_result]:
    """The source file, opened beneath SRC without following a link, and its fstat."""
    try:
        with parent_of(src_fd, e.name) as (sd, leaf):
            return open_regular(sd, leaf)
    except FileNotFoundError:
        raise StageError(f"{e.name}: vanished from the source before it was copied") from None
    except OSError as err:  # a link, a FIFO, permission denied: this file, not the stage
        fix = ("fix its permissions" if err.errno in (errno.EACCES, errno.EPERM) else
               "stage copies only regular files, never through a link: replace it with the "
               "file itself")
        raise StageError(f"{e.name}: cannot read the source ({err.strerror or err}); {fix}, "
                         "then rerun") from None


def _copy_bytes(fi: int, fo: int) -> tuple[int, str]:
    h = hashlib.sha256()
    n = 0
    with os.fdopen(fi, "rb", closefd=False) as r, os.fdopen(fo, "wb", closefd=False) as w:
        while True:
            b = r.read(CHUNK)
            if not b:
                break
            h.update(b)
            w.write(b)
            n += len(b)
        w.flush()
        os.fsync(fo)
    return n, h.hexdigest()


def _check_copy(src_fd: int, e: FileEntry, st0: os.stat_result, fi: int, n: int,
                src_sha: str) -> None:
    """The source unchanged while it was copied, and what the manifest says it is."""
    st1, now = os.fstat(fi), lstat(src_fd, e.name)
    if now is None:
        raise StageError(f"{e.name}: vanished from the source while it was copied")
    if (st1.st_size, st1.st_mtime_ns, now.st_ino) != (st0.st_size, st0.st_mtime_ns, st0.st_ino) \
            or n != st0.st_size:
        raise StageError(f"{e.name}: changed in the source while it was copied ({st0.st_size:,} "
                         f"-> {st1.st_size:,} bytes); nothing was published for it")
    if e.sha256 and src_sha != e.sha256:
        raise StageError(f"{e.name}: source sha256 {src_sha[:12]}… does not match the "
                         f"manifest's {e.sha256[:12]}…: the source is corrupt or changed; "
                         "convert again")


class StorageSource:
    """A conversion in a storage other than a local folder (see the module doc)."""

    adopts = True

    def __init__(self, storage: Storage) -> None:
        self.storage, self.shown = storage, storage.root
        self.objects: dict[str, Stat] = {}

    def close(self) -> None:
        pass

    def entries(self) -> tuple[list[FileEntry], Manifest, bytes]:
        m, raw = read_remote_manifest(self.storage)
        return [FileEntry(sh["file"], sh["bytes"], sh.get("sha256")) for sh in m.shards], m, raw

    def ready(self, entries: list[FileEntry]) -> None:
        """One LIST: name -> the object it gives (size and version to pin the reads to)."""
        want = {e.name for e in entries}
        self.objects = {s.name: s for s in self.storage.list() if s.name in want}

    @contextmanager
    def opened(self, e: FileEntry, verify: str, dst: Path) -> Iterator[Fill]:
        obj = self.objects.get(e.name)
        if obj is None:
            raise StageError(f"{self.storage.where(e.name)}: listed by the manifest but not "
                             "in the bucket; convert again (or upload it)")
        if obj.size != e.bytes:
            raise StageError(f"{e.name}: the object is {obj.size:,} bytes, the manifest says "
                             f"{e.bytes:,}; the bucket changed after conversion: convert again")

        def fill(fo: int) -> tuple[int, str]:
            try:
                n = self.storage.read_into(obj, fo, part=PART, in_flight=PARTS_IN_FLIGHT)
            except SampleError as err:  # changed or deleted since the LIST: this shard only
                raise StageError(str(err)) from None
            except ShortRead as r:
                raise StageError(f"{_key(self.storage, r.name)}: a ranged GET gave {r.got:,} "
                                 f"bytes, not {r.want:,}; rerun to fetch it again") from None
            os.fsync(fo)
            got = sha256_fd(fo, drop_cache=verify == "sha256")[1]  # the disk's bytes
            if e.sha256 and got != e.sha256:
                raise StageError(f"{e.name}: the copy's sha256 {got[:12]}… does not match the "
                                 f"manifest's {e.sha256[:12]}…: the object is corrupt or "
                                 "changed; convert again")
            return n, got

        yield fill


def _key(storage: Storage, name: str) -> str:
    key = getattr(storage, "key", None)
    return key(name) if key is not None else name


def read_remote_manifest(storage: Storage) -> tuple[Manifest, bytes]:
    """The storage's manifest.json (one read) and its bytes; UsageError when there is none."""
    try:
        raw = storage.read(MANIFEST)
    except (SampleError, FileNotFoundError):
        raise UsageError(f"{storage.root}: no {MANIFEST} (a conversion publishes it last); "
                         "stage takes a converted dataset from a bucket: convert it first, "
                         "or wait for its conversion to finish.") from None
    return parse_manifest(raw, storage.where(MANIFEST)), raw


def adopt(dst_fd: int, e: FileEntry) -> os.stat_result | None:
    """A shard under its final name that the resume state does not know (a killed run
    saves it every 16 files, unsynced), when it hashes to the manifest's sha256: its
    stat, to keep it. Only regular files, opened beneath DST without following a link."""
    if not e.sha256:
        return None
    try:
        with parent_of(dst_fd, e.name) as (pd, leaf):
            fd, st = open_regular(pd, leaf)
    except OSError:
        return None
    try:
        if st.st_size != e.bytes or sha256_fd(fd)[1] != e.sha256:
            return None
    finally:
        os.close(fd)
    return st


__all__ = ["FileEntry", "LocalSource", "StorageSource", "adopt", "list_source",
           "read_remote_manifest"]
