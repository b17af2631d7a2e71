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
from converters.objstore import S3Config, Store

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
    for secret in s3_keys:
        assert secret not in r.stdout and secret not in r.stderr


def test_cli_probe_missing_bucket_exit_2(s3_endpoint: str, s3_creds: None) -> None:
    r = _cli("probe", "s3://absent-bkt/x", "--warm", endpoint=s3_endpoint)
    assert r.returncode == 2 and "absent-bkt" in r.stderr and "NoSuchBucket" in r.stderr


@pytest.mark.slow
def test_search_a_bucket(s3_endpoint: str, s3_client, bucket: str, upload,  # noqa: ANN001
                         small_dataset: Path, tmp_path: Path) -> None:
    upload(s3_client, bucket, small_dataset, "train")
    r = _cli("search", f"s3://{bucket}/train", "--warm", "--trials", "1", "--seconds", "1",
             "--batch-size", "4", "--compute-ms", "0", "--out", str(tmp_path / "out"), "-q",
             "--json", str(tmp_path / "s.json"), endpoint=s3_endpoint)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads((tmp_path / "s.json").read_text())
    assert d["dataset"] == f"s3://{bucket}/train"
    c = d["ceilings"]
    assert c["storage"] > 0 and c["storage_unit"] == "samples/s"
    assert any("GETs of the dataset's objects" in e for e in c["evidence"])
