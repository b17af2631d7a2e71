"""`autotune stage s3://...` holds a chunk of each ranged GET, not the range: a real server.

Each shard is fetched by up to 8 ranged GETs of 8 MiB at once, 4 shards at a time. Read
whole (`Body.read()`), those ranges were 32 x 8 MiB in memory, and more while boto3 joined
its chunks: staging 4 shards of 316 MB took 322 MiB of anonymous memory and was OOM-killed
in a 300 MiB container. Streamed into the file a chunk at a time, the stage's memory no
longer grows with the ranges: here 4 shards of ~40 MB (5 ranges each) add less than
72 MiB to the process (measured: 36 MiB; 108 MiB before)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from autotune.synth import with_comment
from autotune_converters import ConvertOptions, convert

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20

_CHILD = """
import json, sys
from autotune_converters.stage import stage
from autotune_converters.storage.s3 import S3Storage
def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) << 10 for l in f if l.startswith(key))
S3Storage(sys.argv[1]).list()  # boto3 and its models loaded before the baseline
base = status("VmRSS:")
res = stage(sys.argv[1], sys.argv[2], workers=4)
print(json.dumps({"grew": status("VmHWM:") - base, "copied": res.copied,
                  "failures": len(res.failures), "manifest": res.manifest_written}))
"""


def _big_conversion(base: Path) -> Path:
    """4 WebDataset shards of ~40 MB (256 noise JPEGs of ~620 KB, a comment each)."""
    buf = io.BytesIO()
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (800, 800, 3), dtype=np.uint8)).save(buf, "JPEG",
                                                                               quality=92)
    for i in range(256):
        d = base / "src" / f"c{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:04d}.jpg").write_bytes(with_comment(buf.getvalue(), b"%d" % i))
    convert(base / "src", base / "wds", ConvertOptions(format="wds", readers=4,
                                                       shard_size=64 * MiB))
    return base / "wds"


def test_staging_big_shards_from_a_bucket_holds_chunks_not_ranges(
        s3_endpoint: str, s3_client, bucket: str, tmp_path: Path) -> None:  # noqa: ANN001
    wds = _big_conversion(tmp_path)
    shards = sorted(wds.glob("shard-*.tar"))
    assert len(shards) == 4 and min(p.stat().st_size for p in shards) > 32 * MiB
    for p in sorted(wds.iterdir(), key=lambda p: p.name == "manifest.json"):
        s3_client.put_object(Bucket=bucket, Key=f"big/{p.name}", Body=p.read_bytes())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AWS_ENDPOINT_URL": s3_endpoint}
    r = subprocess.run([sys.executable, "-c", _CHILD, f"s3://{bucket}/big",
                        str(tmp_path / "dst")], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout)
    assert got["copied"] == 4 and got["failures"] == 0 and got["manifest"], got
    assert all((tmp_path / "dst" / p.name).read_bytes() == p.read_bytes() for p in shards)
    assert got["grew"] < 72 * MiB, f"the stage grew by {got['grew'] / MiB:.0f} MiB"
