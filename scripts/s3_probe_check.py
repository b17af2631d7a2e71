#!/usr/bin/env python3
"""The s3:// probe beside a plain threaded boto3 GET loop: same server, same objects, same
emulated latency, same concurrency.

    PYTHONPATH=. .venv/bin/python -m scripts.s3_probe_check [--objects 300] [--delay-ms 50]

Starts SeaweedFS (`weed mini`, the s3 extra) in a temporary directory, uploads --objects
synthetic JPEGs as s3://probe-check/ds/CLASS/NAME.jpg, puts the delaying proxy
(autotune.emulate.delayproxy: --delay-ms each way, so a GET's first byte waits at least
twice that) in front of it, then for each concurrency reads every object once:

  probe   autotune.probe.objstore.measure_objects (what `autotune probe s3://...` runs)
  plain   concurrent.futures.ThreadPoolExecutor(c) over boto3 get_object().read()

and prints GETs/s, MiB/s and first-byte p50 of both, and the probe's / plain's ratio.
Warm (the objects sit in the local server's page cache in both): the comparison is of
the request path, not of the disk. Nothing outside its temporary directory is touched.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

KEY, SECRET = "probe-check-key", "probe-check-secret"


def _client(endpoint: str):  # noqa: ANN202
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY,
                        aws_secret_access_key=SECRET, region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}, max_pool_connections=64))


def plain_loop(endpoint: str, bucket: str, keys: list[str], c: int) -> dict:
    """Every key GET once by c threads sharing one client: GETs/s, MiB/s, first byte p50."""
    client = _client(endpoint)
    client.list_buckets()  # connect before the clock
    return timed_gets(client, bucket, keys, c)


def timed_gets(client, bucket: str, keys: list[str], c: int) -> dict:  # noqa: ANN001
    """The plain loop itself (boto3 only): every key GET once by c threads sharing
    `client`, timed from the first GET to the last byte."""

    def one(key: str) -> tuple[float, int]:
        t0 = time.perf_counter()
        r = client.get_object(Bucket=bucket, Key=key)
        first = time.perf_counter() - t0
        return first, len(r["Body"].read())

    t0 = time.perf_counter()
    with ThreadPoolExecutor(c) as pool:
        got = list(pool.map(one, keys))
    el = time.perf_counter() - t0
    firsts = sorted(f for f, _ in got)
    return {"gets": len(got), "gets_per_s": len(got) / el,
            "mib_per_s": sum(n for _, n in got) / el / 2**20,
            "first_byte_p50_ms": 1000 * firsts[len(firsts) // 2]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", type=int, default=300)
    ap.add_argument("--delay-ms", type=float, default=50.0, help="proxy delay, each way")
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args()
    levels = [int(x) for x in a.concurrency.split(",")]

    import os

    os.environ.update(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET)
    from autotune.emulate.delayproxy import DelayProxy
    from autotune.emulate.seaweed import SeaweedServer
    from autotune.probe.objstore import measure_objects
    from autotune.synth import make_image_folder
    from autotune_converters.objstore import S3Config, Store

    with tempfile.TemporaryDirectory(prefix="s3-probe-check-") as tmp:
        root = Path(tmp) / "ds"
        make_image_folder(root, a.objects, 4, seed=1, workers=1)
        with SeaweedServer(Path(tmp) / "weed") as endpoint:
            c = _client(endpoint)
            c.create_bucket(Bucket="probe-check")
            keys = []
            for p in sorted(root.rglob("*.jpg")):
                keys.append(f"ds/{p.relative_to(root).as_posix()}")
                c.put_object(Bucket="probe-check", Key=keys[-1], Body=p.read_bytes())
            u = urlsplit(endpoint)
            with DelayProxy((u.hostname, u.port), a.delay_ms / 1000) as (host, port):
                via = f"http://{host}:{port}"
                rows = []
                for lv in levels:
                    obj = measure_objects("s3://probe-check/ds", store=Store(S3Config(via)),
                                          concurrency=[lv], seconds=600, max_objects=len(keys),
                                          cold=False, ranges=False)
                    p = obj.by_concurrency[0]
                    q = plain_loop(via, "probe-check", keys, lv)
                    rows.append({"concurrency": lv, "objects": p.gets,
                                 "probe": {"gets_per_s": p.gets_per_s, "mib_per_s": p.mib_per_s,
                                           "first_byte_p50_ms": p.first_byte_p50_ms},
                                 "plain": q, "ratio": p.gets_per_s / q["gets_per_s"]})
    print(f"{a.objects} objects (mean {obj.mean_object_bytes / 1024:.0f} KiB), proxy "
          f"{a.delay_ms:g} ms each way; LIST {obj.list_keys_per_s:,.0f} keys/s")
    print(f"{'in flight':>9} | {'probe GETs/s':>12} {'MiB/s':>7} {'1st p50 ms':>10} | "
          f"{'plain GETs/s':>12} {'MiB/s':>7} {'1st p50 ms':>10} | probe/plain")
    for r in rows:
        p, q = r["probe"], r["plain"]
        print(f"{r['concurrency']:>9} | {p['gets_per_s']:>12,.1f} {p['mib_per_s']:>7.2f} "
              f"{p['first_byte_p50_ms']:>10.1f} | {q['gets_per_s']:>12,.1f} {q['mib_per_s']:>7.2f} "
              f"{q['first_byte_p50_ms']:>10.1f} | {r['ratio']:.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"objects": a.objects, "delay_ms": a.delay_ms,
                                            "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
