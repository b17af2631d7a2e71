"""`autotune stage`: copy a dataset to local disk, verified and atomic, resumable.

Every file is copied to a temporary name inside DST, fsynced, verified (its sha256 read
back from the disk after its pages were dropped, against the manifest's), and only then
renamed to its final name; the manifest is copied last, so its presence means the staged
copy is complete. A killed run leaves no file under a final name that is not whole, and a
rerun skips what a previous run verified (recorded in DST/.autotune-stage/state.json).
A lock stops two stagers writing one DST. A source file that changes or vanishes while it
is copied is reported by name; the others finish and the result says partial.

Per node (`node_rank`, `nnodes`): only the WebDataset shards the ranks of that node read
(converters.wds.split: by node first, then local rank, the same every epoch), plus the
whole manifest; DST/node.json (written before the manifest) says which node the copy is
for, and the reader refuses a rank of another node with the command that fixes it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from converters.errors import StageError, UsageError
from converters.fsutil import PidLock, fsync_dir, sha256_file, write_text_atomic

WORK = ".autotune-stage"
MANIFEST = "manifest.json"
CHUNK = 4 << 20

Progress = Callable[[int, int], None]  # (bytes done, bytes total)


@dataclass
class FileEntry:
    name: str          # path relative to SRC (and DST)
    bytes: int
    sha256: str | None  # from the manifest; None for a plain folder (computed on copy)


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
    manifest_written: bool = False
    verify_only: bool = False
    source_seq_mib_s: float | None = None
    node_rank: int | None = None  # a copy for one node: which, of how many
    nnodes: int | None = None

    @property
    def mib_per_s(self) -> float:
        return self.bytes_copied / 2**20 / self.seconds if self.seconds > 0 else 0.0

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


def _sha256_file(path: Path, *, drop_cache: bool = False) -> str:
    return sha256_file(path, drop_cache=drop_cache, chunk=CHUNK)[1]


def _withdraw(d: Path, entries: list[FileEntry], state: _State) -> None:
    """Before a (re-)stage copies anything: the old manifest.json no longer vouches for
    what DST will hold, so it goes first (durably); files an earlier stage put there
    (listed by the old manifest or the stage's own record) that the new source does not
    list are removed. Nothing else in DST is touched. The new manifest is published last,
    only when every file is verified."""
    mp = d / MANIFEST
    ours = set(state.done)
    if mp.exists():
        try:
            ours |= {str(sh["file"]) for sh in json.loads(mp.read_text()).get("shards", [])}
        except (OSError, ValueError, TypeError, KeyError):
            pass  # an unreadable manifest vouches for nothing: it goes all the same
        mp.unlink()
        fsync_dir(d)
    keep = {e.name for e in entries}
    gone = sorted(ours - keep)
    for rel in gone:
        p = (d / rel).resolve()
        if d.resolve() in p.parents and p.is_file():
            p.unlink()
    state.drop(gone)


def list_source(src: Path) -> tuple[list[FileEntry], dict[str, Any] | None]:
    """The files to stage: the manifest's shards when SRC is a conversion, else every
    regular file under SRC (no symlinks followed), hashes computed while copying."""
    mpath = src / MANIFEST
    if mpath.is_file():
        try:
            m = json.loads(mpath.read_text())
            entries = [FileEntry(s["file"], int(s["bytes"]), s.get("sha256")) for s in m["shards"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise StageError(f"{mpath}: not a readable autotune manifest ({e}); convert again "
                             "or stage the folder without it.") from e
        return entries, m
    entries = []
    for dirpath, dirs, files in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d not in (WORK,))
        for name in sorted(files):
            p = Path(dirpath) / name
            if p.is_symlink() or not p.is_file():
                continue
            entries.append(FileEntry(str(p.relative_to(src)), p.stat().st_size, None))
    return entries, None


def _node_entries(entries: list[FileEntry], manifest: dict[str, Any] | None, src: Path,
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
    if manifest is None or manifest.get("format") != "wds":
        what = "a plain folder" if manifest is None else f"a {manifest.get('format')} conversion"
        raise UsageError(f"{src}: {what}; a copy per node splits WebDataset shards (every node "
                         "reads all of anything else): stage it whole.",
                         setting=("node_rank", "nnodes"))
    from converters.wds.split import node_shards

    mine = node_shards(entries, node_rank, nnodes)
    if not mine:
        raise UsageError(f"{src}: {len(entries)} shards for {nnodes} nodes: node {node_rank} "
                         "would read none; use fewer nodes or convert with more shards "
                         "(--readers).", setting=("node_rank", "nnodes"))
    return mine


def _staged_node(dst: Path) -> tuple[int, int] | None:
    from converters.wds.split import NODE_FILE

    try:
        d = json.loads((dst / NODE_FILE).read_text())
        return int(d["node_rank"]), int(d["nnodes"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _lock(dst: Path) -> PidLock:
    return PidLock(dst / WORK / "lock", lambda holder: StageError(
        f"{dst}: another `autotune stage` (pid {holder}) is writing here; wait for it or "
        "pick another DST."))


class _State:
    """Files verified by earlier runs: name -> [bytes, mtime_ns, sha256]."""

    def __init__(self, dst: Path) -> None:
        self.path = dst / WORK / "state.json"
        self.lock = threading.Lock()
        try:
            self.done: dict[str, list] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.done = {}
        self._dirty = 0

    def trusted(self, dst: Path, e: FileEntry) -> bool:
        rec = self.done.get(e.name)
        if not rec:
            return False
        try:
            st = (dst / e.name).stat()
        except OSError:
            return False
        return rec[0] == st.st_size == e.bytes and rec[1] == st.st_mtime_ns and \
            (e.sha256 is None or rec[2] == e.sha256)

    def add(self, name: str, size: int, mtime_ns: int, sha: str | None) -> None:
        with self.lock:
            self.done[name] = [size, mtime_ns, sha]
            self._dirty += 1
            if self._dirty >= 16:
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
        write_text_atomic(self.path, json.dumps(self.done), durable=False)
        self._dirty = 0


def _copy_one(src: Path, dst: Path, e: FileEntry, verify: str, tmpdir: Path) -> tuple[int, str | None]:
    """Copy, fsync, verify, rename. Returns (bytes, sha256 of the copy). Raises StageError
    naming the file when the source changes or vanishes, or verification fails."""
    sp, final = src / e.name, dst / e.name
    try:
        st0 = sp.stat()
    except FileNotFoundError:
        raise StageError(f"{e.name}: vanished from the source before it was copied") from None
    if st0.st_size != e.bytes:
        raise StageError(f"{e.name}: source is {st0.st_size:,} bytes, the manifest says "
                         f"{e.bytes:,}; the source changed after conversion: convert again")
    tmp = tmpdir / (e.name.replace("/", "%") + f".{os.getpid()}.partial")
    h = hashlib.sha256()
    n = 0
    try:
        fi = open(sp, "rb")
    except OSError as err:  # permission denied, an I/O error: this file, not the stage
        raise StageError(f"{e.name}: cannot read the source ({err.strerror or err}); "
                         "fix its permissions or remove it, then rerun") from None
    try:
        with fi, open(tmp, "wb") as fo:
            while True:
                b = fi.read(CHUNK)
                if not b:
                    break
                h.update(b)
                fo.write(b)
                n += len(b)
            fo.flush()
            os.fsync(fo.fileno())
        try:
            st1 = sp.stat()
        except FileNotFoundError:
            raise StageError(f"{e.name}: vanished from the source while it was copied") from None
        if (st1.st_size, st1.st_mtime_ns) != (st0.st_size, st0.st_mtime_ns) or n != st0.st_size:
            raise StageError(f"{e.name}: changed in the source while it was copied ({st0.st_size:,} "
                             f"-> {st1.st_size:,} bytes); nothing was published for it")
        src_sha = h.hexdigest()
        if e.sha256 and src_sha != e.sha256:
            raise StageError(f"{e.name}: source sha256 {src_sha[:12]}… does not match the "
                             f"manifest's {e.sha256[:12]}…: the source is corrupt or changed; "
                             "convert again")
        sha = src_sha
        if verify == "sha256":
            got = _sha256_file(tmp, drop_cache=True)
            if got != src_sha:
                raise StageError(f"{e.name}: the copy on {dst} reads back as sha256 {got[:12]}…, "
                                 f"not {src_sha[:12]}…: the destination disk corrupted it")
        elif tmp.stat().st_size != e.bytes:
            raise StageError(f"{e.name}: the copy is {tmp.stat().st_size:,} bytes, not {e.bytes:,}")
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, final)
        fsync_dir(final.parent)
        return n, sha
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def verify_staged(dst: str | os.PathLike[str], *, src: str | os.PathLike[str] | None = None) -> StageResult:
    """Re-hash every staged file against the manifest (`--verify-only`); mismatching or
    missing files are named, and forgotten by the resume state so a rerun repairs them."""
    d = Path(dst)
    t0 = time.monotonic()
    entries, manifest = list_source(Path(src) if src else d)
    node = _staged_node(d)
    if node is not None:
        entries = _node_entries(entries, manifest, Path(src) if src else d, *node)
    state = _State(d) if (d / WORK).is_dir() else None
    failures = []
    nbytes = 0
    for e in entries:
        p = d / e.name
        if not p.is_file():
            failures.append(StageFailure(e.name, "missing from the staged copy"))
            continue
        got = _sha256_file(p, drop_cache=True)
        nbytes += p.stat().st_size
        if e.sha256 and got != e.sha256:
            failures.append(StageFailure(e.name, f"sha256 {got[:12]}… does not match the manifest's "
                                         f"{e.sha256[:12]}…: corrupt; rerun `autotune stage` to repair"))
            if state:
                state.drop([e.name])
    return StageResult(str(src or d), str(d), len(entries), 0, len(entries) - len(failures),
                       nbytes, time.monotonic() - t0, "sha256", failures,
                       manifest_written=(d / MANIFEST).is_file(), verify_only=True,
                       node_rank=node[0] if node else None, nnodes=node[1] if node else None)


def _publish(s: Path, d: Path, manifest: Any, state: _State,
             want_node: tuple[int, int] | None, entries: list[FileEntry]) -> None:
    """Which copy this is (node.json), then the manifest, last: it means complete."""
    from converters.wds.split import NODE_FILE

    if want_node is not None:
        write_text_atomic(d / NODE_FILE, json.dumps(
            {"node_rank": want_node[0], "nnodes": want_node[1],
             "shards": [e.name for e in entries]}, indent=1))
    elif (d / NODE_FILE).exists():
        (d / NODE_FILE).unlink()  # now the whole dataset
    if manifest is not None:
        body = (s / MANIFEST).read_text()  # byte for byte: it may be checksummed too
    else:
        body = json.dumps({"version": 1, "format": "folder", "staged_from": str(s),
                           "shards": [{"file": n, "bytes": v[0], "sha256": v[2]}
                                      for n, v in sorted(state.done.items())]}, indent=1)
    write_text_atomic(d / MANIFEST, body)
    fsync_dir(d)


def _checked(src: str | os.PathLike[str], dst: str | os.PathLike[str], verify: str,
             workers: int) -> tuple[Path, Path]:
    """stage()'s arguments checked before anything is touched: SRC and DST as absolute paths."""
    if verify not in ("sha256", "size"):
        raise UsageError(f"verify must be sha256 or size, but got {verify!r}.")
    if workers < 1:
        raise UsageError(f"workers must be at least 1, but got {workers}.")
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
          nnodes: int | None = None) -> StageResult:
    """Stage SRC into DST (see the module doc). `on_file(name)` is called as each copy
    starts. node_rank, nnodes: only the shards that node's ranks read (and the manifest).
    Raises StageError when staging cannot start (space, lock, bad manifest);
    per-file failures are in the result (partial)."""
    s, d = _checked(src, dst, verify, workers)
    t0 = time.monotonic()
    entries, manifest = list_source(s)
    entries = _node_entries(entries, manifest, s, node_rank, nnodes)
    want_node = (node_rank, nnodes) if node_rank is not None else None
    d.mkdir(parents=True, exist_ok=True)
    with _lock(d):
        tmpdir = d / WORK / "tmp"
        shutil.rmtree(tmpdir, ignore_errors=True)  # partial copies of a killed run
        tmpdir.mkdir(parents=True)
        state = _State(d)
        _withdraw(d, entries, state)
        todo = [e for e in entries if not state.trusted(d, e)]
        need = sum(e.bytes for e in todo)
        free = shutil.disk_usage(d).free
        if need > free:
            raise StageError(f"{d}: {need / 2**20:,.1f} MiB needed for {len(todo)} file(s), "
                             f"{free / 2**20:,.1f} MiB free; free space or pick another DST. "
                             "Nothing was copied.")
        done_bytes = [0]
        lock = threading.Lock()
        failures: list[StageFailure] = []

        def one(e: FileEntry) -> int:
            if on_file:
                on_file(e.name)
            try:
                n, sha = _copy_one(s, d, e, verify, tmpdir)
            except StageError as err:
                # Whatever an earlier stage left under this name is not what the source
                # now holds: it goes too (nothing stale under a final name).
                (d / e.name).unlink(missing_ok=True)
                state.drop([e.name])
                with lock:
                    failures.append(StageFailure(e.name, str(err)))
                return 0
            st = (d / e.name).stat()
            state.add(e.name, st.st_size, st.st_mtime_ns, e.sha256 or sha)
            with lock:
                done_bytes[0] += n
                if progress:
                    progress(done_bytes[0], need)
            return n

        try:
            with ThreadPoolExecutor(max_workers=workers) as ex:
                copied_bytes = sum(ex.map(one, todo))
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise StageError(f"{d}: disk full while copying ({need / 2**20:,.1f} MiB needed); "
                                 "nothing incomplete was published; free space and rerun to "
                                 "resume.") from e
            raise
        finally:
            state.save()
        wrote_manifest = not failures
        if wrote_manifest:
            _publish(s, d, manifest, state, want_node, entries)
        shutil.rmtree(tmpdir, ignore_errors=True)
    return StageResult(str(s), str(d), len(entries), len(todo) - len(failures),
                       len(entries) - len(todo), copied_bytes, time.monotonic() - t0, verify,
                       sorted(failures, key=lambda f: f.file), wrote_manifest,
                       source_seq_mib_s=source_seq_mib_s, node_rank=node_rank, nnodes=nnodes)
