"""`convert SRC s3://BUCKET/PREFIX`: a conversion published into a bucket as files are by rename.

The conversion is made in a local work folder by autotune_converters.conversion (resumable per
unit as always), then each output file is uploaded -- through the storage
(autotune_converters.storage.s3), multipart through its client when it is large, its
parts read from the file -- with its sha256 in the object's metadata, and manifest.json
is PUT last: a PUT makes an object visible whole or not at all, so a reader that finds
the manifest finds every shard it names complete, as a renamed file is. The manifest's
sha256 checksums are the local conversion's, byte for byte (an ETag is not a checksum).

Killed and rerun: the local conversion resumes; an object already in the bucket with the
file's size and sha256 metadata is kept; multipart uploads a killed run left under the
names being written are aborted (listed first), so no part lingers, billed and unseen.
A bucket whose manifest.json says the same conversion is complete is left as it is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune_base.errors import SampleError, UsageError
from autotune_converters.manifest import NAME as MANIFEST
from autotune_converters.manifest import Manifest, parse_manifest
from autotune_converters.objstore.client import S3Config, Store
from autotune_converters.objstore.url import S3Url, parse
from autotune_converters.storage.s3 import S3Storage

MULTIPART_AT = 64 << 20   # files this large go up in parts
PART = 16 << 20           # bytes per part (S3: at least 5 MiB but the last)
META = "sha256"           # x-amz-meta-sha256: the file's checksum, to resume by


@dataclass
class UploadResult:
    uploaded: int = 0         # files PUT by this run
    kept: int = 0             # already in the bucket with this size and sha256
    bytes_uploaded: int = 0
    aborted: list[str] = field(default_factory=list)  # stale multipart uploads removed
    seconds: float = 0.0      # this run's upload, the manifest's PUT included
    work_was_complete: bool = False  # the local conversion was complete before this run


def remote_manifest(store: Store, url: S3Url) -> Manifest | None:
    """The bucket's manifest.json at the prefix, or None when there is none."""
    storage = S3Storage(url, store=store)
    try:
        raw = storage.read(MANIFEST)
    except SampleError:
        return None
    return parse_manifest(raw, storage.where(MANIFEST))


def _files(local: Path, m: Manifest) -> list[tuple[str, int, str | None]]:
    """(name, bytes, sha256 or None) of what the local conversion published, the manifest
    left out (it goes last); names from the manifest (checked by its loader) first."""
    listed = {s["file"]: (int(s["bytes"]), s.get("sha256")) for s in m.shards}
    out = [(n, b, h) for n, (b, h) in sorted(listed.items())]
    for p in sorted(local.iterdir()):  # e.g. an LMDB's index beside data.mdb
        if p.name not in listed and p.name != MANIFEST and not p.name.startswith(".") \
                and p.is_file() and not p.is_symlink():
            out.append((p.name, p.stat().st_size, None))
    return out


def _sha256(path: Path) -> str:
    from autotune_base.fsutil import sha256_file

    return sha256_file(path)[1]


def abort_stale(store: Store, url: S3Url, names: set[str]) -> list[str]:
    """Abort the multipart uploads in progress for these names below the prefix (a killed
    run's); the keys aborted."""
    cut = len(url.list_prefix)
    page = store.call(f"LIST uploads {url}", url.bucket, lambda c: c.list_multipart_uploads(
        Bucket=url.bucket, Prefix=url.list_prefix))
    gone = []
    for u in page.get("Uploads", []):
        if u["Key"][cut:] in names:
            store.call(url.url(u["Key"]), url.bucket, lambda c, u=u: c.abort_multipart_upload(
                Bucket=url.bucket, Key=u["Key"], UploadId=u["UploadId"]))
            gone.append(u["Key"])
    return gone


def _present(store: Store, url: S3Url, name: str, size: int, sha: str) -> bool:
    head = S3Storage(url, store=store).head(name)
    return head is not None and int(head.get("ContentLength", -1)) == size and \
        head.get("Metadata", {}).get(META) == sha


def upload_file(store: Store, url: S3Url, path: Path, name: str, sha: str) -> int:
    """PUT (or multipart-upload) one file as PREFIX/name with its sha256 in metadata."""
    key, size = url.key(name), path.stat().st_size
    if size < MULTIPART_AT:
        S3Storage(url, store=store).write_atomic(name, path.read_bytes(), **{META: sha})
        return size
    up = store.call(url.url(key), url.bucket, lambda c: c.create_multipart_upload(
        Bucket=url.bucket, Key=key, Metadata={META: sha}))["UploadId"]
    try:
        parts = []
        with open(path, "rb") as f:
            for i, off in enumerate(range(0, size, PART), start=1):
                data = os.pread(f.fileno(), PART, off)
                r = store.call(f"{url.url(key)} part {i}", url.bucket,
                               lambda c, d=data, i=i: c.upload_part(
                                   Bucket=url.bucket, Key=key, UploadId=up, PartNumber=i, Body=d))
                parts.append({"PartNumber": i, "ETag": r["ETag"]})
        store.call(url.url(key), url.bucket, lambda c: c.complete_multipart_upload(
            Bucket=url.bucket, Key=key, UploadId=up, MultipartUpload={"Parts": parts}))
    except BaseException:
        try:  # no half-made upload left behind (a kill is cleaned by the next run)
            store.client.abort_multipart_upload(Bucket=url.bucket, Key=key, UploadId=up)
        except Exception:  # noqa: BLE001 (the first error is the one to report)
            pass
        raise
    return size


