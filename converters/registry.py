"""One registry of dataset formats: name -> reader, writer, sniff.

Every place that needs to know the formats reads this: the CLI's `--format` choices,
format detection, the writer `autotune convert` uses, and the format the closed loop
converts to. Adding a format is one module (or folder) plus one `register(...)` line:

    register(Format("toy", reader="mypkg.toy:ToySource", sniff="mypkg.toy:sniff"))

Readers, writers and sniffs are named by import string ("module:attribute", or
"path/to/file.py:attribute"), so that `import autotune_converters` stays light (no torch, no
lmdb) and so that a measurement process can re-create a format registered at run time
(`exported()` -> `register_all(...)` in the child).

    reader   a autotune_converters.source.SampleSource subclass, built as Reader(root)
    writer   a autotune_converters.writer.FormatWriter subclass, or None for a read-only format
    sniff    f(path: Path) -> bool: whether `path` holds this format (cheap: no scan)
    access   how its reader reads storage: "sequential" (large reads of shards: what slow,
             network or throttled storage serves well) or "random" (a read per sample)
    s3_reader  the reader of the same format in a bucket (s3://BUCKET/PREFIX), built as
             Reader(url), or None where the format is read from local paths only
    counted  its manifest's shards each say how many "samples" they hold (checked by
             autotune_converters.manifest: each count within its shard's bytes, and their
             sum equal to "num_samples")
    min_sample_bytes  a counted format's fewest bytes a sample can take in a shard: a
             count over bytes / min_sample_bytes is refused as an edit (WebDataset: 1,024,
             two tar headers, KEY.cls and the image)
    summary  what `--format` help says of it (default: its description)
    per_node   a copy per node (`stage --node-rank`) can hold only the shards that node's
             ranks read (autotune_converters.wds.split); else every node reads it all

An s3:// dataset is resolved by its listing (autotune_converters.objstore: one LIST, cached): the
format a PREFIX/manifest.json names, else folder.
"""

from __future__ import annotations

import errno
import importlib
import importlib.util
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autotune_base.errors import UsageError
from autotune_base.registry import Registry

MANIFEST = "manifest.json"
ACCESS = ("sequential", "random")


@dataclass(frozen=True)
class Format:
    """A dataset format: how to read it, write it, and recognise it on disk."""

    name: str
    reader: str
    sniff: str
    writer: str | None = None
    access: str = "random"
    description: str = ""
    s3_reader: str | None = None
    counted: bool = False
    min_sample_bytes: int = 1
    per_node: bool = False
    summary: str = ""

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"format name must be letters, digits, '-' or '_', but got {self.name!r}.")
        if self.name == "auto":
            raise ValueError("format name 'auto' is reserved: it means 'detect the format'.")
        if self.access not in ACCESS:
            raise ValueError(f"access must be one of {', '.join(ACCESS)}, but got {self.access!r}.")
        if not isinstance(self.min_sample_bytes, int) or self.min_sample_bytes < 1:
            raise ValueError(f"min_sample_bytes must be a positive number of bytes, but got "
                             f"{self.min_sample_bytes!r}.")

    def reader_class(self) -> type:
        return load(self.reader)

    def writer_class(self) -> type:
        if self.writer is None:
            raise UsageError(f"format {self.name} cannot be written (it has no writer); "
                             f"writable formats: {', '.join(names(writable=True))}.")
        return load(self.writer)

    def sniffs(self, path: Path) -> bool:
        return bool(load(self.sniff)(path))


_FORMATS: Registry[Format] = Registry("format")


def register(fmt: Format, *, replace: bool = False) -> Format:
    """Add a format. A name already registered is refused unless `replace`."""
    return _FORMATS.add(fmt.name, fmt, replace=replace,
                        hint="; pass replace=True to override it")


def unregister(name: str) -> None:
    """Remove a format registered at run time (the built-in ones stay)."""
    _FORMATS.remove(name)


def get(name: str) -> Format:
    try:
        return _FORMATS[name]
    except KeyError:
        raise UsageError(f"format must be one of {', '.join(choices())}, but got {name!r}.",
                         setting="format") from None


def has(name: Any, attribute: str) -> bool:
    """Whether the registered format `name` says `attribute` (False for a name not
    registered, or not a name: a manifest of an unknown format)."""
    f = _FORMATS.get(name) if isinstance(name, str) else None
    return bool(getattr(f, attribute)) if f is not None else False


