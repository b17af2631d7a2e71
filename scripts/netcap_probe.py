"""The s3:// probe behind a bandwidth cap: does it measure the cap? (root; not a test:
timings).

    sudo PYTHONPATH=. .venv/bin/python -m scripts.netcap_probe [--rate 100mbit] \\
        [--objects 200] [--big-mib 64] [--seconds 4] [--json out/netcap_probe.json]

Starts SeaweedFS inside a network namespace behind a `tc tbf` cap of --rate on the veth
that carries the GET bodies (autotune.emulate.netcap.CappedSeaweed), uploads --objects
objects of 256 KiB and one of --big-mib MiB, and runs the probe's measurement
(autotune.probe.objstore.measure_objects, what `autotune probe s3://` runs) through the
cap at 1, 4, 16 in flight, ranged reads included. Prints each level's MiB/s beside the
cap (RATE in MB/s, 10^6 bytes) and the tbf's own byte counter beside the bytes the probe
read.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from scripts._common import utc_date, write_json


def _rate_mb_s(rate: str) -> float:
    units = {"kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8}
    for u, f in units.items():
        if rate.lower().endswith(u):
            return float(rate[: -len(u)]) * f / 1e6
    raise SystemExit(f"--rate must end in kbit, mbit or gbit, but got {rate!r}.")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--objects", type=int, default=200)
    ap.add_argument("--big-mib", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args()
    os.environ.update(AWS_ACCESS_KEY_ID="netcap-key", AWS_SECRET_ACCESS_KEY="netcap-secret")
    import boto3
    from botocore.config import Config

    from autotune.emulate.netcap import CappedSeaweed
    from autotune.probe.objstore import measure_objects
    from autotune_converters.objstore import S3Config, Store

    cap_mb = _rate_mb_s(a.rate)
    res: dict = {"date": utc_date(), "rate": a.rate,
                 "cap_mb_per_s": cap_mb}
    with tempfile.TemporaryDirectory(prefix="netcap-probe-", dir="/var/tmp") as td:
        served = CappedSeaweed(Path(td) / "weed", rate=a.rate)
        with served as endpoint:
            c = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                             config=Config(s3={"addressing_style": "path"}))
            c.create_bucket(Bucket="cap")
            for i in range(a.objects):
                c.put_object(Bucket="cap", Key=f"ds/c{i % 4}/{i:05d}.bin",
                             Body=os.urandom(256 << 10))
            c.put_object(Bucket="cap", Key="ds/big.bin", Body=os.urandom(a.big_mib << 20))
            before = served.cap.stats()["bytes"]
            obj = measure_objects("s3://cap/ds", store=Store(S3Config(endpoint)),
                                  concurrency=(1, 4, 16), seconds=a.seconds,
                                  range_seconds=a.seconds, cold=False)
            sent = served.cap.stats()["bytes"] - before
    read = sum(lv.bytes for lv in obj.by_concurrency)
    read += sum(lv.bytes for lv in obj.ranged.levels) if obj.ranged else 0
    rows = [("GET 256 KiB objects", lv.concurrency, lv.bytes / lv.seconds / 1e6)
            for lv in obj.by_concurrency]
    rows += [(f"ranged {lv.range_bytes >> 20} MiB", lv.concurrency, lv.bytes / lv.seconds / 1e6)
             for lv in (obj.ranged.levels if obj.ranged else [])]
    print(f"cap {a.rate} = {cap_mb:.2f} MB/s; tbf sent {sent:,} bytes, the probe read "
          f"{read:,} ({sent / max(read, 1):.3f}x)")
    for what, conc, mb in rows:
        print(f"  {what:>20} @{conc:>2}: {mb:6.2f} MB/s ({mb / cap_mb - 1:+.0%} of the cap)")
    res.update(tbf_sent_bytes=sent, probe_read_bytes=read, object=obj.to_dict(),
               rows=[{"what": w, "concurrency": c, "mb_per_s": m} for w, c, m in rows])
    if a.json:
        write_json(a.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
