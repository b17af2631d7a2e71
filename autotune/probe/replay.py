"""Dataset replay: read a sample of the real files, cold, at several concurrencies.

fio measures 4 KiB reads inside one big file; a DataLoader over an image folder opens,
stats and reads thousands of small files, and on network filesystems the per-file
metadata round trips dominate. So the storage ceiling DESIGN.md uses is this replay's
files/s at its best concurrency, not fio's IOPS.

Two passes: fully cold (page cache, dentries and inodes dropped) at every concurrency,
then steady-state (page cache dropped, inodes kept: drop_caches=1) at the two best. A few
seconds of fully cold reads of a sample are spent mostly on the filesystem's metadata
(ext4 reads ahead inode-table blocks, ~24 I/Os per cold open under a cgroup cap, charged
per bio) that a long training run reads once and then keeps; the steady-state figure is
what such a run converges to, and the search's storage ceiling uses it when it exists.
"""

from __future__ import annotations

import itertools
import os
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from autotune.cache import make_cold
from autotune.errors import AutotuneError

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
                        "pass": which}
        return d


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
    with open(path, "rb", buffering=0) as f:
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
               seconds: float) -> ReplayLevel:
    """Read the files whole with `concurrency` threads until done or `seconds` pass."""
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
    return ReplayLevel(
        concurrency=concurrency, files=total[0], bytes=total[1], seconds=elapsed,
        files_per_s=total[0] / elapsed, mib_per_s=total[1] / elapsed / 2**20,
        lat_p50_ms=statistics.median(lats) * 1e3 if lats else 0.0,
        lat_p99_ms=_percentile(lats, 0.99) * 1e3, errors=total[2],
        cut_short=total[0] + total[2] < len(files))


def replay(root: str | os.PathLike[str], *, max_files: int = 2000,
           concurrency: Sequence[int] = DEFAULT_CONCURRENCY, seconds_per_level: float = 10.0,
           seed: int = 0, cold: bool = True, scan_seconds: float = 30.0, steady: bool = True,
           progress: Progress | None = None) -> ReplayResult:
    """Sample up to `max_files` files under `root` and read them at each concurrency,
    dropping their cache before each level so every level starts cold; then (root,
    `steady`) again at the two best concurrencies with the inodes kept."""
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
    method = "warm"
    levels = []
    for c in concurrency:
        if cold:
            method = make_cold(paths)
        if progress:
            progress(f"replay: {len(files)} files at concurrency {c}")
        levels.append(read_level(files, c, seconds_per_level))
    steady_levels: list[ReplayLevel] = []
    if cold and steady and method == "drop_caches":
        for c in sorted(sorted(levels, key=lambda lv: -lv.files_per_s)[:2],
                        key=lambda lv: lv.concurrency):
            make_cold(paths, keep_inodes=True)
            if progress:
                progress(f"replay (steady state, inodes kept): {len(files)} files at "
                         f"concurrency {c.concurrency}")
            steady_levels.append(read_level(files, c.concurrency, seconds_per_level))
    if not cold:
        warnings.append("warm: files were not evicted from the page cache; figures are "
                        "the cache's, not the storage's.")
    errors = sum(lv.errors for lv in levels)
    if errors:
        warnings.append(f"{errors} reads failed (file vanished or unreadable).")
    return ReplayResult(files_sampled=len(files),
                        mean_file_bytes=statistics.fmean(s for _, s in files),
                        cold_method=method, by_concurrency=levels, scan=scan,
                        warnings=warnings, steady=steady_levels)