def min_sample_bytes(name: Any) -> int:
    """The registered format's `min_sample_bytes` (1 for a name not registered)."""
    f = _FORMATS.get(name) if isinstance(name, str) else None
    return f.min_sample_bytes if f is not None else 1


def names(*, writable: bool | None = None, access: str | None = None) -> tuple[str, ...]:
    """Registered format names (in registration order), filtered."""
    return tuple(f.name for f in _FORMATS.values()
                 if (writable is None or (f.writer is not None) == writable)
                 and (access is None or f.access == access))


def help_text(*, writable: bool | None = None) -> str:
    """The `--format` help: each format's name and summary, in registration order."""
    return "; ".join(f"{f.name}: {f.summary or f.description}" for f in _FORMATS.values()
                     if writable is None or (f.writer is not None) == writable)


def choices(*, writable: bool | None = None) -> tuple[str, ...]:
    """What `--format` accepts: 'auto' and every registered name (writers: no 'auto')."""
    return names(writable=True) if writable else ("auto", *names(writable=writable))


def manifest_format(path: Path) -> str | None:
    """The format a conversion's manifest.json names, None without one; UsageError for a
    manifest that cannot be read."""
    from autotune_base.beneath import open_dir, read_bytes

    m = Path(path) / MANIFEST
    if not m.is_file():
        return None
    try:  # beneath the folder, not through a link; its size checked first
        fd = open_dir(path)
        try:
            raw = read_bytes(fd, MANIFEST, 1 << 30)
        finally:
            os.close(fd)
        fmt = json.loads(raw).get("format")
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UsageError(f"{m}: unreadable (a symbolic link, not followed); replace "
                             "the link with the file itself.") from None
        raise UsageError(f"{m}: cannot be read ({e.strerror or e}); fix its permissions, or "
                         "pass --format folder to read the directory as an image folder.",
                         setting="format") from None
    except (ValueError, AttributeError) as e:
        raise UsageError(f"{m}: not a readable autotune manifest ({e}); pass --format "
                         "folder to read the directory as an image folder.",
                         setting="format") from e
    return fmt if isinstance(fmt, str) else repr(fmt)


def detect(path: str | os.PathLike[str]) -> str:
    """The format of `path`: what its manifest says, else the first registered format
    whose sniff recognises it (the folder format last: it takes any directory)."""
    if _is_s3(path):
        return _resolve_s3(str(path), "auto")
    p = Path(path)
    named = manifest_format(p)
    if named is not None:
        if named not in _FORMATS:
            raise UsageError(f"{p / MANIFEST}: unknown format {named!r} (known: "
                             f"{', '.join(names())}); pass --format explicitly.",
                             setting="format")
        return named
    order = [f for f in _FORMATS.values() if f.name != "folder"]
    order += [f for f in _FORMATS.values() if f.name == "folder"]
    for f in order:
        if f.writer is None and f.sniffs(p):
            return f.name
    return "folder"


def _is_s3(path: str | os.PathLike[str]) -> bool:
    return isinstance(path, str) and path.startswith("s3://")


def _resolve_s3(url: str, format: str) -> str:
    """The format of an s3:// dataset, from its (cached) listing."""
    from autotune_converters.objstore import S3Config, Store, parse

    u = parse(url)
    store = Store(S3Config.from_env())
    listing = store.listing(u)
    manifest = next((o for o in listing.objects if o.key == u.key(MANIFEST)), None)
    if format == "auto":
        if manifest is None:
            format = "folder"
        else:
            try:
                format = str(json.loads(store.get(u.bucket, manifest)).get("format"))
            except (ValueError, AttributeError) as e:
                raise UsageError(f"{u.url(manifest.key)}: not a readable autotune manifest "
                                 f"({e}); pass --format folder.", setting="format") from e
    f = get(format)
    if f.s3_reader is None:
        can = ", ".join(n for n, g in _FORMATS.items() if g.s3_reader) or "none"
        raise UsageError(f"{url}: format {format} cannot be read from object storage yet "
                         f"(formats that can: {can}); stage it to a local directory first.",
                         setting="format")
    return format


