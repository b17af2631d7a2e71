"""`stage s3://BUCKET/PREFIX DST`: a converted dataset in a bucket copied to local disk.

autotune_converters.stage's rules, with objects for files: the bucket's manifest.json is read
first (its names checked once by the manifest loader: plain relative paths), then one
LIST gives each shard's size and ETag. Each shard is fetched by parallel ranged GETs,
all pinned to that ETag (an object replaced mid-copy is an error, never a mix), written
with pwrite into a temporary file inside DST (O_NOFOLLOW, beneath DST's descriptor),
fsynced, read back (pages dropped with --verify sha256) and checked against the
manifest's sha256 -- an ETag is not a checksum -- and only then renamed to its name.
The manifest is written last; a rerun skips what an earlier run verified; the lock,
the per-node split, the removal of stale files and the free-space check are stage's own.

Failures: a shard missing from the bucket, of another size, changed, or failing its
checksum is named in the result's failures (the others are staged; no manifest: exit 4);
a bucket that is missing or denied raises StoreDenied (exit 2), an endpoint that stops
answering StoreUnreachable (exit 1). Nothing is published under a final name unverified.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from autotune_base.beneath import open_regular, parent_of
from autotune_base.errors import SampleError, StageError, UsageError
from autotune_base.fsutil import sha256_fd
from autotune_converters.manifest import Manifest, parse_manifest
from autotune_converters.objstore.client import ObjectInfo, S3Config, Store
from autotune_converters.objstore.url import S3Url, parse
from autotune_converters.stage import (MANIFEST, FileEntry, Progress, StageResult, _copy_all,
                              _fresh_tmp, _lock, _node_entries, _publish, _publish_one,
                              _State, _withdraw, _work)

PART = 8 << 20          # bytes per ranged GET of a large shard
PARTS_IN_FLIGHT = 8     # ranged GETs at once per shard


def read_remote_manifest(store: Store, url: S3Url) -> tuple[Manifest, bytes]:
    """The bucket's manifest.json (one GET) and its bytes; UsageError when there is none."""
    key = url.key(MANIFEST)
    try:
        raw = store.call(url.url(key), url.bucket,
                         lambda c: c.get_object(Bucket=url.bucket, Key=key)["Body"].read())
    except SampleError:
        raise UsageError(f"{url}: no {MANIFEST} (a conversion publishes it last); stage takes "
                         "a converted dataset from a bucket: convert it first, or wait for "
                         "its conversion to finish.") from None
    return parse_manifest(raw, url.url(key)), raw


def _objects(store: Store, url: S3Url, entries: list[FileEntry]) -> dict[str, ObjectInfo]:
    """name -> the object the LIST gives for it (size and ETag to pin the GETs to)."""
    cut = len(url.list_prefix)
    want = {e.name for e in entries}
    return {o.key[cut:]: o for o in store.list(url).objects if o.key[cut:] in want}


def _fetch_into(store: Store, bucket: str, obj: ObjectInfo, fo: int) -> int:
    """The object's bytes written at their offsets in `fo` by ranged GETs in parallel."""
    ranges = [(a, min(a + PART, obj.size)) for a in range(0, obj.size, PART)] or [(0, 0)]
    if obj.size == 0:
        return 0

    def part(r: tuple[int, int]) -> int:
        data = store.get(bucket, obj, r if len(ranges) > 1 else None)
        if len(data) != r[1] - r[0]:
            raise StageError(f"{obj.key}: a ranged GET gave {len(data):,} bytes, not "
                             f"{r[1] - r[0]:,}; rerun to fetch it again")
        view, off = memoryview(data), r[0]
        while view:
            k = os.pwrite(fo, view, off)
            view, off = view[k:], off + k
        return len(data)

    if len(ranges) == 1:
        return part(ranges[0])
    with ThreadPoolExecutor(max_workers=min(PARTS_IN_FLIGHT, len(ranges)),
                            thread_name_prefix="s3range") as ex:
        return sum(ex.map(part, ranges))


