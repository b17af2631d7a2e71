"""`s3://BUCKET/PREFIX` dataset addresses, and endpoints as every message shows them."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from autotune_base.errors import UsageError

SCHEME = "s3://"
# AWS's rule (3-63 of lowercase letters, digits, '.', '-'; starts and ends alphanumeric).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def is_s3(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is an s3:// address (a Path never is: it would have lost the '//')."""
    return isinstance(path, str) and path.startswith(SCHEME)


@dataclass(frozen=True)
class S3Url:
    """A bucket and a key prefix ('' for the whole bucket; no leading or trailing '/')."""

    bucket: str
    prefix: str = ""

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}" if self.prefix else f"{SCHEME}{self.bucket}"

    def key(self, rel: str) -> str:
        """The key of `rel` below the prefix."""
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def url(self, key: str) -> str:
        return f"{SCHEME}{self.bucket}/{key}"

    @property
    def list_prefix(self) -> str:
        """What LIST is asked for: the prefix as a folder (so s3://b/train skips train2/)."""
        return f"{self.prefix}/" if self.prefix else ""


def parse(url: str) -> S3Url:
    """`s3://BUCKET[/PREFIX]` -> S3Url; UsageError naming what is wrong."""
    if not is_s3(url):
        raise UsageError(f"{url}: not an s3:// address (expected s3://BUCKET/PREFIX).")
    rest = url[len(SCHEME):]
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.match(bucket):
        raise UsageError(f"{url}: bucket name {bucket!r} is not valid (3-63 lowercase "
                         "letters, digits, '.' or '-'); expected s3://BUCKET/PREFIX.")
    prefix = prefix.strip("/")
    if "//" in prefix or any(p in (".", "..") for p in prefix.split("/")):
        raise UsageError(f"{url}: the prefix has an empty, '.' or '..' part; write it as "
                         "s3://BUCKET/a/b.")
    return S3Url(bucket, prefix)


def shown_endpoint(endpoint: str | None) -> str:
    """The endpoint as messages show it: no user:password, no query (where a presigned
    token would be); 'AWS S3' for the default."""
    if not endpoint:
        return "AWS S3"
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    if ":" in host:   # an IPv6 address: urlsplit drops its brackets, a URL needs them
        host = f"[{host}]"
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))
