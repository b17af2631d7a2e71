"""DST/manifest.json: what a conversion holds. Written last; its presence means complete.

    {
      "version": 1,
      "format": "wds" | "lmdb",
      "num_samples": 19998, "num_classes": 100, "classes": ["class_0000", ...],
      "shards": [{"file": "shard-000000.tar", "samples": 312, "bytes": 35921920,
                  "sha256": "..."}, ...],          # LMDB: data.mdb, data.idx
      "skipped": [{"path": "class_0003/x.jpg", "reason": "truncated JPEG (...)"}, ...],
      "source": {"root": "/data/train", "files": 20000, "bytes": 1655578112},
      "options": {"format": ..., "seed": 0, "verify": "header", ...},
      "layout": "how keys and values are stored",
      "stats": {"source_bytes_stored": ..., "stored_bytes": ..., "reencoded": 0,
                "bytes_saved": ..., "ignored": 0, "units": 32},  # units: written in
      "created": "2025-01-01T00:00:00Z"
    }

Every shard's "file" is a plain relative path inside the dataset's folder (checked here,
once, for every reader and for `stage`: see autotune_base.beneath.plain_name); a shard of
a format that counts them (the registry's `counted`: WebDataset) also says how many
"samples" it holds, no more than its bytes can hold (the format's `min_sample_bytes`
each), and those counts add up to "num_samples": a manifest edited by hand is refused
here, naming the entry, before anything is sized from it. `stage` writes a "folder"
manifest for a plain folder: only "format" and "shards" (file, bytes, sha256).

The files a manifest lists are checked against the folder when a reader opens it
(`check_files`): present, regular files reached without following a link, of the bytes
listed: one stat each.

Everything but "created" is a function of the input and the options: two conversions of
the same files with the same options have equal manifests apart from that field.
"""

from __future__ import annotations

import errno
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autotune_base.beneath import open_dir, plain_name, read_bytes, stat_regular
from autotune_base.errors import DatasetError, SampleError, UnsafeName, UsageError
from autotune_base.fsutil import fsync_dir, write_json_atomic
from autotune_converters import registry

VERSION = 1
NAME = "manifest.json"


@dataclass
class Manifest:
    format: str
    num_samples: int
    num_classes: int
    classes: list[str]
    shards: list[dict[str, Any]]
    skipped: list[dict[str, str]]
    source: dict[str, Any]
    options: dict[str, Any]
    layout: str = ""
    stats: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    version: int = VERSION

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        # version first: a reader checks it before anything else
        return {"version": d.pop("version"), **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = NAME) -> Manifest:
        if not isinstance(d, dict):
            raise UsageError(f"{where}: not an autotune manifest (a JSON object is expected).")
        v = d.get("version")
        if isinstance(v, int) and not isinstance(v, bool) and v > VERSION:
            raise DatasetError(f"{where}: manifest version {v}, written by a newer autotune; "
                               f"this one reads manifest version {VERSION}: upgrade autotune "
                               "to read it.")
        if v != VERSION:
            raise UsageError(f"{where}: manifest version {v!r}, this autotune reads version "
                             f"{VERSION}; convert the dataset again with this version.")
        need = ("format", "shards") if d.get("format") == "folder" else \
            ("format", "num_samples", "num_classes", "classes", "shards")
        missing = [k for k in need if k not in d]
        if missing:
            raise UsageError(f"{where}: not a complete autotune manifest (missing "
                             f"{', '.join(missing)}); convert again.")
        check_shards(d["shards"], where, d["format"])
        if d["format"] != "folder":
            check_counts(d, where)
        kw = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        kw.setdefault("num_samples", 0)
        kw.setdefault("num_classes", 0)
        kw.setdefault("classes", [])
        kw.setdefault("skipped", [])
        kw.setdefault("source", {})
        kw.setdefault("options", {})
        return cls(**kw)


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def check_shards(shards: Any, where: str, fmt: Any) -> None:
    """Every shard entry usable as it stands, or one UsageError naming the entry: a plain
    relative "file" (UnsafeName otherwise), named once, a byte count, a sha256 string or
    none, and for WebDataset the number of samples."""
    if not isinstance(shards, list):
        raise UsageError(f"{where}: \"shards\" is a {type(shards).__name__}, not a list; "
                         "convert again.")
    seen: set[str] = set()
    for i, sh in enumerate(shards):
        entry = f"shards[{i}]"
        if not isinstance(sh, dict):
            raise UsageError(f"{where}: {entry} is a {type(sh).__name__}, not an object; "
                             "convert again.")
        name = plain_name(sh.get("file"), where, f"{entry}.file")
        if name in seen:
            raise UnsafeName(f"{where}: {entry}.file names {name!r} a second time; convert "
                             "again.")
        seen.add(name)
        bad = [k for k in ("bytes", *(("samples",) if registry.has(fmt, "counted") else ()))
               if not _count(sh.get(k))]
        if bad:
            raise UsageError(f"{where}: {entry} ({name}) has no whole number of "
                             f"{' or '.join(bad)} (got {', '.join(repr(sh.get(k)) for k in bad)}); "
                             "convert again.")
        if not isinstance(sh.get("sha256"), (str, type(None))):
            raise UsageError(f"{where}: {entry} ({name}) has a sha256 that is not a string; "
                             "convert again.")