def _copy_object(store: Store, url: S3Url, objs: dict[str, ObjectInfo], dst_fd: int,
                 tmp_fd: int, e: FileEntry, verify: str, dst: Path
                 ) -> tuple[int, str, os.stat_result]:
    """Fetch, fsync, verify against the manifest's sha256, rename (stage's _copy_one for
    an object). Raises StageError naming the shard for a failure of that shard only."""
    obj = objs.get(e.name)
    if obj is None:
        raise StageError(f"{url.url(url.key(e.name))}: listed by the manifest but not in "
                         "the bucket; convert again (or upload it)")
    if obj.size != e.bytes:
        raise StageError(f"{e.name}: the object is {obj.size:,} bytes, the manifest says "
                         f"{e.bytes:,}; the bucket changed after conversion: convert again")
    tmp = hashlib.sha256(e.name.encode()).hexdigest()[:32] + f".{os.getpid()}.partial"
    fo = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o666, dir_fd=tmp_fd)
    try:
        try:
            n = _fetch_into(store, url.bucket, obj, fo)
        except SampleError as err:  # changed or deleted since the LIST: this shard only
            raise StageError(str(err)) from None
        os.fsync(fo)
        got = sha256_fd(fo, drop_cache=verify == "sha256")[1]  # the disk's bytes
        if e.sha256 and got != e.sha256:
            raise StageError(f"{e.name}: the copy's sha256 {got[:12]}… does not match the "
                             f"manifest's {e.sha256[:12]}…: the object is corrupt or changed; "
                             "convert again")
        st = os.fstat(fo)
        os.close(fo)
        fo = -1
        if st.st_size != e.bytes:
            raise StageError(f"{e.name}: the copy is {st.st_size:,} bytes, not {e.bytes:,}")
        _publish_one(dst_fd, tmp_fd, tmp, e, dst)
        return n, got, st
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=tmp_fd)
        except OSError:
            pass
        raise
    finally:
        if fo >= 0:
            os.close(fo)


def _adopt(dst_fd: int, e: FileEntry, state: _State) -> bool:
    """A shard under its final name that the resume state does not know (a killed run
    saves it every 16 files, unsynced) is kept when it hashes to the manifest's sha256:
    reading it back costs far less than fetching it again. Only regular files, opened
    beneath DST without following a link."""
    if not e.sha256:
        return False
    try:
        with parent_of(dst_fd, e.name) as (pd, leaf):
            fd, st = open_regular(pd, leaf)
    except OSError:
        return False
    try:
        if st.st_size != e.bytes or sha256_fd(fd)[1] != e.sha256:
            return False
    finally:
        os.close(fd)
    state.add(e.name, st.st_size, st.st_mtime_ns, e.sha256)
    return True


def stage_s3(src: str, dst: str | os.PathLike[str], *, workers: int = 4,
             verify: str = "sha256", progress: Progress | None = None,
             on_file: Callable[[str], None] | None = None, node_rank: int | None = None,
             nnodes: int | None = None, store: Store | None = None) -> StageResult:
    """Stage the converted dataset at s3://BUCKET/PREFIX into the local DST (see the
    module doc); the same result as autotune_converters.stage.stage, per-shard failures in it."""
    if verify not in ("sha256", "size"):
        raise UsageError(f"verify must be sha256 or size, but got {verify!r}.")
    if workers < 1:
        raise UsageError(f"workers must be at least 1, but got {workers}.")
    if isinstance(dst, str) and dst.startswith("s3://"):
        raise UsageError(f"{dst}: stage copies to local disk; give a local DST.")
    url, d = parse(src), Path(dst).absolute()
    st = store or Store(S3Config.from_env())
    t0 = time.monotonic()
    manifest, raw = read_remote_manifest(st, url)
    entries = [FileEntry(sh["file"], sh["bytes"], sh.get("sha256")) for sh in manifest.shards]
    entries = _node_entries(entries, manifest, url, node_rank, nnodes)  # type: ignore[arg-type]
    objs = _objects(st, url, entries)
    with ExitStack() as fds:
        d.mkdir(parents=True, exist_ok=True)
        dst_fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fds.callback(os.close, dst_fd)
        work_fd = _work(d, dst_fd)
        fds.callback(os.close, work_fd)
        fds.enter_context(_lock(d, work_fd))
        tmp_fd = _fresh_tmp(work_fd)
        fds.callback(os.close, tmp_fd)
        state = _State(d, work_fd)
        _withdraw(dst_fd, entries, state)
        todo = [e for e in entries
                if not state.trusted(dst_fd, e) and not _adopt(dst_fd, e, state)]
        need = sum(e.bytes for e in todo)
        vfs = os.fstatvfs(dst_fd)
        if need > vfs.f_bavail * vfs.f_frsize:
            raise StageError(f"{d}: {need / 2**20:,.1f} MiB needed for {len(todo)} file(s), "
                             f"{vfs.f_bavail * vfs.f_frsize / 2**20:,.1f} MiB free; free space "
                             "or pick another DST. Nothing was copied.")
        copied, failures = _copy_all(
            todo, need, workers,
            lambda e: _copy_object(st, url, objs, dst_fd, tmp_fd, e, verify, d),
            dst_fd, state, d, on_file, progress)
        if not failures:
            _publish(d, dst_fd, tmp_fd, raw, state, (node_rank, nnodes) if node_rank is not None
                     else None, entries)
        shutil.rmtree("tmp", dir_fd=work_fd, ignore_errors=True)
    return StageResult(str(url), str(d), len(entries), len(todo) - len(failures),
                       len(entries) - len(todo), copied, time.monotonic() - t0, verify,
                       sorted(failures, key=lambda f: f.file), not failures,
                       node_rank=node_rank, nnodes=nnodes)


__all__ = ["read_remote_manifest", "stage_s3"]
