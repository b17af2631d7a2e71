"""Dataset replay: read a sample of the real files, cold, at several concurrencies.

fio measures 4 KiB reads inside one big file; a DataLoader over an image folder opens,
stats and reads thousands of small files, and on network filesystems the per-file
metadata round trips dominate. So the storage ceiling DESIGN.md uses is this replay's
files/s at its best concurrency, not fio's IOPS.

Two passes: fully cold (page cache, dentries and inodes dropped) at every concurrency,
then steady-state at the two best: the inodes of every sampled file loaded first and held
(an O_PATH descriptor each, as a run that has listed and read its files once keeps them,
and safe from a neighbour's drop_caches), then the page
cache dropped with the inodes kept (drop_caches=1), then each file opened and read whole.
A few seconds of fully cold reads of a sample are spent mostly on the filesystem's
metadata: ext4 reads ahead inode_readahead_blks (32) inode-table blocks for a cold inode,
one bio per block, and a cgroup cap charges each bio, so a sampled file whose inode-table
window is cold costs up to 33 charged reads (a 1 KiB-block ext4 holds 4 inodes a block,
so a random sample of a few hundred files hits a cold window nearly every time). A long
run pays that once per window and then keeps the inodes; without loading them first the
"steady" pass read mostly files whose inodes the short cold pass had never touched, and
behind a 100-IOPS cap measured ~20 files/s where a plain reader gets ~100. The
steady-state figure is what such a run converges to, and the search's storage ceiling
uses it when it exists. Each level counts the reads it issued (`iocount`): behind a cap,
the bios the cap charged, so its I/Os per file say what the cap serves.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import resource
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from autotune_base.fsutil import open_noatime

from autotune.blockdev import block_device_for
from autotune.cache import make_cold
from autotune.errors import AutotuneError
from autotune.probe.iocount import read_counter

DEFAULT_CONCURRENCY = (1, 4, 16, 64)
_SKIP_PREFIXES = (".autotune-probe-",)  # our own scratch area is not dataset

Progress = Callable[[str], None]


@dataclass
class ScanStats:
    files_seen: int = 0
    dirs_seen: int = 0
    unreadable: int = 0
    seconds: float = 0.0
    truncated: bool = False  # the scan budget ran out: sampled from what was seen


@dataclass
class ReplayLevel:
    """Reads at one concurrency."""

    concurrency: int
    files: int
    bytes: int
    seconds: float
    files_per_s: float
    mib_per_s: float
    lat_p50_ms: float
    lat_p99_ms: float
    errors: int = 0
    cut_short: bool = False  # the time budget ended the level before the sample did
    ios_per_file: float | None = None  # reads issued per file read (ReplayResult.io_source)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ReplayResult:
    files_sampled: int
    mean_file_bytes: float
    cold_method: str
    by_concurrency: list[ReplayLevel]
    scan: ScanStats = field(default_factory=ScanStats)
    warnings: list[str] = field(default_factory=list)
    # Page cache dropped, inodes kept (root only; empty when not measured).
    steady: list[ReplayLevel] = field(default_factory=list)
    steady_inode_seconds: float | None = None  # loading every sampled inode before it
    steady_inodes_held: int = 0  # of them, held open (O_PATH) through the steady pass
    io_source: str | None = None  # what ios_per_file counts (None: not counted)

    @property
    def best(self) -> ReplayLevel:
        """The fully cold pass's best level."""
        return max(self.by_concurrency, key=lambda lv: lv.files_per_s)

    @property
    def best_steady(self) -> ReplayLevel | None:
        return max(self.steady, key=lambda lv: lv.files_per_s) if self.steady else None

    @property
    def ceiling(self) -> tuple[ReplayLevel, str]:
        """The level the storage ceiling uses, and which pass it comes from."""
        st = self.best_steady
        if st is not None:
            return st, "steady-state"
        return self.best, "cold" if self.cold_method != "warm" else "warm"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["best_concurrency"] = self.best.concurrency
        d["best_files_per_s"] = self.best.files_per_s
        lv, which = self.ceiling
        d["ceiling"] = {"files_per_s": lv.files_per_s, "concurrency": lv.concurrency,
                        "pass": which, "seconds": lv.seconds,
                        "ios_per_file": lv.ios_per_file, "io_source": self.io_source,
                        "method": self.ceiling_method}
        return d

    @property
    def ceiling_method(self) -> str:
        """How the ceiling's level was read, in words (the probe's JSON carries it)."""
        lv, which = self.ceiling
        read = (f"{lv.files} files each opened (O_NOATIME) and read whole (1 MiB read() "
                f"calls) by {lv.concurrency} threads for {lv.seconds:.1f} s")
        if which == "steady-state":
            return (f"steady state: the inodes of all {self.files_sampled} sampled files "
                    f"loaded ({self.steady_inodes_held} held open, O_PATH), then "
                    "drop_caches=1 (page cache dropped, inodes kept); " + read)
        how = {"drop_caches": "drop_caches=3 (page cache, dentries and inodes dropped)",
               "fadvise": "posix_fadvise(DONTNEED) per file (inodes kept)"}
        return f"{which}: {how.get(self.cold_method, self.cold_method)}; " + read


