"""The storage interface: a local folder and the same files in a bucket (a real server)
answer list, stat, read, ranged read, stream and atomic write alike."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune_base.errors import SampleError
from autotune_converters.storage import Stat, open_storage
from autotune_converters.storage.local import LocalStorage
from autotune_converters.storage.s3 import S3Storage


@pytest.fixture
def files(tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    (root / "a").mkdir(parents=True)
    (root / "a" / "x.bin").write_bytes(bytes(range(256)) * 40)
    (root / "b.txt").write_bytes(b"hello")
    return root


def _same(storage, root: Path) -> None:  # noqa: ANN001 (either storage)
    listed = storage.list()
    assert sorted((s.name, s.size) for s in listed) == [("a/x.bin", 10240), ("b.txt", 5)]
    x = next(s for s in listed if s.name == "a/x.bin")
    assert storage.read(x) == storage.read("a/x.bin") == (root / "a" / "x.bin").read_bytes()
    assert storage.read(x, (300, 310)) == bytes(range(44, 54))
    body = storage.open(x)
    try:
        assert body.read(3) == b"\0\1\2"
    finally:
        body.close()
    assert storage.stat("b.txt").size == 5 and storage.stat("nothing-here") is None
    storage.write_atomic("c/new.json", b"{}")
    assert storage.read("c/new.json") == b"{}"
    fd = os.open(root.parent / "copy", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        assert storage.read_into(x, fd, part=1000, in_flight=4) == 10240
        assert os.pread(fd, 20000, 0) == storage.read(x)
    finally:
        os.close(fd)


def test_local_storage(files: Path) -> None:
    storage = open_storage(str(files))
    assert isinstance(storage, LocalStorage) and storage.where("b.txt") == str(files / "b.txt")
    _same(storage, files)


def test_s3_storage_reads_pinned_to_the_listing(files: Path, s3_endpoint: str, s3_client,  # noqa: ANN001
                                                bucket: str, upload,  # noqa: ANN001
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    upload(s3_client, bucket, files, "p")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    storage = open_storage(f"s3://{bucket}/p")
    assert isinstance(storage, S3Storage) and storage.where("b.txt") == f"s3://{bucket}/p/b.txt"
    _same(storage, files)
    old = next(s for s in storage.list() if s.name == "b.txt")
    s3_client.put_object(Bucket=bucket, Key="p/b.txt", Body=b"HELLO")
    with pytest.raises(SampleError, match="changed since the dataset was listed"):
        storage.read(old)
    assert storage.read(Stat("b.txt", 5)) == b"HELLO"  # no version: whatever is there
