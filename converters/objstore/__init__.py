"""Object storage (s3://) for datasets: the client layer every s3 reader, probe and copy uses.

    url.py      s3://BUCKET/PREFIX addresses (parse, is_s3) and endpoints as shown
    client.py   Store: a lazily made boto3 client per process, retries with backoff,
                one cached paginated LIST per dataset, GETs pinned to ETags, one-line errors

The storage interface over this client is autotune_converters.storage.s3 (S3Storage);
`stage s3://...` copies through it (autotune_converters.stagesrc), and the folder
and wds formats read a bucket through it (autotune_converters.folder.S3FolderSource,
autotune_converters.wds.bucket.S3WdsSource).

boto3 is imported only when a client is made (the s3 extra).
"""

from __future__ import annotations

from autotune_converters.objstore.client import Listing, ObjectInfo, S3Config, Store, forget_listings
from autotune_converters.objstore.url import S3Url, is_s3, parse, shown_endpoint

__all__ = ["Listing", "ObjectInfo", "S3Config", "S3Url", "Store", "forget_listings", "is_s3",
           "parse", "shown_endpoint"]
