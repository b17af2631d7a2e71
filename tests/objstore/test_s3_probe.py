"""`autotune probe s3://...` and `autotune search s3://...` against a real server, behind
the delaying proxy where latency matters (lower bounds only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from autotune.emulate.delayproxy import DelayProxy
from autotune.probe.objstore import measure_objects, probe_result
from autotune_converters.objstore import S3Config, Store

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def objects(s3_client, bucket: str) -> str:  # noqa: ANN001
    for i in range(40):
        s3_client.put_object(Bucket=bucket, Key=f"ds/c{i % 2}/{i:03d}.jpg", Body=os.urandom(4096))
    return f"s3://{bucket}/ds"


def test_probe_figures_and_ceiling(s3_endpoint: str, objects: str) -> None:
    obj = measure_objects(objects, store=Store(S3Config(s3_endpoint)), concurrency=(1, 4),
                          seconds=2, cold=False)
    assert obj.objects == 40 and obj.mean_object_bytes == 4096 and obj.list_pages == 1
    assert [lv.concurrency for lv in obj.by_concurrency] == [1, 4]
    for lv in obj.by_concurrency:
        assert lv.gets > 0 and lv.errors == 0 and lv.bytes == 4096 * lv.gets
        assert 0 < lv.first_byte_p50_ms <= lv.object_p50_ms
        assert lv.first_byte_p50_ms <= lv.first_byte_p99_ms
    res = probe_result(objects, obj)
    d = res.to_dict()
    assert d["filesystem"]["class"] == "object" and d["verdict"]["class"] == "object"
    assert d["verdict"]["storage_samples_per_s"] == obj.best.gets_per_s > 0
    assert d["object"]["best_concurrency"] in (1, 4)
    json.dumps(d)


def test_latency_through_the_proxy_is_at_least_two_delays(s3_endpoint: str, objects: str) -> None:
    u = urlsplit(s3_endpoint)
    delay = 0.05
    with DelayProxy((u.hostname, u.port), delay) as (host, port):
        obj = measure_objects(objects, store=Store(S3Config(f"http://{host}:{port}")),
                              concurrency=(1, 8), seconds=1.5, cold=False)
    for lv in obj.by_concurrency:
        # A request goes up and its answer comes down, each held `delay` by the proxy.
        assert lv.gets > 0 and lv.first_byte_p50_ms >= 2 * delay * 1000 - 1
    # One in flight cannot exceed one GET per round trip (a bound noise cannot break).
    one = obj.by_concurrency[0]
    assert one.gets_per_s <= 1 / (2 * delay) * 1.05


def _cli(*argv: str, endpoint: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "AWS_ENDPOINT_URL"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "autotune", *argv, "--endpoint-url", endpoint],
                          env=env, capture_output=True, text=True, timeout=600)


def test_cli_probe_json(s3_endpoint: str, objects: str, s3_keys, tmp_path: Path) -> None:  # noqa: ANN001
    r = _cli("probe", objects, "--warm", "--replay-seconds", "1", "--concurrency", "1,4",
             "--json", "-", endpoint=s3_endpoint)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["object"]["objects"] == 40 and d["verdict"]["class"] == "object"
    assert [lv["concurrency"] for lv in d["object"]["by_concurrency"]] == [1, 4]
    assert "GETs of the dataset's objects" in r.stderr
    assert d["object"]["ranged"] is None and "no large object" in d["object"]["ranged_note"]
    assert "ranged reads: no large object" in r.stderr
    assert d["object"]["ranged"] is None and "no large object" in d["object"]["ranged_note"]
    for secret in s3_keys:
        assert secret not in r.stdout and secret not in r.stderr


def test_cli_probe_missing_bucket_exit_2(s3_endpoint: str, s3_creds: None) -> None:
    r = _cli("probe", "s3://absent-bkt/x", "--warm", endpoint=s3_endpoint)
    assert r.returncode == 2 and "absent-bkt" in r.stderr and "NoSuchBucket" in r.stderr


def test_cli_probe_of_a_prefix_with_no_objects_exit_2(s3_endpoint: str, objects: str,
                                                      s3_keys) -> None:  # noqa: ANN001
    """A mistyped prefix (s3://bucket/dss for s3://bucket/ds) lists nothing: one line naming
    it, exit 2, as a local path that does not exist; never a table of zeros and exit 0."""
    empty = objects + "s"
    r = _cli("probe", empty, "--warm", "--replay-seconds", "1", "--concurrency", "1",
             "--json", "-", endpoint=s3_endpoint)
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-500:])
    assert r.stdout == ""
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("autotune probe: error:")]
    assert len(lines) == 1 and empty in lines[0] and "no objects" in lines[0]
    assert "GETs/s" not in r.stderr
    for secret in s3_keys:
        assert secret not in r.stdout and secret not in r.stderr


@pytest.mark.slow
def test_search_a_bucket(s3_endpoint: str, s3_client, bucket: str, upload,  # noqa: ANN001
                         small_dataset: Path, tmp_path: Path) -> None:
    upload(s3_client, bucket, small_dataset, "train")
    # No confirmations (the default measures the trial and the baseline again in 2 s
    # windows): this test asserts the storage ceiling, which the probe measures.
    r = _cli("search", f"s3://{bucket}/train", "--warm", "--trials", "1", "--seconds", "1",
             "--confirm", "0",
             "--batch-size", "4", "--compute-ms", "0", "--out", str(tmp_path / "out"), "-q",
             "--json", str(tmp_path / "s.json"), endpoint=s3_endpoint)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads((tmp_path / "s.json").read_text())
    assert d["dataset"] == f"s3://{bucket}/train"
    c = d["ceilings"]
    assert c["storage"] > 0 and c["storage_unit"] == "samples/s"
    assert any("GETs of the dataset's objects" in e for e in c["evidence"])
    # The printed training code reads the bucket where the search did (a user's walk: pasted
    # as printed, it went to AWS, and open_dataset has no --endpoint-url).
    assert d["endpoint"] == s3_endpoint, d["endpoint"]
    code = d["train"]["code"]
    assert f"os.environ.setdefault('AWS_ENDPOINT_URL', {s3_endpoint!r})" in code, code


def test_ranged_reads_of_a_large_object_are_its_bytes(s3_endpoint: str, s3_client,  # noqa: ANN001
                                                      bucket: str) -> None:
    from autotune.probe.objstore import RANGE_MIN_BYTES

    blob = os.urandom(RANGE_MIN_BYTES + 3 * 4096 + 17)  # not a multiple of a range
    s3_client.put_object(Bucket=bucket, Key="big/video.bin", Body=blob)
    for i in range(3):
        s3_client.put_object(Bucket=bucket, Key=f"big/{i}.jpg", Body=os.urandom(2048))
    seen: list[tuple[int, int]] = []
    bad: list[int] = []

    def check(off: int, data: bytes) -> None:
        seen.append((off, len(data)))
        if data != blob[off:off + len(data)]:
            bad.append(off)

    obj = measure_objects(f"s3://{bucket}/big", store=Store(S3Config(s3_endpoint)),
                          concurrency=(1,), seconds=0.5, range_seconds=0.5, cold=False,
                          on_range=check)
    rp = obj.ranged
    assert rp is not None and obj.ranged_note is None
    assert rp.key == "big/video.bin" and rp.size == len(blob) and rp.etag
    assert [(lv.range_bytes, lv.concurrency) for lv in rp.levels] == [
        (s, c) for s in (1 << 20, 8 << 20) for c in (1, 4, 16)]
    for lv in rp.levels:
        assert lv.gets > 0 and lv.errors == 0 and lv.bytes == lv.gets * lv.range_bytes
        assert 0 < lv.first_byte_p50_ms <= lv.first_byte_p99_ms
    assert not bad and len(seen) == sum(lv.gets for lv in rp.levels)
    assert len({off for off, _ in seen}) > 1  # offsets vary (not one range read again)
    assert all(off % 4096 == 0 and off + n <= len(blob) for off, n in seen)
    d = probe_result(f"s3://{bucket}/big", obj).to_dict()
    r = d["object"]["ranged"]
    assert r["key"] == "big/video.bin" and len(r["levels"]) == 6
    assert {"range_bytes", "concurrency", "mib_per_s", "first_byte_p50_ms",
            "first_byte_p99_ms", "errors"} <= set(r["levels"][0])
    assert any("ranged GETs of 8 MiB" in e for e in d["verdict"]["evidence"])
    json.dumps(d)


def test_ranged_reads_refuse_a_changed_object(s3_endpoint: str, s3_client,  # noqa: ANN001
                                              bucket: str) -> None:
    """Pinned to the listing's ETag: an object rewritten after the LIST reads as errors."""
    from autotune.probe.objstore import measure_ranges
    from autotune_converters.objstore import ObjectInfo

    s3_client.put_object(Bucket=bucket, Key="x/big.bin", Body=os.urandom(2 << 20))
    stale = ObjectInfo("x/big.bin", 2 << 20, '"0123456789abcdef0123456789abcdef"')
    rp = measure_ranges(Store(S3Config(s3_endpoint, attempts=1)), bucket, stale, "test",
                        concurrency=(1,), seconds=0.3)
    assert [lv.range_bytes for lv in rp.levels] == [1 << 20]
    assert rp.levels[0].gets == 0 and rp.levels[0].errors > 0
    assert rp.skipped and "8 MiB" in rp.skipped[0]


class _SlowToMake(Store):
    """A store whose client takes longer to make than a level lasts (a busy machine: CI
    saw a 0.3 s level measure nothing while boto3 built its client)."""

    def _make_client(self):  # noqa: ANN202
        import time

        time.sleep(0.6)
        return super()._make_client()


def test_a_level_starts_its_clock_after_the_client_is_made(s3_endpoint: str, s3_client,  # noqa: ANN001
                                                          bucket: str) -> None:
    from autotune.probe.objstore import measure_ranges
    from autotune_converters.objstore import ObjectInfo

    s3_client.put_object(Bucket=bucket, Key="x/big.bin", Body=os.urandom(1 << 20))
    etag = s3_client.head_object(Bucket=bucket, Key="x/big.bin")["ETag"]
    rp = measure_ranges(_SlowToMake(S3Config(s3_endpoint)), bucket,
                        ObjectInfo("x/big.bin", 1 << 20, etag), "test", concurrency=(2,),
                        seconds=0.2)
    lv = rp.levels[0]
    assert lv.gets >= 2 and lv.errors == 0, lv  # one request a thread at least
    objs = measure_objects(f"s3://{bucket}/x", store=_SlowToMake(S3Config(s3_endpoint)),
                           concurrency=(1,), seconds=0.2, cold=False, ranges=False)
    assert objs.by_concurrency[0].gets == 1 and objs.by_concurrency[0].errors == 0


def test_no_large_object_is_said_not_zeroed(s3_endpoint: str, objects: str) -> None:
    obj = measure_objects(objects, store=Store(S3Config(s3_endpoint)), concurrency=(1,),
                          seconds=0.5, cold=False)
    assert obj.ranged is None and "no large object" in obj.ranged_note
    d = probe_result(objects, obj).to_dict()
    assert d["object"]["ranged"] is None and "no ranged reads" in d["object"]["ranged_note"]
    assert any("no large object" in e for e in d["verdict"]["evidence"])


def test_pick_large_prefers_a_shard_and_says_why() -> None:
    from autotune.probe.objstore import RANGE_MIN_BYTES, pick_large
    from autotune_converters.objstore import ObjectInfo

    shards = [ObjectInfo(f"s/shard-{i:06d}.tar", (2 + i) << 20, "e") for i in range(3)]
    big, why = pick_large(shards, "wds")
    assert big == shards[2] and "shard of the wds conversion" in why
    assert pick_large(shards, None) == (None, pick_large(shards, None)[1])
    assert "no large object" in pick_large(shards, None)[1]
    huge = ObjectInfo("v.bin", RANGE_MIN_BYTES, "e")
    assert pick_large([*shards, huge], None)[0] == huge
    assert pick_large([], None)[0] is None


def test_table_shows_the_ranged_reads_or_the_note() -> None:
    from rich.console import Console

    from autotune.cli.tables.probe import probe_renderable
    from autotune.probe.objstore import GetLevel, ObjectProbe, RangeLevel, RangeProbe

    obj = ObjectProbe("s3://b/p", "http://h:1", 3, 1000.0, 0.01, 1, 300.0, "warm (--warm)",
                      [GetLevel(1, 10, 10000, 1.0, 10.0, 0.01, 5.0, 9.0, 6.0, 9.5)])
    obj.ranged = RangeProbe("p/big.bin", 20 << 20, "e", "the largest object",
                            [RangeLevel(8 << 20, 4, 3, 24 << 20, 1.0, 3.0, 24.0, 7.5, 12.25)])

    def text(o: ObjectProbe) -> str:
        c = Console(width=200, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
        c.print(probe_renderable(probe_result("s3://b/p", o)))
        return c.export_text()

    t = text(obj)
    assert "Ranged GETs of p/big.bin" in t and "12.2" in t and "7.5" in t
    obj.ranged, obj.ranged_note = None, "no large object: the largest, p/x, is 9 bytes"
    assert "ranged reads: no large object" in text(obj)


def test_an_endpoint_without_its_scheme_is_a_usage_error_that_shows_no_password() -> None:
    """A user's walk: `--endpoint-url 127.0.0.1:43303` was an internal error (boto3's
    "Invalid endpoint", exit 1)."""
    from autotune_converters.objstore.client import S3Config
    from autotune.errors import UsageError

    with pytest.raises(UsageError) as e:
        S3Config(endpoint_url="ak:s3cr3t@host:9000")
    assert "http://" in str(e.value) and "'host:9000'" in str(e.value)
    assert "s3cr3t" not in str(e.value)
    assert S3Config(endpoint_url="http://host:9000").endpoint_url == "http://host:9000"
