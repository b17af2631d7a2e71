"""The obstore GET path of autotune_converters.objstore (client="obstore") against the real server:
the same bytes, ranges and ETag pinning as boto3's, and a one-line error, not a hang,
in a process forked after obstore was used."""

from __future__ import annotations

import os
import signal

import pytest

from autotune_base.errors import SampleError, UsageError
from autotune_converters.objstore import ObjectInfo, S3Config, Store

pytest.importorskip("obstore", reason="obstore is not installed (the s3-clients extra)")


def test_obstore_get_matches_boto3(s3_endpoint: str, s3_client, bucket: str) -> None:  # noqa: ANN001
    blob = os.urandom(300_000)
    s3_client.put_object(Bucket=bucket, Key="o/a.bin", Body=blob)
    etag = s3_client.head_object(Bucket=bucket, Key="o/a.bin")["ETag"]
    obj = ObjectInfo("o/a.bin", len(blob), etag)
    ob, bo = Store(S3Config(s3_endpoint, client="obstore")), Store(S3Config(s3_endpoint))
    assert ob.get(bucket, obj) == blob == bo.get(bucket, obj)
    assert ob.get(bucket, obj, (4096, 70000)) == blob[4096:70000]
    stale = ObjectInfo("o/a.bin", len(blob), '"0123456789abcdef0123456789abcdef"')
    with pytest.raises(SampleError, match="changed since the dataset was listed"):
        ob.get(bucket, stale)
    with pytest.raises(SampleError, match="o/gone.bin"):
        ob.get(bucket, ObjectInfo("o/gone.bin", 1, ""))


def test_obstore_after_fork_is_an_error_not_a_hang(s3_endpoint: str, s3_client,  # noqa: ANN001
                                                   bucket: str) -> None:
    s3_client.put_object(Bucket=bucket, Key="f/a.bin", Body=b"x" * 1000)
    obj = ObjectInfo("f/a.bin", 1000, "")
    store = Store(S3Config(s3_endpoint, client="obstore"))
    assert store.get(bucket, obj) == b"x" * 1000
    pid = os.fork()
    if pid == 0:  # 0: the UsageError came; 1: anything else; killed by the alarm: a hang
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(20)
        try:
            Store(S3Config(s3_endpoint, client="obstore")).get(bucket, obj)
            os._exit(1)
        except UsageError as e:
            os._exit(0 if "spawn" in str(e) and "forked from" in str(e) else 1)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_client_is_checked() -> None:
    with pytest.raises(UsageError, match="boto3 or obstore"):
        S3Config(client="curl")


def test_boto3_stays_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTOTUNE_S3_CLIENT", raising=False)
    assert S3Config().client == S3Config.from_env().client == "boto3"
    monkeypatch.setenv("AUTOTUNE_S3_CLIENT", "obstore")
    assert S3Config.from_env("http://127.0.0.1:1").client == "obstore"