def check_counts(d: dict[str, Any], where: str) -> None:
    """"num_samples" a whole number and, for a counted format, each shard's "samples"
    within what its bytes can hold and their sum equal to "num_samples" (shards already
    checked by check_shards): UsageError naming the file and the mismatch."""
    n = d["num_samples"]
    if not _count(n):
        raise UsageError(f"{where}: num_samples is {n!r}, not a whole number of samples; "
                         "the manifest was edited or damaged: convert again.")
    fmt = d["format"]
    if not registry.has(fmt, "counted"):
        return
    least = registry.min_sample_bytes(fmt)
    for i, sh in enumerate(d["shards"]):
        if sh["samples"] * least > sh["bytes"]:
            raise UsageError(f"{where}: shards[{i}] ({sh['file']}) lists {sh['samples']:,} "
                             f"samples in {sh['bytes']:,} bytes, more than one per {least:,} "
                             f"bytes (the least a {fmt} sample takes); the manifest was edited "
                             "or damaged: convert again.")
    total = sum(sh["samples"] for sh in d["shards"])
    if total != n:
        raise UsageError(f"{where}: num_samples is {n:,} but its {len(d['shards']):,} shards "
                         f"list {total:,} samples in all; the manifest was edited or damaged: "
                         "convert again.")


def check_files(root: str | os.PathLike[str], shards: list[dict[str, Any]], *,
                unit: str = "files", scope: str = "") -> dict[str, os.stat_result]:
    """Each file `shards` lists (entries of a checked manifest; "bytes" None: any size),
    as it is beneath `root`, the dataset's folder (the user's own path: a link to it is
    theirs): present, a regular file reached without following a link, of the bytes the
    manifest lists. One fstatat each (a name without a directory part). {name: stat};
    SampleError naming the first bad file, how many of the `unit` listed are so, and
    the fix. `scope` follows "listed in manifest.json" in the message."""
    root = Path(root)
    stats: dict[str, os.stat_result] = {}
    bad: dict[str, list[tuple[str, Any]]] = {"missing": [], "link": [], "other": [],
                                             "size": []}
    try:
        fd = open_dir(root)
    except OSError as e:
        raise SampleError(fd_limit(root, e) or f"{root}: cannot be opened as a directory "
                          f"({e.strerror}); pass the dataset's folder.") from None
    try:
        for sh in shards:
            name = sh["file"]
            try:
                st = stats[name] = stat_regular(fd, name)
            except FileNotFoundError:
                bad["missing"].append((name, None))
                continue
            except OSError as e:
                link = e.errno in (errno.ELOOP, errno.ENOTDIR) and "symbolic link" in str(e)
                bad["link" if link else "other"].append((name, e))
                continue
            want = sh.get("bytes")
            if want is not None and st.st_size != want:
                bad["size"].append((name, (st.st_size, want)))
    finally:
        os.close(fd)
    for kind, found in bad.items():
        if not found:
            continue
        name, what = found[0]
        p = root / name
        of = f"{len(found):,} of {len(shards):,} {unit} listed in manifest.json{scope}"
        more = f" ({of})" if len(found) > 1 else ""
        if kind == "missing":
            raise SampleError(f"{p}: missing ({of}); copy (or convert) again.")
        if kind == "link":
            via = "" if what.filename == name else f" on its way ({what.filename})"
            raise SampleError(f"{p}: a symbolic link{via}, not followed{more}; a dataset is "
                              "read only from inside its own folder: replace the link with "
                              "the file itself.")
        if kind == "other":
            raise SampleError(f"{p}: {what.strerror}{more}; a dataset's files must be "
                              "regular files in its folder: replace it with the file itself "
                              "or fix its permissions.")
        have, want = what
        raise SampleError(f"{p}: {have:,} bytes but manifest.json says {want:,}{more}; the "
                          "copy is incomplete or damaged: copy (or convert) again.")
    return stats


