"""An S3 client for datasets: lazy per process, retried, pinned to ETags, errors in one line.

    store = Store(S3Config.from_env(endpoint_url))      # picklable: no client inside yet
    listing = store.listing(parse("s3://bucket/train"))  # one paginated LIST, cached
    data = store.get(obj)                                # GET If-Match obj.etag

- The boto3 client is made on first use in the process that uses it, and again after a
  fork (DataLoader workers fork after the dataset is built; a client, its connection pool
  and any native runtime must never cross a fork). boto3 clients are thread-safe, the
  session that makes one is not: one client per process, made under a lock.
- What a client is made from is warmed once and inherited across fork: botocore's JSON
  service model, endpoint rules and partitions (parsing them is about 90 % of a client's
  ~0.2-1 s start-up) are cached in one botocore Loader per process (`_LOADER`), which the
  first client fills. A worker forked after the dataset was built (its LIST made the
  parent's client) makes its own client from the inherited cache in ~15 ms. The cache is
  plain parsed data, no socket: nothing live crosses the fork. Under spawn or forkserver a
  worker starts with an empty cache and fills its own (correct, only slower).
- S3-compatible servers (an endpoint is given) are addressed path-style, with a region
  (AWS_REGION / AWS_DEFAULT_REGION, else us-east-1) to sign with.
- botocore's own retries are off; this layer retries 500/502/503/504, SlowDown and
  throttling codes, timeouts and dropped connections with full-jitter exponential backoff
  (`attempts` in all), so that its counting and its error are one place.
- Every GET carries If-Match: the object's ETag from the listing, so an object changed
  after the LIST is an error (SampleError naming it), never a mix of two versions.
- `client="obstore"` (S3Config; AUTOTUNE_S3_CLIENT=obstore) makes `get` use obstore
  (about a fifth of boto3's CPU per GET: docs/integrations/object-storage.md); LIST,
  `open` and uploads stay boto3. obstore's runtime does not survive a fork: a process
  forked from one that used it hangs on its first request, even with a store made after
  the fork. So a process that was forked after obstore was used raises a one-line
  UsageError instead (use the DataLoader's multiprocessing_context="spawn" or
  "forkserver", or the boto3 client).
- Errors: no bucket / access denied / bad keys -> StoreDenied (exit 2) naming the endpoint,
  the bucket and the server's code; no answer or retries exhausted -> StoreUnreachable
  (exit 1). The access key and the secret are scrubbed from every message.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

from autotune_base.errors import SampleError, StoreDenied, StoreUnreachable, UsageError
from autotune_base.fsutil import pwrite_all
from autotune_converters.objstore.url import S3Url, shown_endpoint

T = TypeVar("T")
STREAM_CHUNK = 1 << 20  # bytes of a GET's body held at a time by get_into

RETRY_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
               "RequestTimeTooSkewed", "InternalError", "ServiceUnavailable", "503", "500",
               "502", "504"}
DENIED_CODES = {"NoSuchBucket", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                "AllAccessDisabled", "InvalidBucketName", "AccountProblem", "403", "404",
                "PermanentRedirect", "AuthorizationHeaderMalformed"}


@dataclass(frozen=True)
class S3Config:
    """Where and how to reach the store. Picklable (it crosses to DataLoader workers and
    measurement processes; the client never does)."""

    endpoint_url: str | None = None
    region: str = "us-east-1"
    addressing: str = "auto"          # 'path' for S3-compatible servers (auto: path with an endpoint)
    attempts: int = 5                 # tries per request, the first included
    backoff: float = 0.1              # seconds: the first retry's ceiling, doubling
    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    max_pool: int = 64                # connections per process: 64 requests in flight
    client: str = "boto3"             # the GET path: boto3 or obstore (see the module doc)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise UsageError(f"attempts must be at least 1, but got {self.attempts}.")
        if self.addressing not in ("auto", "path", "virtual"):
            raise UsageError(f"addressing must be auto, path or virtual, but got "
                             f"{self.addressing!r}.")
        if self.client not in ("boto3", "obstore"):
            raise UsageError(f"the S3 client must be boto3 or obstore (AUTOTUNE_S3_CLIENT), "
                             f"but got {self.client!r}.")
        if self.endpoint_url and urlsplit(self.endpoint_url).scheme not in ("http", "https"):
            # boto3 raised "Invalid endpoint" from deep inside: an internal error, exit 1.
            raise UsageError(f"the S3 endpoint (--endpoint-url, AWS_ENDPOINT_URL) must be a "
                             f"URL with its scheme, http:// or https://, but got "
                             f"{self.endpoint_url.rsplit('@', 1)[-1]!r} (any user:password "
                             "left out).")

    @classmethod
    def from_env(cls, endpoint_url: str | None = None, **kw: Any) -> S3Config:
        """--endpoint-url, else AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL; the region from
        AWS_REGION / AWS_DEFAULT_REGION."""
        ep = (endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3")
              or os.environ.get("AWS_ENDPOINT_URL") or None)
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        kw.setdefault("client", os.environ.get("AUTOTUNE_S3_CLIENT") or "boto3")
        return cls(endpoint_url=ep, region=kw.pop("region", region), **kw)

    @property
    def shown(self) -> str:
        return shown_endpoint(self.endpoint_url)


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    etag: str


@dataclass(frozen=True)
class Listing:
    """One LIST of a prefix: its objects (sorted by key) and when it was taken."""

    url: S3Url
    objects: tuple[ObjectInfo, ...]
    listed_at: float                  # time.time() when the LIST began
    seconds: float                    # how long the paginated LIST took
    pages: int

    @property
    def total_bytes(self) -> int:
        return sum(o.size for o in self.objects)


def _get_kwargs(bucket: str, obj: ObjectInfo, byte_range: tuple[int, int] | None
                ) -> dict[str, Any]:
    """A GET of the object (or bytes [start, end) of it), pinned to its ETag."""
    kw: dict[str, Any] = {"Bucket": bucket, "Key": obj.key}
    if obj.etag:
        kw["IfMatch"] = obj.etag
    if byte_range is not None:
        kw["Range"] = f"bytes={byte_range[0]}-{byte_range[1] - 1}"
    return kw


@dataclass
class Store:
    """An object store's client for one process at a time (see the module doc)."""

    config: S3Config = field(default_factory=S3Config)
    retries: int = 0                  # retries made in this process (all requests)

    def __post_init__(self) -> None:
        self._client: Any = None
        self._pid = -1
        self._lock = threading.Lock()
        self._secrets: list[str] = []

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "retries": 0}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.config, self.retries = state["config"], state["retries"]
        self.__post_init__()

    @property
    def client(self) -> Any:
        """This process's boto3 client, made on first use (and anew after a fork)."""
        if self._client is None or self._pid != os.getpid():
            with self._lock:
                if self._client is None or self._pid != os.getpid():
                    self._client = self._make_client()
                    self._pid = os.getpid()
        return self._client

    def _make_client(self) -> Any:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise UsageError("s3:// datasets need boto3: pip install 'autotune-loader[s3]'."
                             ) from None
        c = self.config
        style = c.addressing if c.addressing != "auto" else ("path" if c.endpoint_url else "virtual")
        session = boto3.session.Session(botocore_session=_botocore_session())
        creds = session.get_credentials()
        if creds is not None:  # what must never be printed (a key of a few letters, as
            # test servers take, cannot be hidden without mangling every word holding it)
            frozen = creds.get_frozen_credentials()
            self._secrets = [s for s in (frozen.access_key, frozen.secret_key, frozen.token)
                             if s and len(s) >= 6]
        return session.client(
            "s3", endpoint_url=c.endpoint_url, region_name=c.region,
            config=Config(s3={"addressing_style": style}, retries={"total_max_attempts": 1},
                          connect_timeout=c.connect_timeout, read_timeout=c.read_timeout,
                          max_pool_connections=c.max_pool))

    # -- requests ------------------------------------------------------------------------

    def call(self, what: str, bucket: str, fn: Callable[[Any], T]) -> T:
        """fn(client), retried on what a busy or slow store answers; errors in one line.
        `what` names the request in messages (e.g. 's3://b/k' or 'LIST s3://b/p')."""
        c = self.config
        last = ""
        for attempt in range(c.attempts):
            if attempt:
                self.retries += 1
                time.sleep(random.uniform(0, c.backoff * 2 ** (attempt - 1)))
            try:
                return fn(self.client)
            except Exception as e:  # noqa: BLE001 (sorted below; the rest re-raised)
                kind, last = self._classify(e, what, bucket)
                if kind != "retry":
                    raise
        raise StoreUnreachable(self._scrub(
            f"{c.shown}: {what}: no good answer after {c.attempts} attempts (last: {last}); "
            "check --endpoint-url / AWS_ENDPOINT_URL and the network, or retry later."))

    def _classify(self, e: Exception, what: str, bucket: str) -> tuple[str, str]:
        """('retry', why) for a transient failure; raises the one-line error for the rest."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
        from urllib3.exceptions import HTTPError as Urllib3Error

        if isinstance(e, ClientError):
            err = e.response.get("Error", {})
            code = str(err.get("Code") or e.response.get("ResponseMetadata", {})
                       .get("HTTPStatusCode", "?"))
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in RETRY_CODES or status in (500, 502, 503, 504):
                return "retry", f"{status} {code}"
            raise self._refusal(what, bucket, code, status, str(err.get("Message") or "")
                                ) from None
        if isinstance(e, NoCredentialsError):
            raise StoreDenied(f"{self.config.shown}: bucket {bucket}: no credentials (set "
                              "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)."
                              ) from None
        if isinstance(e, (BotoCoreError, OSError, Urllib3Error)):  # timeouts, refused, dropped
            return "retry", self._scrub(f"{type(e).__name__}: {e}")
        raise e

    def _refusal(self, what: str, bucket: str, code: str, status: Any, message: str) -> Exception:
        ep = self.config.shown
        if code == "PreconditionFailed" or status == 412:
            return SampleError(f"{what}: changed since the dataset was listed (If-Match on "
                               f"its ETag refused: {code}); list it again (rerun).")
        if code in ("NoSuchKey", "InvalidRange") or (status == 404 and code != "NoSuchBucket"
                                                     and "/" in what):
            return SampleError(f"{what}: {code} at {ep} (deleted since the dataset was "
                               "listed?); rerun to list it again.")
        if code in DENIED_CODES or status in (401, 403, 404):
            fix = ("check the bucket name" if code in ("NoSuchBucket", "404", "InvalidBucketName")
                   else "check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE) and the "
                        "bucket's policy")
            return StoreDenied(self._scrub(f"{ep}: bucket {bucket}: {code} ({message or status}); "
                                           f"{fix}."))
        return StoreUnreachable(self._scrub(f"{ep}: {what}: {status} {code} ({message})."))

    def _scrub(self, text: str) -> str:
        # The endpoint's user:password@, which botocore's own messages repeat with the URL.
        ep = urlsplit(self.config.endpoint_url or "")
        if "@" in ep.netloc:
            text = text.replace(ep.netloc.rpartition("@")[0] + "@", "")
            for part in (ep.password, ep.username):
                if part and len(part) >= 6:  # as the keys below: a short word is everywhere
                    text = text.replace(part, "***")
        for s in self._secrets:
            text = text.replace(s, "***")
        return text

    def get(self, bucket: str, obj: ObjectInfo, byte_range: tuple[int, int] | None = None) -> bytes:
        """The object's bytes (or bytes [start, end) of it), pinned to its ETag."""
        if self.config.client == "obstore":
            return self._obstore_get(bucket, obj, byte_range)
        kw = _get_kwargs(bucket, obj, byte_range)
        # The body is read inside the retry: a connection dropped mid-body is retried too.
        return self.call(f"s3://{bucket}/{obj.key}", bucket,
                         lambda c: c.get_object(**kw)["Body"].read())

    def get_into(self, bucket: str, obj: ObjectInfo, byte_range: tuple[int, int] | None,
                 fd: int, offset: int) -> int:
        """As get(), the body written into `fd` from `offset` as it arrives, a chunk
        (STREAM_CHUNK) at a time: memory is a chunk, not the range. A retry writes the
        same bytes at the same offsets again. The bytes written. obstore's reads stay whole."""
        if self.config.client == "obstore":
            return pwrite_all(fd, self._obstore_get(bucket, obj, byte_range), offset)
        kw = _get_kwargs(bucket, obj, byte_range)

        def stream(c: Any) -> int:
            body, n = c.get_object(**kw)["Body"], 0
            try:
                for chunk in body.iter_chunks(STREAM_CHUNK):
                    n += pwrite_all(fd, chunk, offset + n)
            finally:
                body.close()
            return n

        return self.call(f"s3://{bucket}/{obj.key}", bucket, stream)

    def _obstore_get(self, bucket: str, obj: ObjectInfo,
                     byte_range: tuple[int, int] | None) -> bytes:
        import obstore
        from obstore.exceptions import (NotFoundError, PermissionDeniedError, PreconditionError,
                                        UnauthenticatedError)

        store = _obstore_store(self.config, bucket)
        opts: dict[str, Any] = {}
        if obj.etag:
            opts["if_match"] = obj.etag
        if byte_range is not None:
            opts["range"] = byte_range
        what, c, last = f"s3://{bucket}/{obj.key}", self.config, ""
        for attempt in range(c.attempts):
            if attempt:
                self.retries += 1
                time.sleep(random.uniform(0, c.backoff * 2 ** (attempt - 1)))
            try:
                return bytes(obstore.get(store, obj.key, options=opts).bytes())
            except PreconditionError:
                raise SampleError(f"{what}: changed since the dataset was listed (If-Match on "
                                  "its ETag refused); list it again (rerun).") from None
            except (NotFoundError, FileNotFoundError):  # obstore raises the builtin one
                raise SampleError(f"{what}: not found at {c.shown} (deleted since the dataset "
                                  "was listed?); rerun to list it again.") from None
            except (PermissionDeniedError, UnauthenticatedError, PermissionError) as e:
                raise StoreDenied(self._scrub(
                    f"{c.shown}: bucket {bucket}: {type(e).__name__}; check the credentials "
                    "(AWS_ACCESS_KEY_ID, AWS_PROFILE) and the bucket's policy.")) from None
            except Exception as e:  # noqa: BLE001 (obstore's own retries are off: ours count)
                last = self._scrub(f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        raise StoreUnreachable(self._scrub(
            f"{c.shown}: {what}: no good answer after {c.attempts} attempts (last: {last}); "
            "check --endpoint-url / AWS_ENDPOINT_URL and the network, or retry later."))

    def open(self, bucket: str, obj: ObjectInfo) -> Any:
        """A streaming body of the whole object (one GET, pinned to its ETag), for readers
        that consume it sequentially (tar shards); its `.read(n)` and `.close()`."""
        kw: dict[str, Any] = {"Bucket": bucket, "Key": obj.key}
        if obj.etag:
            kw["IfMatch"] = obj.etag
        return self.call(f"s3://{bucket}/{obj.key}", bucket, lambda c: c.get_object(**kw)["Body"])

    def list_pages(self, url: S3Url) -> Iterator[list[ObjectInfo]]:
        """LIST the prefix, a page (up to 1,000 keys) at a time, each page retried."""
        token: str | None = None
        while True:
            kw: dict[str, Any] = {"Bucket": url.bucket, "Prefix": url.list_prefix}
            if token:
                kw["ContinuationToken"] = token
            page = self.call(f"LIST {url}", url.bucket, lambda c, kw=kw: c.list_objects_v2(**kw))
            yield [ObjectInfo(o["Key"], int(o["Size"]), str(o.get("ETag", "")))
                   for o in page.get("Contents", [])]
            token = page.get("NextContinuationToken") if page.get("IsTruncated") else None
            if not token:
                return

    def list(self, url: S3Url) -> Listing:
        """One paginated LIST of the prefix (not cached: see `listing`)."""
        self.client  # made first: its start-up (~0.3 s) is not the LIST's time
        t0, wall = time.perf_counter(), time.time()
        objs: list[ObjectInfo] = []
        pages = 0
        for page in self.list_pages(url):
            objs.extend(page)
            pages += 1
        objs.sort(key=lambda o: o.key)
        return Listing(url, tuple(objs), wall, time.perf_counter() - t0, pages)

    def listing(self, url: S3Url, *, max_age: float = 3600.0) -> Listing:
        """The prefix's listing, from this process's cache when younger than `max_age`
        seconds, else from the file a parent process handed down (LISTINGS_ENV), else one
        fresh LIST: one LIST per dataset however often, and in however many measurement
        processes, it is opened."""
        key = (self.config.endpoint_url, url)
        hit = _LISTINGS.get(key) or _handed_down(self.config.endpoint_url, url)
        if hit is not None and time.time() - hit.listed_at <= max_age:
            _LISTINGS[key] = hit
            return hit
        fresh = self.list(url)
        _LISTINGS[key] = fresh
        return fresh


_LOADER: Any = None  # this process's botocore Loader (parsed models; see the module doc)
_LOADER_LOCK = threading.Lock()


def _botocore_session() -> Any:
    """A new botocore session that reads its data files through this process's one
    Loader, so that each JSON model is parsed once per process and inherited by forks."""
    import botocore.session

    global _LOADER
    session = botocore.session.get_session()
    with _LOADER_LOCK:
        if _LOADER is None:
            _LOADER = session.get_component("data_loader")
        else:
            session.register_component("data_loader", _LOADER)
    return session


# obstore stores of this process, and the pid that first used obstore (inherited by a
# fork: a child whose pid differs was forked after its runtime started, and would hang).
_OBSTORES: dict[tuple[S3Config, str], Any] = {}
_OBSTORE_PID: list[int] = []


def _obstore_store(config: S3Config, bucket: str) -> Any:
    """This process's obstore S3Store for `bucket`, or a UsageError after a fork."""
    if _OBSTORE_PID and _OBSTORE_PID[0] != os.getpid():
        raise UsageError(f"client obstore: this process was forked from pid {_OBSTORE_PID[0]}, "
                         "which had used obstore, whose runtime does not survive a fork; use "
                         "multiprocessing_context='spawn' or 'forkserver', or "
                         "AUTOTUNE_S3_CLIENT=boto3.")
    key = (config, bucket)
    if key not in _OBSTORES:
        try:
            from obstore.store import S3Store
        except ImportError:
            raise UsageError("client obstore needs obstore: pip install obstore (or "
                             "'autotune-loader[s3-clients]'), or AUTOTUNE_S3_CLIENT=boto3."
                             ) from None
        kw: dict[str, Any] = {"region": config.region}
        if config.endpoint_url:
            kw["endpoint"] = config.endpoint_url
        style = config.addressing if config.addressing != "auto" else (
            "path" if config.endpoint_url else "virtual")
        _OBSTORES[key] = S3Store(
            bucket, virtual_hosted_style_request=style == "virtual",
            client_options={"allow_http": bool(config.endpoint_url and config.endpoint_url
                                               .startswith("http://")),
                            "connect_timeout": f"{round(config.connect_timeout * 1000)}ms",
                            "timeout": f"{round(config.read_timeout * 1000)}ms"},
            retry_config={"max_retries": 0}, **kw)
        if not _OBSTORE_PID:
            _OBSTORE_PID.append(os.getpid())
    return _OBSTORES[key]


# A directory of listings a parent process wrote for its children (bench's scratch
# directory): valid for that run only, so a rerun lists again and sees what changed.
LISTINGS_ENV = "AUTOTUNE_S3_LISTINGS"
_LISTINGS: dict[tuple[str | None, S3Url], Listing] = {}


def _listing_file(directory: str, endpoint: str | None, url: S3Url) -> str:
    import hashlib

    h = hashlib.sha1(repr((endpoint, url.bucket, url.prefix)).encode()).hexdigest()[:16]
    return os.path.join(directory, f"s3-listing-{h}.json")


def hand_down(directory: str, endpoint: str | None) -> int:
    """Write this process's cached listings of `endpoint` into `directory` for child
    processes (run with LISTINGS_ENV=directory); the number written."""
    import json

    n = 0
    for (ep, url), lst in list(_LISTINGS.items()):
        if ep != endpoint:
            continue
        d = {"bucket": url.bucket, "prefix": url.prefix, "listed_at": lst.listed_at,
             "seconds": lst.seconds, "pages": lst.pages,
             "objects": [[o.key, o.size, o.etag] for o in lst.objects]}
        path = _listing_file(directory, ep, url)
        with open(path + ".tmp", "w") as f:
            json.dump(d, f)
        os.replace(path + ".tmp", path)
        n += 1
    return n


def _handed_down(endpoint: str | None, url: S3Url) -> Listing | None:
    import json

    directory = os.environ.get(LISTINGS_ENV)
    if not directory:
        return None
    try:
        with open(_listing_file(directory, endpoint, url)) as f:
            d = json.load(f)
        objs = tuple(ObjectInfo(str(k), int(n), str(e)) for k, n, e in d["objects"])
        return Listing(url, objs, float(d["listed_at"]), float(d["seconds"]), int(d["pages"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none, or unreadable: LIST afresh


def forget_listings() -> None:
    """Empty this process's listing cache (tests; after writing to a prefix)."""
    _LISTINGS.clear()