def publish(store: Store, url: S3Url, local: Path, m: Manifest, *, workers: int = 4,
            on_file: Callable[[str], None] | None = None) -> UploadResult:
    """Upload the local conversion `local` (manifest `m`) to `url`, manifest.json last."""
    t0 = time.monotonic()
    files = _files(local, m)
    res = UploadResult(aborted=abort_stale(store, url, {n for n, _, _ in files} | {MANIFEST}))
    lock = threading.Lock()

    def one(item: tuple[str, int, str | None]) -> None:
        name, size, sha = item
        sha = sha or _sha256(local / name)
        if _present(store, url, name, size, sha):
            with lock:
                res.kept += 1
            return
        if on_file:
            on_file(name)
        n = upload_file(store, url, local / name, name, sha)
        with lock:
            res.bytes_uploaded += n
            res.uploaded += 1

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="s3put") as ex:
        list(ex.map(one, files))
    raw = (local / MANIFEST).read_bytes()
    S3Storage(url, store=store).write_atomic(MANIFEST, raw, content_type="application/json",
                                             **{META: hashlib.sha256(raw).hexdigest()})
    res.seconds = round(time.monotonic() - t0, 3)
    return res


def default_work_dir(dst: str) -> Path:
    """Where the local conversion for a bucket DST is made (the user's cache); a
    UsageError naming --work-dir where the process has no home (user_cache_dir)."""
    from autotune_base.fsutil import user_cache_dir

    base = user_cache_dir()
    if base is None:
        raise UsageError(f"{dst}: no folder to convert in before the upload: HOME is not set "
                         "and this uid has no passwd entry; give --work-dir DIR (local disk "
                         "with room for the converted copy), or set HOME or XDG_CACHE_HOME.",
                         setting="work_dir")
    return base / "autotune" / f"convert-{hashlib.sha256(dst.encode()).hexdigest()[:16]}"


def convert_to_bucket(src: str | os.PathLike[str], dst: str, opts: Any, *,
                      work_dir: str | os.PathLike[str] | None = None, progress: Any = None,
                      store: Store | None = None, keep_local: bool = False) -> Any:
    """Convert SRC into s3://BUCKET/PREFIX (see the module doc); a ConvertResult whose
    dst is the bucket's address. The local work folder is removed once the manifest is
    PUT (kept with keep_local)."""
    from autotune_converters import conversion

    url = parse(dst)
    st = store or Store(S3Config.from_env())
    root = str(parse(str(src))) if conversion._is_s3(src) else os.path.abspath(src)
    fl = os.path.abspath(opts.file_list) if opts.file_list else None
    fp = dataclasses.replace(opts, file_list=fl).fingerprint(root)  # as prepare() makes it
    m = remote_manifest(st, url)
    if m is not None:
        if m.options != fp:
            raise UsageError(conversion._differs(Path(str(url)), "a complete conversion",
                                                 m.options, fp))
        return _as_remote(conversion._complete_result(Path("."), m), url)
    local = Path(work_dir) if work_dir else default_work_dir(str(url))
    # No free-space check: DST is a bucket (the local work folder is a cache of the
    # upload, not the destination the user chose; a full disk there stops it resumably).
    res = conversion.convert(src, local, opts, progress=progress, check_space=False)
    up = publish(st, url, local, conversion.read_manifest(local))
    if not keep_local:
        shutil.rmtree(local, ignore_errors=True)
    if res.already_complete:
        # The local work folder was complete (a run killed during its upload), but the
        # bucket had no manifest: this run published it (at least the manifest's PUT), so
        # "already complete: nothing to do" is false; its time is the upload's.
        res.already_complete = False
        res.seconds, up.work_was_complete = up.seconds, True
    res = _as_remote(res, url)
    res.upload = dataclasses.asdict(up)
    return res


def _as_remote(res: Any, url: S3Url) -> Any:
    res.dst = str(url)
    res.manifest = url.url(url.key(MANIFEST))
    return res


__all__ = ["UploadResult", "abort_stale", "convert_to_bucket", "default_work_dir", "publish",
           "remote_manifest", "upload_file"]
