"""search --convert --stage-dir on a bucket: the conversion from the bucket is the staging
(straight into the local stage directory), then the staged shards are searched again."""

from __future__ import annotations

import json
from pathlib import Path

from autotune.search import SearchOptions
from autotune.search.loop import run_loop

TESTS = Path(__file__).resolve().parents[1] / "search"


def test_a_bucket_is_converted_into_the_stage_dir_and_searched_again(
        s3_endpoint: str, s3_client, bucket: str, upload, small_dataset: Path,  # noqa: ANN001
        tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    upload(s3_client, bucket, small_dataset, "train")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    url = f"s3://{bucket}/train"
    opts = SearchOptions(preset="decode-only", batch_size=4, seconds=1, warmup_batches=1,
                         space=str(TESTS / "space-tiny.yaml"), out=str(tmp_path / "out"),
                         trials=1, probe_fio=False, cold=False, confirm=0, compute_ms=5)
    # always: convert whatever the verdict (a local SeaweedFS is fast; what is checked
    # here is the path a storage verdict takes).
    r = run_loop(url, opts, convert="wds", stage_dir=tmp_path / "stage", always=True)
    assert r.before.dataset == url
    sdir = tmp_path / "stage" / "converted-wds"
    assert r.converted["source"] == url and r.staged["dir"] == str(sdir)
    m = json.loads((sdir / "manifest.json").read_text())
    assert sum(s["samples"] for s in m["shards"]) == 64
    assert r.after is not None and r.after.best is not None and r.after.dataset == str(sdir)
    assert any(c.startswith(f"autotune convert {url} ") for c in r.commands)
    d = json.loads((tmp_path / "out" / "search.json").read_text())
    assert d["converted"]["source"] == url and d["after"] is not None
