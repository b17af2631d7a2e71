"""DST/manifest.json: what a conversion holds. Written last; its presence means complete.

    {
      "version": 1,
      "format": "wds" | "lmdb",
      "num_samples": 19998, "num_classes": 100, "classes": ["class_0000", ...],
      "shards": [{"file": "shard-000000.tar", "samples": 312, "bytes": 35921920,
                  "sha256": "..."}, ...],          # LMDB: one entry, data.mdb
      "skipped": [{"path": "class_0003/x.jpg", "reason": "truncated JPEG (...)"}, ...],
      "source": {"root": "/data/train", "files": 20000, "bytes": 1655578112},
      "options": {"format": ..., "seed": 0, "verify": "header", ...},
      "layout": "how keys and values are stored",
      "stats": {"source_bytes_read": ..., "stored_bytes": ..., "reencoded": 0},
      "created": "2025-01-01T00:00:00Z"
    }

Everything but "created" is a function of the input and the options: two conversions of
the same files with the same options have equal manifests apart from that field.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from converters.errors import UsageError
from converters.fsutil import fsync_dir, write_json_atomic

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
        if v != VERSION:
            raise UsageError(f"{where}: manifest version {v!r}, this autotune reads version "
                             f"{VERSION}; convert the dataset again with this version.")
        missing = [k for k in ("format", "num_samples", "num_classes", "classes", "shards")
                   if k not in d]
        if missing:
            raise UsageError(f"{where}: not a complete autotune manifest (missing "
                             f"{', '.join(missing)}); convert again.")
        kw = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        kw.setdefault("skipped", [])
        kw.setdefault("source", {})
        kw.setdefault("options", {})
        return cls(**kw)


def write_manifest(dst: Path, m: Manifest) -> Path:
    """Write DST/manifest.json atomically (temporary file, fsync, rename, dir fsync)."""
    if not m.created:
        m.created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    path = dst / NAME
    write_json_atomic(path, m.to_dict(), indent=1)
    fsync_dir(dst)
    return path


def read_manifest(root: str | os.PathLike[str], *, expect_format: str | None = None) -> Manifest:
    """The manifest of a conversion; UsageError (naming the file and the fix) otherwise."""
    path = Path(root) / NAME
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path}: missing: {root} is not a complete autotune conversion "
                         "(the manifest is written last); run or resume `autotune convert`."
                         ) from None
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: unreadable ({e}); convert again.") from None
    m = Manifest.from_dict(d, str(path))
    if expect_format and m.format != expect_format:
        raise UsageError(f"{path}: format {m.format!r}, not {expect_format!r}.")
    return m