def fd_limit(path: str | os.PathLike[str], e: OSError) -> str | None:
    """The message for an open of `path` that failed because this process is out of file
    descriptors (EMFILE, ENFILE): not the file's fault, so no "convert again"; None for
    any other error."""
    if e.errno not in (errno.EMFILE, errno.ENFILE):
        return None
    return (f"{path}: cannot be opened: this process has too many files open ({e.strerror}); "
            "raise `ulimit -n` or close the datasets it no longer uses.")


MANIFEST_LIMIT = 1 << 30  # a manifest larger than this is not one of ours (1 M shards: ~200 MB)


def parse_manifest(raw: bytes | str, where: str) -> Manifest:
    """A manifest from its bytes (as read once: `stage` publishes those same bytes),
    every entry checked (UsageError naming the file and the entry)."""
    try:
        d = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise UsageError(f"{where}: unreadable ({e}); convert again.") from None
    return Manifest.from_dict(d, where)


def read_manifest_bytes(root: str | os.PathLike[str]) -> bytes | None:
    """ROOT/manifest.json's bytes (a regular file, not a link: opened beneath ROOT; at most
    MANIFEST_LIMIT bytes, its size checked first), None when there is none; UsageError
    naming it otherwise."""
    path = Path(root) / NAME
    fd = -1
    try:
        fd = open_dir(root)
        return read_bytes(fd, NAME, MANIFEST_LIMIT)
    except FileNotFoundError:
        return None
    except OSError as e:
        if fd_limit(path, e):
            raise UsageError(fd_limit(path, e)) from None
        if fd < 0:
            raise UsageError(f"{root}: cannot be opened as a directory ({e.strerror}); pass "
                             "the dataset's folder.") from None
        fix = ("replace the link with the file itself" if e.errno == errno.ELOOP
               else "convert again")
        raise UsageError(f"{path}: unreadable ({e.strerror}); {fix}.") from None
    finally:
        if fd >= 0:
            os.close(fd)


def write_manifest(dst: Path, m: Manifest, tmp_dir: Path | None = None) -> Path:
    """Write DST/manifest.json atomically (temporary file, fsync, rename, dir fsync);
    the temporary file in `tmp_dir` (the work folder's, emptied by a rerun) when given."""
    if not m.created:
        m.created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    path = dst / NAME
    write_json_atomic(path, m.to_dict(), indent=1, tmp_dir=tmp_dir)
    fsync_dir(dst)
    return path


def read_manifest(root: str | os.PathLike[str], *, expect_format: str | None = None) -> Manifest:
    """The manifest of a conversion; UsageError (naming the file and the fix) otherwise."""
    path = Path(root) / NAME
    raw = read_manifest_bytes(root)
    if raw is None:
        raise UsageError(f"{path}: missing: {root} is not a complete autotune conversion "
                         "(the manifest is written last); run or resume `autotune convert`.")
    m = parse_manifest(raw, str(path))
    if expect_format and m.format != expect_format:
        raise UsageError(f"{path}: format {m.format!r}, not {expect_format!r}.")
    return m
