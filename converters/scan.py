"""Streaming scan of a source: an image folder, or a CSV file list, into an on-disk spill.

Memory stays bounded at millions of files: each file found is appended to a records file
on disk (label, size, relative path) and only three 8-byte numbers per file stay in
memory (its shuffle key, its record offset, its size), in compact arrays. Directory
listings are streamed, never sorted: the order of the converted dataset comes from the
seeded hash of each relative path (see `autotune_converters.plan`), so it does not depend on the
order a filesystem lists entries in.

Image folder rules (torchvision's ImageFolder): classes are the sorted names of the
subdirectories of SRC, labels their indices; images are the files below a class directory
(recursively, following symlinks) with an image extension, case-insensitive; hidden
entries (starting with '.') are skipped; other files are ignored (counted). Symlink loops
are cut (a directory that is its own ancestor is reported, not entered); unreadable
directories, broken symlinks, non-regular files (FIFOs, devices) and empty files are
reported in skipped[] with the reason.

File list (`--file-list CSV`): rows `path,label`, paths relative to SRC (or absolute), an
optional header row `path,label`. When every label is a non-negative integer, labels are
those integers and classes are "0".."max"; otherwise classes are the sorted label names.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import stat
import struct
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from autotune_base.errors import ConvertError, UsageError
from autotune_converters.records import SkippedFile
from autotune_converters.source import IMG_EXTENSIONS

RECORD = struct.Struct("<IIQ")  # raw label, path length, size; then the path (fs bytes)
_PROGRESS_EVERY = 4096

ScanProgress = Callable[[int, int], None]  # (files found, bytes found)


@dataclass
class ScanResult:
    """What a scan found; the arrays are per file, in scan order."""

    records: Path  # the spill file
    keys: array  # uint64 shuffle keys
    offsets: array  # uint64 record offsets
    sizes: array  # uint64 file sizes
    classes: list[str]
    label_map: list[int]  # raw label id -> label
    files: int = 0
    bytes: int = 0
    ignored: int = 0  # files without an image extension
    skipped: int = 0
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)


def shuffle_key(seed: int, relpath_bytes: bytes) -> int:
    """The seeded 64-bit key whose ascending order is the dataset's shuffled order."""
    h = hashlib.blake2b(relpath_bytes, digest_size=8, key=seed.to_bytes(8, "little", signed=True))
    return int.from_bytes(h.digest(), "little")


class ScanSink:
    """Receives scanned files and skips; spills records and skip reasons to `workdir`."""

    def __init__(self, workdir: Path, seed: int, on_error: str, root: str) -> None:
        self.records_path = workdir / "records.bin"
        self.skipped_path = workdir / "scan-skipped.jsonl"
        self._rec = open(self.records_path, "wb", buffering=1 << 20)
        self._skp = open(self.skipped_path, "w", encoding="utf-8")
        self.seed = seed
        self.on_error = on_error
        self.root = root
        self.keys, self.offsets, self.sizes = array("Q"), array("Q"), array("Q")
        self.offset = 0
        self.bytes = 0
        self.skipped = 0

    def add(self, raw_label: int, relpath: str, size: int) -> None:
        p = os.fsencode(relpath)
        self.keys.append(shuffle_key(self.seed, p))
        self.offsets.append(self.offset)
        self.sizes.append(size)
        rec = RECORD.pack(raw_label, len(p), size) + p
        self._rec.write(rec)
        self.offset += len(rec)
        self.bytes += size

    def add_nonempty(self, raw_label: int, relpath: str, size: int) -> bool:
        """Add a file, or skip it as empty when it has 0 bytes (a folder's file or a
        bucket's object alike); True when added."""
        if size == 0:
            self.skip(relpath, "empty file (0 bytes)")
            return False
        self.add(raw_label, relpath, size)
        return True

    def skip(self, relpath: str, reason: str, *, error: bool = True) -> None:
        """Record a skipped path; with --on-error fail an `error` stops the scan here."""
        if error and self.on_error == "fail":
            raise ConvertError(SkippedFile(relpath, reason).message(self.root))
        self.skipped += 1
        self._skp.write(json.dumps(SkippedFile(relpath, reason).to_dict(), ensure_ascii=True) + "\n")

    def close(self) -> None:
        for f in (self._rec, self._skp):
            f.flush()
            os.fsync(f.fileno())
            f.close()

    def __len__(self) -> int:
        return len(self.offsets)