def resolve(path: str | os.PathLike[str], format: str = "auto") -> str:
    """The format to read `path` with; UsageError when it is unknown, missing, or not what
    `path` holds, without scanning the dataset (an s3:// one: by its listing)."""
    if format != "auto":
        get(format)
    if _is_s3(path):
        return _resolve_s3(str(path), format)
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{p}: no such file or directory.")
    fmt = detect(p) if format == "auto" else format
    f = _FORMATS[fmt]
    if f.writer is not None and not (p / MANIFEST).is_file():
        # Writers publish manifest.json last: without it the conversion is not complete.
        raise UsageError(f"{p}: format {fmt} needs the manifest.json that `autotune convert` "
                         "writes last; this directory is not a complete conversion (rerun "
                         "`autotune convert` to finish it).")
    if format != "auto" and not f.sniffs(p):
        raise UsageError(f"{p}: does not hold format {fmt} ({f.description or 'its sniff says no'}).",
                         setting="format")
    return fmt


def open_source(path: str | os.PathLike[str], format: str = "auto") -> Any:
    """The SampleSource for a dataset directory ('auto': the manifest's format, else the
    first format that recognises it, else folder). Raises UsageError for a missing path,
    an unknown format, or a directory that does not hold it."""
    fmt = resolve(path, format)
    f = _FORMATS[fmt]
    src = (load(f.s3_reader) if _is_s3(path) and f.s3_reader else f.reader_class())(path)
    if src.format != fmt:
        raise UsageError(f"{path}: read as format {src.format}, not {fmt}.", setting="format")
    return src


def load(spec: str) -> Any:
    """'package.module:attr' or 'path/to/file.py:attr' -> the attribute."""
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise ValueError(f"expected 'module:attribute', but got {spec!r}.")
    if target.endswith(".py") or os.sep in target:
        path = Path(target).resolve()
        name = f"autotune_user_{path.stem}_{abs(hash(str(path))):x}"
        module = sys.modules.get(name)
        if module is None:
            mspec = importlib.util.spec_from_file_location(name, path)
            if mspec is None or mspec.loader is None:
                raise ImportError(f"cannot load {path} as a Python file")
            module = importlib.util.module_from_spec(mspec)
            sys.modules[name] = module
            try:
                mspec.loader.exec_module(module)
            except BaseException:
                # A module that failed half-way must not be found by the next load.
                del sys.modules[name]
                raise
    else:
        module = importlib.import_module(target)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ImportError(f"{target} has no attribute {attr!r}") from None


def exported() -> list[dict[str, Any]]:
    """Formats registered at run time, as dicts another process can `register_all`."""
    return [asdict(f) for n, f in _FORMATS.items() if n not in _FORMATS.builtin]


def register_all(specs: list[dict[str, Any]]) -> None:
    """Register what `exported()` gave (in a measurement process)."""
    for d in specs:
        register(Format(**d), replace=True)


def _builtin(fmt: Format) -> None:
    register(fmt)
    _FORMATS.builtin.add(fmt.name)


# -- the built-in formats: one line each ------------------------------------------------
_builtin(Format("folder", reader="autotune_converters.folder:FolderSource", sniff="autotune_converters.folder:sniff",
                description="an image folder DATASET/CLASS/IMAGE.jpg",
                s3_reader="autotune_converters.folder:S3FolderSource"))
_builtin(Format("lmdb", reader="autotune_converters.lmdb.reader:LmdbSource", sniff="autotune_converters.lmdb:sniff",
                writer="autotune_converters.lmdb.writer:LmdbWriter", access="random",
                description="one LMDB environment with manifest.json (autotune convert)",
                summary="one LMDB environment (random access)"))
_builtin(Format("wds", reader="autotune_converters.wds.reader:WdsSource", sniff="autotune_converters.wds:sniff",
                writer="autotune_converters.wds.writer:WdsWriter", access="sequential",
                description="WebDataset tar shards with manifest.json (autotune convert)",
                s3_reader="autotune_converters.wds.bucket:S3WdsSource", counted=True,
                min_sample_bytes=1024, per_node=True,
                summary="WebDataset tar shards (sequential reading, best on slow or network "
                        "storage)"))

__all__ = ["ACCESS", "Format", "MANIFEST", "choices", "detect", "exported", "get", "has", "help_text", "load",
           "manifest_format", "min_sample_bytes", "names", "open_source", "register", "register_all",
           "resolve", "unregister"]
