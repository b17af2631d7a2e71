"""autotune.open_dataset over WebDataset shards in a bucket (the real S3 test server):
every sample once an epoch, the folder's labels, through two DataLoader workers."""

from __future__ import annotations

import collections
import hashlib
from pathlib import Path

import torch.utils.data

import autotune
from autotune_converters.objstore import forget_listings


def hash_bytes(b: bytes) -> str:
    return hashlib.sha1(b).hexdigest()


def test_open_dataset_reads_shards_in_a_bucket(small_dataset: Path, tmp_path: Path,
                                               s3_endpoint: str, s3_client, bucket: str,  # noqa: ANN001
                                               upload, monkeypatch) -> None:  # noqa: ANN001
    from autotune_converters import ConvertOptions, convert

    convert(small_dataset, tmp_path / "wds", ConvertOptions(format="wds", workers=1, readers=4))
    upload(s3_client, bucket, tmp_path / "wds", "wds")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    forget_listings()
    ds = autotune.open_dataset(f"s3://{bucket}/wds", transform=hash_bytes, decode=False,
                               num_workers=2)
    loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2, collate_fn=list)
    got = collections.Counter((h, ds.classes[y]) for batch in loader for h, y in batch)
    want = collections.Counter((hash_bytes(p.read_bytes()), p.parent.name)
                               for p in small_dataset.glob("*/*.jpg"))
    assert got == want and sum(got.values()) == 64