def _walk(root: str, skip_dirs: set[str], stats: ScanStats) -> Iterator[tuple[str, int]]:
    """Regular files under root, in a deterministic order, never following symlinks
    (so symlink loops cannot trap the scan); unreadable directories are counted."""
    stack = [root]
    while stack:
        d = stack.pop()
        stats.dirs_seen += 1
        try:
            with os.scandir(d) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            stats.unreadable += 1
            continue
        subdirs = []
        for e in entries:
            if e.name.startswith(_SKIP_PREFIXES):
                continue
            try:
                if e.is_dir(follow_symlinks=False):
                    if e.path not in skip_dirs:
                        subdirs.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    size = e.stat(follow_symlinks=False).st_size
                    if size > 0:
                        yield e.path, size
            except OSError:
                stats.unreadable += 1
        stack.extend(reversed(subdirs))


def sample_files(root: str | os.PathLike[str], n: int, *, seed: int = 0,
                 scan_seconds: float = 30.0) -> tuple[list[tuple[str, int]], ScanStats]:
    """Up to `n` (path, size) pairs drawn uniformly from the files under `root`
    (reservoir sampling: one pass, memory bounded by n whatever the dataset's size)."""
    if n < 1:
        raise AutotuneError(f"replay file count must be at least 1, but got {n}.")
    root = os.fspath(root)
    stats = ScanStats()
    rng = random.Random(seed)
    t0 = time.monotonic()
    if os.path.isfile(root):
        st = os.stat(root)
        stats.files_seen = 1
        return [(root, st.st_size)], stats
    reservoir: list[tuple[str, int]] = []
    for i, item in enumerate(_walk(root, set(), stats)):
        stats.files_seen += 1
        if i < n:
            reservoir.append(item)
        else:
            j = rng.randint(0, i)
            if j < n:
                reservoir[j] = item
        if (i & 255) == 0 and time.monotonic() - t0 > scan_seconds:
            stats.truncated = True
            break
    stats.seconds = time.monotonic() - t0
    rng.shuffle(reservoir)
    return reservoir, stats


def _read_whole(path: str, buf: bytearray) -> int:
    n = 0
    mv = memoryview(buf)
    # No atime write: after a cache drop it reads the inode-table block back in (ext4's
    # inode readahead: up to 33 bios a cap charges for one file), which a job's steady
    # state (one atime update a day) never pays.
    with open(open_noatime(path), "rb", buffering=0) as f:
        while True:
            k = f.readinto(mv)
            if not k:
                return n
            n += k


