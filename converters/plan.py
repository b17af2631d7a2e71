"""The conversion plan: the seeded shuffle and the cut into units, fixed before writing.

Order: ascending seeded 64-bit hash of each file's relative path (`scan.shuffle_key`), so
the same files and seed give the same order whatever the filesystem's listing order, and
class-ordered input never yields whole-class shards.

Units: for WebDataset, shards of about `shard_size` source bytes, at least `readers`
of them (DataLoader workers x ranks each need a shard of their own) and a multiple of
`readers` (so each reader gets the same number of shards); for LMDB, commit batches of
about `shard_size` source bytes and at most 4096 samples (a write transaction holds its
pages in memory until commit, so the batch bounds the parent's memory).

The plan lives in DST/.autotune-convert/plan/: `records.bin` (from the scan), `order.bin`
(record offsets in plan order, little-endian uint64) and `plan.json`. Workers read the
entries of their unit with pread (not a memory map: mapped pages would count in their
RSS and grow with the dataset). A rerun with the same options reuses it,
so a resumed conversion writes exactly the units the first run planned.
"""

from __future__ import annotations

import json
import math
import mmap
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from autotune_converters.records import Entry
from autotune_converters.scan import RECORD, ScanResult, read_record

PLAN_VERSION = 1
LMDB_BATCH_SAMPLES = 4096


