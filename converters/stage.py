"""`autotune stage`: copy a dataset to local disk, verified and atomic, resumable.

Every file is copied to a temporary name inside DST, fsynced, verified (its sha256 read
back from the disk after its pages were dropped, against the manifest's), and only then
renamed to its final name; the manifest is copied last, so its presence means the staged
copy is complete. A killed run leaves no file under a final name that is not whole, and a
rerun skips what a previous run verified (recorded in DST/.autotune-stage/state.json).
A lock stops two stagers writing one DST. A source file that changes or vanishes while it
is copied is reported by name; the others finish and the result says partial.

SRC is a local folder or conversion, or a conversion in another storage (s3://BUCKET/
PREFIX: its manifest read first, each shard fetched by parallel ranged GETs pinned to the
LIST's ETag and checked against the manifest's sha256): autotune_converters.stagesrc says
how each is read; everything on DST's side is this one engine's.

Per node (`node_rank`, `nnodes`): only the WebDataset shards the ranks of that node read
(autotune_converters.wds.split: by node first, then local rank, the same every epoch), plus the
whole manifest; DST/node.json (written before the manifest) says which node the copy is
for, and the reader refuses a rank of another node with the command that fixes it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from stat import S_ISDIR, S_ISREG
from typing import Any

from autotune_base.beneath import (lstat, open_dir, open_regular, parent_of, plain_name, read_bytes,
                                remove_tree, subdir, unlink_file)
from autotune_base.errors import StageError, UsageError
from autotune_base.fsutil import PidLock, sha256_fd, write_text_atomic
from autotune_converters import registry
from autotune_converters.manifest import Manifest, parse_manifest
from autotune_converters.stagesrc import (MANIFEST, WORK, FileEntry, LocalSource, StorageSource,
                                          adopt, list_source)


Progress = Callable[[int, int], None]  # (bytes done, bytes total)


@dataclass
class StageFailure:
    file: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class StageResult:
    src: str
    dst: str
    files: int
    copied: int
    skipped: int           # already staged and verified by an earlier run
    bytes_copied: int
    seconds: float
    verify: str
    failures: list[StageFailure] = field(default_factory=list)
    manifest_written: bool = False   # by this run (never with --verify-only)
    verify_only: bool = False
    bytes_verified: int = 0          # --verify-only: the bytes read back and hashed
    source_seq_mib_s: float | None = None
    node_rank: int | None = None  # a copy for one node: which, of how many
    nnodes: int | None = None

    @property
    def mib_per_s(self) -> float:
        """Copied (or with --verify-only, verified) MiB a second."""
        done = self.bytes_verified if self.verify_only else self.bytes_copied
        return done / 2**20 / self.seconds if self.seconds > 0 else 0.0

    @property
    def partial(self) -> bool:
        return bool(self.failures)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["mib_per_s"] = self.mib_per_s
        d["partial"] = self.partial
        if self.source_seq_mib_s:
            d["vs_source_seq"] = self.mib_per_s / self.source_seq_mib_s
        return d


def _withdraw(dst_fd: int, entries: list[FileEntry], state: _State) -> None:
    """Before a (re-)stage copies anything: the old manifest.json no longer vouches for
    what DST will hold, so it goes first (durably); files an earlier stage put there
    (listed by the old manifest or the stage's own record) that the new source does not
    list are removed. Nothing else in DST is touched, and nothing through a link."""
    ours = set(state.done)
    if lstat(dst_fd, MANIFEST) is not None:
        try:
            ours |= {sh["file"] for sh in parse_manifest(read_bytes(dst_fd, MANIFEST), MANIFEST).shards}
        except (OSError, UsageError):
            pass  # an unreadable manifest vouches for nothing: it goes all the same
        unlink_file(dst_fd, MANIFEST)
        os.fsync(dst_fd)
    keep = {e.name for e in entries}
    gone = sorted(ours - keep)
    for rel in gone:
        st = lstat(dst_fd, rel)
        if st is not None and S_ISREG(st.st_mode):
            unlink_file(dst_fd, rel)
    state.drop(gone)


def _node_entries(entries: list[FileEntry], manifest: Manifest | None, src: Path | str,
                  node_rank: int | None, nnodes: int | None) -> list[FileEntry]:
    """The files node `node_rank` of `nnodes` needs: its ranks' shards (all without a node)."""
    if node_rank is None and nnodes is None:
        return entries
    if node_rank is None or nnodes is None:
        raise UsageError("give both node_rank and nnodes (the copy for one node), or neither "
                         "(the whole dataset).", setting=("node_rank", "nnodes"))
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise UsageError(f"node_rank must be between 0 and {nnodes - 1} (nnodes {nnodes}), but "
                         f"got {node_rank}.", setting=("node_rank", "nnodes"))
    if manifest is None or not registry.has(manifest.format, "per_node"):
        what = "a plain folder" if manifest is None else f"a {manifest.format} conversion"
        raise UsageError(f"{src}: {what}; a copy per node splits WebDataset shards (every node "
                         "reads all of anything else): stage it whole.",
                         setting=("node_rank", "nnodes"))
    from autotune_converters.wds.split import node_shards

    mine = node_shards(entries, node_rank, nnodes)
    if not mine:
        raise UsageError(f"{src}: {len(entries)} shards for {nnodes} nodes: node {node_rank} "
                         "would read none; use fewer nodes or convert with more shards "
                         "(--readers).", setting=("node_rank", "nnodes"))
    return mine


def _staged_node(dst_fd: int) -> tuple[int, int] | None:
    from autotune_converters.wds.split import NODE_FILE

    try:
        d = json.loads(read_bytes(dst_fd, NODE_FILE))
        return int(d["node_rank"]), int(d["nnodes"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None


def _work(dst: Path, dst_fd: int, *, create: bool = True) -> int:
    """DST/.autotune-stage: a directory of ours, never a link followed to elsewhere."""
    try:
        fd = subdir(dst_fd, WORK, create=create)
    except OSError as e:
        raise StageError(f"{dst / WORK}: {e.strerror}: not stage's work folder; remove it "
                         "and rerun.") from None
    uid = os.fstat(fd).st_uid
    if uid != os.geteuid():
        os.close(fd)
        raise StageError(f"{dst / WORK}: belongs to another user (uid {uid}); its leftovers "
                         "are not ours to remove: stage into a folder of yours.")
    return fd


def _lock(dst: Path, work_fd: int) -> PidLock:
    return PidLock(dst / WORK / "lock", lambda holder: StageError(
        f"{dst}: another `autotune stage` (pid {holder}) is writing here; wait for it or "
        "pick another DST."), dir_fd=work_fd)


def _fresh_tmp(work_fd: int) -> int:
    """An empty WORK/tmp (partial copies of a killed run removed; a link there is removed
    itself, never followed); its descriptor."""
    st = lstat(work_fd, "tmp")
    if st is not None and not S_ISDIR(st.st_mode):
        os.unlink("tmp", dir_fd=work_fd)
    elif st is not None:
        remove_tree(work_fd, "tmp")  # fd-based: no link followed
    return subdir(work_fd, "tmp", create=True)


class _State:
    """Files verified by earlier runs: name -> [bytes, mtime_ns, sha256]."""

    def __init__(self, dst: Path, work_fd: int) -> None:
        self.where = str(dst / WORK / "state.json")
        self.work_fd = work_fd
        self.lock = threading.Lock()
        self.done: dict[str, list] = {}
        try:
            done = json.loads(read_bytes(work_fd, "state.json"))
        except (OSError, ValueError, RecursionError):
            done = {}  # a lost state only means files are verified again
        if isinstance(done, dict):
            for name, rec in done.items():
                plain_name(name, self.where, "an entry")
                if isinstance(rec, list) and len(rec) == 3:
                    self.done[name] = rec
        self._dirty = 0
        self._saved = time.monotonic()

    def trusted(self, dst_fd: int, e: FileEntry) -> bool:
        rec = self.done.get(e.name)
        if not rec:
            return False
        st = lstat(dst_fd, e.name)
        if st is None or not S_ISREG(st.st_mode):
            return False
        return rec[0] == st.st_size == e.bytes and rec[1] == st.st_mtime_ns and \
            (e.sha256 is None or rec[2] == e.sha256)

    def add(self, name: str, size: int, mtime_ns: int, sha: str | None) -> None:
        with self.lock:
            self.done[name] = [size, mtime_ns, sha]
            self._dirty += 1
            # Every 16 files, or a second after the last save: a shard takes seconds to
            # copy, and a kill -9 between saves had up to 15 verified shards copied again.
            if self._dirty >= 16 or time.monotonic() - self._saved >= 1.0:
                self._save()

    def drop(self, names: list[str]) -> None:
        """Forget these files (one write of the state, however many)."""
        with self.lock:
            for name in names:
                self.done.pop(name, None)
            self._save()

    def save(self) -> None:
        with self.lock:
            self._save()

    def _save(self) -> None:
        # Not fsynced: a lost state only means files are verified again on resume.
        write_text_atomic("state.json", json.dumps(self.done), durable=False,
                          dir_fd=self.work_fd)
        self._dirty = 0
        self._saved = time.monotonic()


def _publish_one(dst_fd: int, tmp_fd: int, tmp: str, e: FileEntry, dst: Path) -> None:
    """Rename the verified copy to its name in DST (directories made beneath DST; a link
    on the way is refused, a link at the name itself is replaced, never its target)."""
    try:
        with parent_of(dst_fd, e.name, create=True) as (pd, leaf):
            os.replace(tmp, leaf, src_dir_fd=tmp_fd, dst_dir_fd=pd)
            os.fsync(pd)
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise
        raise StageError(f"{e.name}: cannot be written in {dst} ({err.filename}: "
                         f"{err.strerror}); stage never writes through a link in DST: remove "
                         "it and rerun") from None


def _make_dst(d: Path) -> int:
    """DST, created where missing, opened; a file there or a folder that cannot be made is
    the user's path to change (a usage error), not a failed stage."""
    try:
        d.mkdir(parents=True, exist_ok=True)
        return open_dir(d)
    except OSError as e:
        what = ("a file, not a folder" if e.errno in (errno.EEXIST, errno.ENOTDIR)
                else f"cannot create or open it ({e.strerror or e})")
        raise UsageError(f"{d}: {what}; DST is the folder to stage into (created if "
                         "missing): name one you can write") from None


def verify_staged(dst: str | os.PathLike[str], *, src: str | os.PathLike[str] | None = None) -> StageResult:
    """Re-hash every staged file against the manifest (`--verify-only`); mismatching or
    missing files are named, and forgotten by the resume state so a rerun repairs them."""
    d = Path(dst)
    t0 = time.monotonic()
    with ExitStack() as fds:
        try:
            dst_fd = open_dir(d)
        except OSError as e:
            raise UsageError(f"{d}: cannot open it ({e.strerror or e}); --verify-only checks a "
                             "folder `autotune stage` wrote: stage SRC there first") from None
        fds.callback(os.close, dst_fd)
        src_fd = dst_fd if src is None else open_dir(src)
        if src is not None:
            fds.callback(os.close, src_fd)
        entries, manifest, _ = list_source(Path(src) if src else d, src_fd)
        node = _staged_node(dst_fd)
        if node is not None:
            entries = _node_entries(entries, manifest, Path(src) if src else d, *node)
        state = None
        st = lstat(dst_fd, WORK)
        if st is not None and S_ISDIR(st.st_mode):
            work_fd = _work(d, dst_fd, create=False)
            fds.callback(os.close, work_fd)
            state = _State(d, work_fd)
        failures, nbytes = _rehash(dst_fd, entries, state)
    # Nothing is copied or written: the bytes are the ones read back, in their own key.
    return StageResult(str(src or d), str(d), len(entries), 0, len(entries) - len(failures),
                       0, time.monotonic() - t0, "sha256", failures,
                       verify_only=True, bytes_verified=nbytes,
                       node_rank=node[0] if node else None, nnodes=node[1] if node else None)


def _rehash(dst_fd: int, entries: list[FileEntry], state: _State | None
            ) -> tuple[list[StageFailure], int]:
    failures = []
    nbytes = 0
    for e in entries:
        try:
            with parent_of(dst_fd, e.name) as (pd, leaf):
                fd, st = open_regular(pd, leaf)
        except OSError:
            failures.append(StageFailure(e.name, "missing from the staged copy"))
            continue
        try:
            got = sha256_fd(fd, drop_cache=True)[1]
        finally:
            os.close(fd)
        nbytes += st.st_size
        if e.sha256 and got != e.sha256:
            failures.append(StageFailure(e.name, f"sha256 {got[:12]}… does not match the manifest's "
                                         f"{e.sha256[:12]}…: corrupt; rerun `autotune stage` to repair"))
            if state:
                state.drop([e.name])
    return failures, nbytes


def _publish(s: Path | str, dst_fd: int, tmp_fd: int, raw: bytes | None, state: _State,
             want_node: tuple[int, int] | None, entries: list[FileEntry]) -> None:
    """Which copy this is (node.json), then the manifest, last: it means complete. Their
    temporary files go in the work folder's tmp, which a rerun empties: a stage killed
    before the rename leaves nothing half-written in DST."""
    from autotune_converters.wds.split import NODE_FILE

    if want_node is not None:
        write_text_atomic(NODE_FILE, json.dumps(
            {"node_rank": want_node[0], "nnodes": want_node[1],
             "shards": [e.name for e in entries]}, indent=1), dir_fd=dst_fd, tmp_dir_fd=tmp_fd)
    elif lstat(dst_fd, NODE_FILE) is not None:
        unlink_file(dst_fd, NODE_FILE)  # now the whole dataset
    if raw is not None:
        body: str | bytes = raw  # byte for byte as listed: it may be checksummed too
    else:
        body = json.dumps({"version": 1, "format": "folder", "staged_from": str(s),
                           "shards": [{"file": n, "bytes": v[0], "sha256": v[2]}
                                      for n, v in sorted(state.done.items())]}, indent=1)
    write_text_atomic(MANIFEST, body, dir_fd=dst_fd, tmp_dir_fd=tmp_fd)
    os.fsync(dst_fd)


def _copy_one(source: Any, dst_fd: int, tmp_fd: int, e: FileEntry, verify: str,
              dst: Path) -> tuple[int, str, os.stat_result]:
    """Copy (the source's `fill`: fsynced and checked), rename: every name in DST walked
    beneath its descriptor, no link followed. Returns (bytes, sha256 of the copy, its
    stat). Raises StageError naming the file when the source changes, vanishes or is not
    what the manifest says, DST holds a link on its way, or verification fails."""
    with source.opened(e, verify, dst) as fill:
        tmp = hashlib.sha256(e.name.encode()).hexdigest()[:32] + f".{os.getpid()}.partial"
        try:
            fo = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o666, dir_fd=tmp_fd)
            try:
                n, sha = fill(fo)
                st = os.fstat(fo)
            finally:
                os.close(fo)
            if st.st_size != e.bytes:
                raise StageError(f"{e.name}: the copy is {st.st_size:,} bytes, not {e.bytes:,}")
            _publish_one(dst_fd, tmp_fd, tmp, e, dst)
            return n, sha, st
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=tmp_fd)
            except OSError:
                pass
            raise


def _source(src: str | os.PathLike[str], dst: str | os.PathLike[str], verify: str,
            workers: int, store: Any) -> tuple[Any, Path]:
    """stage()'s arguments checked before anything is touched: what to copy from (a local
    folder, or a storage's conversion for an s3:// SRC) and DST as an absolute path."""
    from autotune_converters.storage import is_s3, open_storage

    if verify not in ("sha256", "size"):
        raise UsageError(f"verify must be sha256 or size, but got {verify!r}.")
    if workers < 1:
        raise UsageError(f"workers must be at least 1, but got {workers}.")
    if is_s3(src):
        if is_s3(dst):
            raise UsageError(f"{dst}: stage copies to local disk; give a local DST.")
        storage = open_storage(src, store=store)
        return StorageSource(storage), Path(dst).absolute()
    s, d = Path(src).absolute(), Path(dst).absolute()
    if not s.is_dir():
        raise UsageError(f"{s}: not a directory.")
    if d == s or s in d.parents:
        raise UsageError(f"{d}: inside the source {s}; stage to another directory.")
    return s, d


def stage(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, workers: int = 4,
          verify: str = "sha256", progress: Progress | None = None,
          on_file: Callable[[str], None] | None = None,
          source_seq_mib_s: float | None = None, node_rank: int | None = None,
          nnodes: int | None = None, store: Any = None) -> StageResult:
    """Stage SRC (a local folder or conversion, or s3://BUCKET/PREFIX: its shards by
    parallel ranged GETs; `store`, its client) into the local DST (see the module doc).
    `on_file(name)` is called as each copy starts. node_rank, nnodes: only the shards
    that node's ranks read (and the manifest). Raises StageError when staging cannot
    start (space, lock, link in DST's work folder), UsageError (UnsafeName) for a
    manifest naming anything outside SRC, StoreDenied / StoreUnreachable for a bucket;
    per-file failures are in the result (partial)."""
    source, d = _source(src, dst, verify, workers, store)
    t0 = time.monotonic()
    existed, begun = d.exists(), (d / WORK).exists()
    try:
        with ExitStack() as fds:
            if isinstance(source, Path):
                source = LocalSource(source)
            fds.callback(source.close)
            entries, manifest, raw = source.entries()
            entries = _node_entries(entries, manifest, source.shown, node_rank, nnodes)
            source.ready(entries)
            dst_fd = _make_dst(d)
            fds.callback(os.close, dst_fd)
            work_fd = _work(d, dst_fd)
            fds.callback(os.close, work_fd)
            fds.enter_context(_lock(d, work_fd))
            tmp_fd = _fresh_tmp(work_fd)
            fds.callback(os.close, tmp_fd)
            state = _State(d, work_fd)
            _withdraw(dst_fd, entries, state)
            todo = [e for e in entries if not state.trusted(dst_fd, e)
                    and not (source.adopts and _adopt(dst_fd, e, state))]
            copied_bytes, failures = _copy_todo(source, todo, workers, verify, d, dst_fd, tmp_fd,
                                                state, on_file, progress)
            wrote_manifest = not failures
            if wrote_manifest:
                _publish(source.shown, dst_fd, tmp_fd, raw, state,
                         (node_rank, nnodes) if node_rank is not None else None, entries)
            remove_tree(work_fd, "tmp")
    except _NoRoom:
        if not begun:
            _leave_as_found(d, existed)
        raise
    return StageResult(source.shown, str(d), len(entries), len(todo) - len(failures),
                       len(entries) - len(todo), copied_bytes, time.monotonic() - t0, verify,
                       sorted(failures, key=lambda f: f.file), wrote_manifest,
                       source_seq_mib_s=source_seq_mib_s, node_rank=node_rank, nnodes=nnodes)


class _NoRoom(StageError):
    """Refused before anything was copied: too little free space in DST."""


def _leave_as_found(d: Path, existed: bool) -> None:
    """A first stage refused before it copied anything removes the work folder it made,
    and DST where it made that (only while empty): nothing is left that reads as a stage
    begun."""
    try:
        fd = open_dir(d)
    except OSError:
        return
    try:
        remove_tree(fd, WORK)
    finally:
        os.close(fd)
    if not existed:
        with contextlib.suppress(OSError):
            d.rmdir()


def _adopt(dst_fd: int, e: FileEntry, state: _State) -> bool:
    st = adopt(dst_fd, e)
    if st is not None:
        state.add(e.name, st.st_size, st.st_mtime_ns, e.sha256)
    return st is not None


def _copy_todo(source: Any, todo: list[FileEntry], workers: int, verify: str, d: Path,
               dst_fd: int, tmp_fd: int, state: _State, on_file: Callable[[str], None] | None,
               progress: Progress | None) -> tuple[int, list[StageFailure]]:
    """The free space checked (nothing copied without it), then `todo` copied."""
    need = sum(e.bytes for e in todo)
    vfs = os.fstatvfs(dst_fd)
    free = vfs.f_bavail * vfs.f_frsize
    if need > free:
        raise _NoRoom(f"{d}: {need / 2**20:,.1f} MiB needed for {len(todo)} file(s), "
                         f"{free / 2**20:,.1f} MiB free; free space or pick another DST. "
                         "Nothing was copied.")
    return _copy_all(todo, need, workers,
                     lambda e: _copy_one(source, dst_fd, tmp_fd, e, verify, d),
                     dst_fd, state, d, on_file, progress)


def _copy_all(todo: list[FileEntry], need: int, workers: int,
              copy: Callable[[FileEntry], tuple[int, str, os.stat_result]], dst_fd: int,
              state: _State, d: Path, on_file: Callable[[str], None] | None,
              progress: Progress | None) -> tuple[int, list[StageFailure]]:
    """Copy `todo` on `workers` threads: (bytes copied, the files that failed)."""
    done_bytes = [0]
    lock = threading.Lock()
    failures: list[StageFailure] = []

    def one(e: FileEntry) -> int:
        if on_file:
            on_file(e.name)
        try:
            n, sha, st = copy(e)
        except StageError as err:
            # Whatever an earlier stage left under this name is not what the source
            # now holds: it goes too (nothing stale under a final name).
            unlink_file(dst_fd, e.name)
            state.drop([e.name])
            reason = str(err)   # named in its own column: not twice
            reason = reason[len(e.name) + 2:] if reason.startswith(f"{e.name}: ") else reason
            with lock:
                failures.append(StageFailure(e.name, reason))
            return 0
        state.add(e.name, st.st_size, st.st_mtime_ns, e.sha256 or sha)
        with lock:
            done_bytes[0] += n
            if progress:
                progress(done_bytes[0], need)
        return n

    try:
        with ThreadPoolExecutor(max_workers=workers) as ex:
            return sum(ex.map(one, todo)), failures
    except OSError as e:
        if e.errno == errno.ENOSPC:  # what a rerun still needs: the files not staged
            free = os.fstatvfs(dst_fd)
            raise StageError(
                f"{d}: no space left on device while copying: "
                f"{(need - done_bytes[0]) / 2**20:,.1f} MiB still to copy, "
                f"{free.f_bavail * free.f_frsize / 2**20:,.1f} MiB free; nothing incomplete "
                "was published; free space and rerun to resume.") from e
        raise
    finally:
        state.save()