def _stat_file(sink: ScanSink, relpath: str, full: str, raw_label: int) -> bool:
    """Stat one candidate image (following symlinks); add it or record why not."""
    try:
        st = os.stat(full)
    except FileNotFoundError:
        reason = "broken symlink (its target does not exist)" if os.path.islink(full) \
            else "missing (no such file)"
        sink.skip(relpath, reason)
        return False
    except OSError as e:
        if e.errno == 40:  # ELOOP
            sink.skip(relpath, "symlink loop (the link resolves to itself)")
        else:
            sink.skip(relpath, f"unreadable ({e.strerror or e})")
        return False
    if not stat.S_ISREG(st.st_mode):
        sink.skip(relpath, "not a regular file (a FIFO, device or directory with an image "
                           "extension)")
        return False
    return sink.add_nonempty(raw_label, relpath, st.st_size)


def list_classes(root: Path) -> list[str]:
    """Sorted class subdirectory names of an image folder (ImageFolder's rule)."""
    if not root.is_dir():
        raise UsageError(f"{root}: not a directory (an image folder is SRC/CLASS/IMAGE.jpg, "
                         "or pass --file-list CSV).")
    try:
        with os.scandir(root) as it:
            classes = sorted(e.name for e in it
                             if not e.name.startswith(".") and _is_dir(e))
    except OSError as e:
        raise UsageError(f"{root}: cannot list ({e.strerror}).") from e
    if not classes:
        raise UsageError(f"{root}: no class subfolders; an image folder is SRC/CLASS/IMAGE.jpg "
                         "(labels are the sorted CLASS names), or pass --file-list CSV.")
    return classes


def _is_dir(e: os.DirEntry) -> bool:
    try:
        return e.is_dir()  # follows symlinks, as ImageFolder does
    except OSError:
        return False


def scan_folder(root: Path, sink: ScanSink, progress: ScanProgress | None = None) -> ScanResult:
    """Scan an image folder into `sink`; returns the ScanResult (sink closed)."""
    t0 = time.monotonic()
    classes = list_classes(root)
    ignored = 0
    empty: list[str] = []
    rootf = os.fspath(root)
    rst = os.stat(rootf)
    for label, cls in enumerate(classes):
        n0 = len(sink)
        # (relative dir, inode keys of its ancestors, SRC included): a symlink back to an
        # ancestor is a loop; the same directory reached by two non-looping paths is
        # scanned twice, as os.walk(followlinks=True) in ImageFolder would.
        stack: list[tuple[str, tuple[tuple[int, int], ...]]] = [
            (cls, ((rst.st_dev, rst.st_ino),))]
        while stack:
            rel, ancestors = stack.pop()
            full = os.path.join(rootf, rel)
            try:
                st = os.stat(full)
                it = os.scandir(full)
            except OSError as e:
                sink.skip(rel + "/", f"unreadable directory ({e.strerror or e})")
                continue
            ino = (st.st_dev, st.st_ino)
            if ino in ancestors:
                it.close()
                sink.skip(rel + "/", "directory loop (a symlink points back to a directory "
                                     "above it; not followed)", error=False)
                continue
            chain = ancestors + (ino,)
            with it:
                for e in it:
                    name = e.name
                    if name.startswith("."):
                        continue
                    relp = f"{rel}/{name}"
                    if _is_dir(e):
                        stack.append((relp, chain))
                    elif name.lower().endswith(IMG_EXTENSIONS):
                        _stat_file(sink, relp, e.path, label)
                        if progress and len(sink) % _PROGRESS_EVERY == 0:
                            progress(len(sink), sink.bytes)
                    else:
                        ignored += 1
        if len(sink) == n0:
            empty.append(cls)
    return folder_result(sink, classes, time.monotonic() - t0, ignored, empty)


def folder_result(sink: ScanSink, classes: list[str], seconds: float, ignored: int,
                  empty: list[str]) -> ScanResult:
    """A class-folder scan's result (a local folder's or a bucket's): the sink closed, the
    files it ignored, and a warning naming the class folders left without a sample."""
    sink.close()
    res = _result(sink, classes, list(range(len(classes))), seconds)
    res.ignored = ignored
    if empty:
        shown = ", ".join(empty[:5]) + (f" and {len(empty) - 5} more" if len(empty) > 5 else "")
        res.warnings.append(f"{len(empty)} class folder(s) without usable images ({shown}); "
                            "their labels are kept but no sample has them.")
    return res