@dataclass
class Plan:
    """Where every sample goes. Picklable: workers reopen the files lazily."""

    dir: str
    classes: list[str]
    label_map: list[int]
    bounds: list[int]  # unit k holds plan positions bounds[k] .. bounds[k+1]-1
    unit_sizes: list[int]  # source bytes planned per unit
    num_entries: int
    source: dict[str, Any]  # root, files, bytes
    fingerprint: dict[str, Any]
    planned_bytes: int = 0
    scan_skipped: int = 0
    ignored: int = 0
    warnings: list[str] = field(default_factory=list)
    version: int = PLAN_VERSION

    _fds: Any = field(default=None, repr=False, compare=False)  # (order fd, records fd)
    _pid: int = field(default=0, repr=False, compare=False)

    @property
    def units(self) -> int:
        return len(self.bounds) - 1

    def unit_range(self, unit: int) -> range:
        return range(self.bounds[unit], self.bounds[unit + 1])

    def _open(self) -> None:
        if self._pid == os.getpid() and self._fds is not None:
            return
        self._fds = (os.open(os.path.join(self.dir, "order.bin"), os.O_RDONLY),
                     os.open(os.path.join(self.dir, "records.bin"), os.O_RDONLY))
        self._pid = os.getpid()

    def close(self) -> None:
        if self._fds is not None and self._pid == os.getpid():
            for fd in self._fds:
                os.close(fd)
        self._fds = None

    def entries(self, unit: int) -> Iterator[Entry]:
        """The entries of one unit, in plan order."""
        self._open()
        order_fd, rec_fd = self._fds
        r = self.unit_range(unit)
        offs = np.frombuffer(_pread_all(order_fd, 8 * len(r), 8 * r.start), dtype="<u8")
        for pos, off in zip(r, offs.tolist()):
            head = _pread_all(rec_fd, RECORD.size + 256, off)  # most paths are short
            n = RECORD.unpack_from(head, 0)[1]
            if RECORD.size + n > len(head):
                head = _pread_all(rec_fd, RECORD.size + n, off)
            raw, relpath, size = read_record(head, 0)
            yield Entry(pos, self.label_map[raw], relpath, size)

    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        d["_fds"] = None
        d["_pid"] = 0
        return d

    def content_hash(self) -> str:
        """sha256 of what the plan decides: every entry (label, path, size) in plan order,
        the cut into units, the classes, the skipped files and the options. Two scans of
        the same files with the same options give the same hash, whatever order the
        filesystem listed them in; ranks compare it to be sure they write one plan."""
        import hashlib
        import struct

        h = hashlib.sha256()
        head = {"version": self.version, "classes": self.classes, "bounds": self.bounds,
                "source": self.source, "fingerprint": self.fingerprint,
                "ignored": self.ignored, "scan_skipped": self.scan_skipped}
        h.update(json.dumps(head, sort_keys=True).encode())
        pack = struct.Struct("<IIQ").pack
        order = np.fromfile(os.path.join(self.dir, "order.bin"), dtype="<u8")
        rec_path = os.path.join(self.dir, "records.bin")
        if order.size:
            with open(rec_path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                labels = self.label_map
                for off in order.tolist():
                    raw, n, size = RECORD.unpack_from(buf, off)
                    start = off + RECORD.size
                    h.update(pack(labels[raw], n, size))
                    h.update(buf[start:start + n])
        skp = os.path.join(self.dir, "scan-skipped.jsonl")
        if os.path.exists(skp):
            with open(skp, "rb") as f:
                for line in sorted(f.read().splitlines()):
                    h.update(line + b"\n")
        return h.hexdigest()

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("_fds", "_pid"):
            d.pop(k, None)
        return d

    def save(self) -> None:
        from autotune_base.fsutil import write_json_atomic

        write_json_atomic(Path(self.dir) / "plan.json", self.to_json())

    @classmethod
    def load(cls, plan_dir: Path) -> Plan | None:
        p = plan_dir / "plan.json"
        try:
            d = json.loads(p.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return None  # a damaged plan is rebuilt: it is only a cache of the scan
        if d.get("version") != PLAN_VERSION:
            return None
        d["dir"] = str(plan_dir)
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def shard_count(total_bytes: int, n: int, shard_size: int, readers: int) -> tuple[int, str | None]:
    """How many WebDataset shards, and a warning when the dataset is too small."""
    if n == 0:
        return 0, None
    k = max(math.ceil(total_bytes / shard_size), readers)
    k = math.ceil(k / readers) * readers
    if k > n:
        return n, (f"only {n} samples: fewer than the {readers} readers (DataLoader workers x "
                   f"ranks, --readers) that each need a shard of their own; wrote {n} shards of "
                   "one sample, and readers beyond that will get none. Read with fewer workers "
                   "or pass a smaller --readers.")
    return k, None


def _cut_by_bytes(cum: np.ndarray, k: int) -> list[int]:
    """Boundaries of k units of about equal bytes, each with at least one sample."""
    n = len(cum)
    total = int(cum[-1])
    targets = np.arange(1, k, dtype=np.float64) * (total / k)
    ends = np.searchsorted(cum, targets, side="left") + 1
    bounds = [0]
    for i, e in enumerate(ends.tolist(), start=1):
        lo = bounds[-1] + 1
        hi = n - (k - i)  # leave at least one sample for each later unit
        bounds.append(min(max(int(e), lo), hi))
    bounds.append(n)
    return bounds


def _cut_batches(cum: np.ndarray, batch_bytes: int) -> list[int]:
    """LMDB commit batches: a new batch every `batch_bytes` or LMDB_BATCH_SAMPLES."""
    n = len(cum)
    if n == 0:
        return [0]
    by_bytes = np.searchsorted(cum, np.arange(batch_bytes, int(cum[-1]), batch_bytes,
                                              dtype=np.int64), side="left") + 1
    by_count = np.arange(LMDB_BATCH_SAMPLES, n, LMDB_BATCH_SAMPLES)
    cuts = np.unique(np.concatenate([by_bytes, by_count]))
    cuts = cuts[(cuts > 0) & (cuts < n)]
    return [0, *cuts.tolist(), n]


def make_plan(scan: ScanResult, plan_dir: Path, *, sharded: bool, shard_size: int, readers: int,
              fingerprint: dict[str, Any], source_root: str, dedupe: Any = None) -> Plan:
    """Shuffle the scanned files by their seeded keys and cut them into units: shards
    balanced for `readers` readers when `sharded`, else commit batches of `shard_size`.

    `dedupe(relpath)` is called for a repeated path (a file list naming a file twice);
    the later one is left out.
    """
    keys = np.frombuffer(scan.keys, dtype=np.uint64) if len(scan.keys) else np.zeros(0, np.uint64)
    offsets = np.frombuffer(scan.offsets, dtype=np.uint64) if len(scan.offsets) \
        else np.zeros(0, np.uint64)
    sizes = np.frombuffer(scan.sizes, dtype=np.uint64) if len(scan.sizes) \
        else np.zeros(0, np.uint64)
    order = np.argsort(keys, kind="stable")
    drop = _duplicates(keys, order, offsets, scan.records, dedupe)
    if drop.size:
        order = order[~np.isin(order, drop)]
    n = int(order.size)
    offs = offsets[order]
    cum = np.cumsum(sizes[order].astype(np.int64)) if n else np.zeros(0, np.int64)
    warnings = list(scan.warnings)
    if sharded:
        k, warn = shard_count(int(cum[-1]) if n else 0, n, shard_size, readers)
        if warn:
            warnings.append(warn)
        bounds = _cut_by_bytes(cum, k) if k else [0]
    else:
        bounds = _cut_batches(cum, shard_size)
    with open(plan_dir / "order.bin", "wb") as f:
        f.write(offs.astype("<u8").tobytes())
        f.flush()
        os.fsync(f.fileno())
    ends = np.concatenate([[0], cum])[bounds] if n else np.zeros(1, np.int64)
    plan = Plan(dir=str(plan_dir), classes=scan.classes, label_map=scan.label_map,
                bounds=bounds, unit_sizes=np.diff(ends).astype(int).tolist(), num_entries=n,
                source={"root": source_root, "files": n, "bytes": int(cum[-1]) if n else 0},
                fingerprint=fingerprint, planned_bytes=int(cum[-1]) if n else 0,
                scan_skipped=scan.skipped + int(drop.size), ignored=scan.ignored,
                warnings=warnings)
    plan.save()
    return plan


def _duplicates(keys: np.ndarray, order: np.ndarray, offsets: np.ndarray, records: Path,
                dedupe: Any) -> np.ndarray:
    """Scan indices of repeated paths (equal keys and equal paths), the later of each."""
    if keys.size < 2:
        return np.zeros(0, np.int64)
    ks = keys[order]
    same = np.nonzero(ks[1:] == ks[:-1])[0]
    if not same.size:
        return np.zeros(0, np.int64)
    drop = []
    with open(records, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        for i in same.tolist():
            a, b = int(order[i]), int(order[i + 1])
            pa, pb = read_record(buf, int(offsets[a]))[1], read_record(buf, int(offsets[b]))[1]
            if pa == pb:
                drop.append(max(a, b))
                if dedupe:
                    dedupe(pa)
    return np.asarray(drop, dtype=np.int64)


def _pread_all(fd: int, n: int, off: int) -> bytes:
    """Up to n bytes at off (fewer only at the end of the file)."""
    out = os.pread(fd, n, off)
    while len(out) < n:
        more = os.pread(fd, n - len(out), off + len(out))
        if not more:
            break
        out += more
    return out