def _percentile(xs: Sequence[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def read_level(files: Sequence[tuple[str, int]], concurrency: int,
               seconds: float, reads: Callable[[], int | None] | None = None) -> ReplayLevel:
    """Read the files whole with `concurrency` threads until done or `seconds` pass;
    `reads` (a running count of reads issued to their disk) gives the I/Os per file."""
    ios0 = reads() if reads else None
    counter = itertools.count()
    lock = threading.Lock()
    lats: list[float] = []
    total = [0, 0, 0]  # files, bytes, errors
    t0 = time.monotonic()
    deadline = t0 + seconds
    last_done = [t0]

    def worker() -> None:
        buf = bytearray(1 << 20)
        my_lats, nf, nb, ne = [], 0, 0, 0
        while time.monotonic() < deadline:
            i = next(counter)
            if i >= len(files):
                break
            s = time.monotonic()
            try:
                nb += _read_whole(files[i][0], buf)
                nf += 1
                e = time.monotonic()
                my_lats.append(e - s)
            except OSError:
                ne += 1
                e = time.monotonic()
        with lock:
            lats.extend(my_lats)
            total[0] += nf
            total[1] += nb
            total[2] += ne
            last_done[0] = max(last_done[0], time.monotonic())

    with ThreadPoolExecutor(max_workers=concurrency) as ex:
        for fut in [ex.submit(worker) for _ in range(concurrency)]:
            fut.result()
    elapsed = max(last_done[0] - t0, 1e-9)
    ios1 = reads() if reads else None
    per_file = ((ios1 - ios0) / total[0] if ios0 is not None and ios1 is not None
                and total[0] else None)
    return ReplayLevel(
        concurrency=concurrency, files=total[0], bytes=total[1], seconds=elapsed,
        files_per_s=total[0] / elapsed, mib_per_s=total[1] / elapsed / 2**20,
        lat_p50_ms=statistics.median(lats) * 1e3 if lats else 0.0,
        lat_p99_ms=_percentile(lats, 0.99) * 1e3, errors=total[2],
        cut_short=total[0] + total[2] < len(files), ios_per_file=per_file)


@contextlib.contextmanager
def pinned_inodes(paths: Sequence[str]) -> Iterator[tuple[int, float]]:
    """Load the inode of every path and hold it (an O_PATH descriptor each: an inode in
    use survives anyone's drop_caches, such as a neighbour's benchmark) for the body;
    yields (inodes held, seconds the loading took). Vanished paths are skipped; past the
    descriptor limit the rest are loaded but not held."""
    want = len(paths) + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    fds: list[int] = []
    t0 = time.monotonic()
    try:
        for p in paths:
            try:
                fds.append(os.open(p, os.O_PATH))
            except OSError:  # vanished, or out of descriptors: load it at least
                with contextlib.suppress(OSError):
                    os.stat(p)
        yield len(fds), time.monotonic() - t0
    finally:
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def replay(root: str | os.PathLike[str], *, max_files: int = 2000,
           concurrency: Sequence[int] = DEFAULT_CONCURRENCY, seconds_per_level: float = 10.0,
           seed: int = 0, cold: bool = True, scan_seconds: float = 30.0, steady: bool = True,
           steady_seconds: float | None = None,
           progress: Progress | None = None) -> ReplayResult:
    """Sample up to `max_files` files under `root` and read them at each concurrency,
    dropping their cache before each level so every level starts cold; then (root,
    `steady`) again at the two best concurrencies for `steady_seconds` (default
    `seconds_per_level`) with the sample's inodes loaded and kept."""
    for c in concurrency:
        if c < 1:
            raise AutotuneError(f"replay concurrency must be at least 1, but got {c}.")
    if progress:
        progress(f"scanning {root} for up to {max_files} files")
    files, scan = sample_files(root, max_files, seed=seed, scan_seconds=scan_seconds)
    if not files:
        raise AutotuneError(f"{root}: no non-empty regular files to replay "
                            f"({scan.dirs_seen} directories, {scan.unreadable} unreadable).")
    warnings = []
    if scan.truncated:
        warnings.append(f"scan stopped after {scan_seconds:g} s at {scan.files_seen} files; "
                        "the sample is drawn from those.")
    if scan.unreadable:
        warnings.append(f"{scan.unreadable} files or directories could not be read.")
    paths = [p for p, _ in files]
    counter = read_counter(block_device_for(files[0][0]))
    reads = counter[0] if counter else None
    method = "warm"
    levels = []
    for c in concurrency:
        if cold:
            method = make_cold(paths)
        if progress:
            progress(f"replay: {len(files)} files at concurrency {c}")
        levels.append(read_level(files, c, seconds_per_level, reads))
    result = ReplayResult(files_sampled=len(files),
                          mean_file_bytes=statistics.fmean(s for _, s in files),
                          cold_method=method, by_concurrency=levels, scan=scan,
                          warnings=warnings, io_source=counter[1] if counter else None)
    if cold and steady and method == "drop_caches":
        _steady_pass(result, files, steady_seconds or seconds_per_level, reads, progress)
    elif cold and steady:
        warnings.append("steady-state pass not run: it needs drop_caches (root and a "
                        "writable /proc/sys); the page cache was evicted file by file "
                        "(posix_fadvise), which keeps inodes and directory entries (the scan "
                        "loaded them), so every level read data only, as a long run's steady "
                        "state does; a first epoch's metadata reads are not in these figures")
    if not cold:
        warnings.append("warm: files were not evicted from the page cache; figures are "
                        "the cache's, not the storage's.")
    errors = sum(lv.errors for lv in levels)
    if errors:
        warnings.append(f"{errors} reads failed (file vanished or unreadable).")
    return result


def _steady_pass(result: ReplayResult, files: Sequence[tuple[str, int]], seconds: float,
                 reads: Callable[[], int | None] | None, progress: Progress | None) -> None:
    """The steady-state levels at the cold pass's two best concurrencies: every sampled
    inode loaded and held (else the pass reads the files the short cold pass never opened,
    each paying its inode-table window again), then the page cache dropped, inodes kept."""
    paths = [p for p, _ in files]
    if progress:
        progress(f"replay (steady state): loading the inodes of {len(files)} files")
    with pinned_inodes(paths) as (held, took):
        result.steady_inode_seconds = took
        result.steady_inodes_held = held
        for c in sorted(sorted(result.by_concurrency, key=lambda lv: -lv.files_per_s)[:2],
                        key=lambda lv: lv.concurrency):
            make_cold(paths, keep_inodes=True)
            if progress:
                progress(f"replay (steady state, inodes kept): {len(files)} files at "
                         f"concurrency {c.concurrency}")
            result.steady.append(read_level(files, c.concurrency, seconds, reads))