def scan_file_list(csv_path: Path, root: Path, sink: ScanSink,
                   progress: ScanProgress | None = None) -> ScanResult:
    """Scan the files named by a `path,label` CSV (paths relative to `root`)."""
    t0 = time.monotonic()
    label_ids: dict[str, int] = {}
    rootf = os.fspath(root)
    try:
        f = open(csv_path, newline="", encoding="utf-8", errors="surrogateescape")
    except OSError as e:
        raise UsageError(f"{csv_path}: cannot read the file list ({e.strerror}).") from e
    lineno = 0
    with f:
        try:
            for lineno, row in enumerate(csv.reader(f), start=1):
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if len(row) < 2 or not row[0]:
                    raise UsageError(f"{csv_path}:{lineno}: expected `path,label`, got {row!r}.")
                path, label = row[0], row[1].strip()
                if lineno == 1 and path.strip().lower() in ("path", "file", "filename") \
                        and label.lower() in ("label", "class", "target"):
                    continue  # header row
                raw = label_ids.setdefault(label, len(label_ids))
                _stat_file(sink, path, os.path.join(rootf, path), raw)
                if progress and len(sink) % _PROGRESS_EVERY == 0:
                    progress(len(sink), sink.bytes)
        except csv.Error as e:
            raise UsageError(f"{csv_path}:{lineno + 1}: cannot read the row ({e}); give one "
                             "`path,label` per line.") from None
    if not label_ids:
        raise UsageError(f"{csv_path}: no `path,label` rows.")
    names = list(label_ids)
    if all(n.isdigit() for n in names):
        # Integer labels keep their values: the user's label 7 stays label 7.
        classes = [str(i) for i in range(max(int(n) for n in names) + 1)]
        label_map = [int(n) for n in names]
    else:
        classes = sorted(names)
        index = {n: i for i, n in enumerate(classes)}
        label_map = [index[n] for n in names]
    sink.close()
    return _result(sink, classes, label_map, time.monotonic() - t0)


# Integer labels are class indices: the classes 0..max are made, one name each, so the
# largest label sets the memory. Far above any real label set (ImageNet-21k: 21,841).
MAX_INT_LABEL = 1_000_000


def check_file_list(path: str | os.PathLike[str]) -> None:
    """Refuse, before the scan, the labels of a `path,label` file list that the scan would
    choke on: when every label is a number (the labels are then class indices), one above
    MAX_INT_LABEL (a range of that many class names is built) or one that `str.isdigit`
    takes for a number but is no 0-9 decimal ('²'); and a row the csv module cannot read.
    Reads the file as a stream; the scan's own errors (missing file, no rows) stay its."""
    numeric, too_big, not_decimal = True, None, None
    try:
        f = open(path, newline="", encoding="utf-8", errors="surrogateescape")
    except OSError:
        return   # the scan says so, with the file's name
    with f:
        lineno = 0
        try:
            for lineno, row in enumerate(csv.reader(f), start=1):
                if len(row) < 2 or (lineno == 1 and row[0].strip().lower() in
                                    ("path", "file", "filename") and row[1].strip().lower()
                                    in ("label", "class", "target")):
                    continue   # the header row, as the scan takes it
                label = row[1].strip()
                if not label.isdigit():
                    numeric = False
                    break   # names: the labels are sorted, no range is built
                if not (label.isascii() and label.isdecimal()):
                    not_decimal = not_decimal or (lineno, label)
                elif too_big is None and (len(label) > 7 or int(label) > MAX_INT_LABEL):
                    too_big = (lineno, label)
        except csv.Error as e:
            raise UsageError(f"{path}:{lineno + 1}: cannot read the row ({e}); give one "
                             "`path,label` per line.") from None
    if numeric and not_decimal:
        ln, label = not_decimal
        raise UsageError(f"{path}:{ln}: label {label!r} is not a decimal number; write "
                         "integer labels with the digits 0-9 (or give every class a name).")
    if numeric and too_big:
        ln, label = too_big
        raise UsageError(f"{path}:{ln}: label {label[:20]}{'...' if len(label) > 20 else ''} "
                         f"is above {MAX_INT_LABEL:,}: integer labels are class indices (classes "
                         "0 to the largest are made); number the classes from 0, or give "
                         "them names.")


def _result(sink: ScanSink, classes: list[str], label_map: list[int], seconds: float) -> ScanResult:
    return ScanResult(records=sink.records_path, keys=sink.keys, offsets=sink.offsets,
                      sizes=sink.sizes, classes=classes, label_map=label_map, files=len(sink),
                      bytes=sink.bytes, skipped=sink.skipped, seconds=seconds)


def read_record(buf, offset: int) -> tuple[int, str, int]:
    """(raw label, relative path, size) of the record at `offset` in a records buffer."""
    raw, n, size = RECORD.unpack_from(buf, offset)
    start = offset + RECORD.size
    return raw, os.fsdecode(bytes(buf[start:start + n])), size
