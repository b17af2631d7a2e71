"""s3:// datasets through the formats registry, bench and its stage clock: a real server."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from autotune_converters import registry
from autotune_base.errors import UsageError
from autotune_converters.folder import FolderSource, S3FolderSource
from autotune_converters.objstore import forget_listings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def s3_dataset(small_dataset: Path, s3_endpoint: str, s3_client, bucket: str, upload,  # noqa: ANN001
               monkeypatch: pytest.MonkeyPatch) -> str:
    """The session's 64-image folder, uploaded as s3://BUCKET/train/CLASS/NAME.jpg."""
    upload(s3_client, bucket, small_dataset, "train")
    s3_client.put_object(Bucket=bucket, Key="train/README.txt", Body=b"not an image")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    forget_listings()
    return f"s3://{bucket}/train"


def test_folder_in_a_bucket_reads_as_the_local_folder(s3_dataset: str, small_dataset: Path) -> None:
    assert registry.resolve(s3_dataset) == "folder"
    src = registry.open_source(s3_dataset)
    local = FolderSource(small_dataset)
    assert isinstance(src, S3FolderSource) and src.format == "folder"
    assert src.classes == local.classes and len(src) == len(local) == 64
    for i in range(len(src)):
        assert src.read(i) == local.read(i)
    assert src.describe(0).startswith(s3_dataset + "/")
    assert list(src.files()) == []  # nothing local for a cold run to evict
    info = src.info()
    assert info["storage"] == "object" and info["images"] == 64 and info["listed_at"] > 0


def test_source_crosses_fork_and_pickle_without_its_client(s3_dataset: str,
                                                           small_dataset: Path) -> None:
    import torch.utils.data

    src = registry.open_source(s3_dataset)
    src.read(0)  # the parent has a client now
    again = pickle.loads(pickle.dumps(src))
    assert again.store._client is None and again.read(5) == src.read(5)

    class Bytes(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(src)

        def __getitem__(self, i: int) -> bytes:
            return src.read(i)[0]

    loader = torch.utils.data.DataLoader(Bytes(), batch_size=None, num_workers=2,
                                         multiprocessing_context="fork")
    local = FolderSource(small_dataset)
    assert list(loader) == [local.read(i)[0] for i in range(len(local))]


def test_formats_without_an_s3_reader_are_refused(s3_dataset: str) -> None:
    with pytest.raises(UsageError, match="format lmdb cannot be read from object storage"):
        registry.resolve(s3_dataset, "lmdb")


def test_a_prefix_without_class_folders_is_a_usage_error(s3_endpoint, s3_client, bucket,  # noqa: ANN001
                                                         monkeypatch) -> None:  # noqa: ANN001
    s3_client.put_object(Bucket=bucket, Key="flat/a.jpg", Body=b"x")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    with pytest.raises(UsageError, match=r"no objects PREFIX/CLASS/NAME.jpg below it \(1 keys"):
        registry.open_source(f"s3://{bucket}/flat")


def _bench(dataset: str, endpoint: str, *extra: str, tmp: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "AWS_ENDPOINT_URL"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "autotune", "bench", dataset, "--endpoint-url", endpoint, "-q",
         "--workers", "2", "--batch-size", "4", "--warmup-batches", "2", "--compute-ms", "0",
         "--seconds", "2",
         "--json", str(tmp / "b.json"), *extra],
        env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
# Cold only: for a bucket --warm changes the note alone (its one line is the runner's
# constant); tests/objstore/test_s3_wds.py benches a bucket --warm.
def test_bench_reads_a_bucket_and_times_the_gets(s3_dataset: str, s3_endpoint: str,
                                                 tmp_path: Path) -> None:
    cache = "--cold"
    r = _bench(s3_dataset, s3_endpoint, cache, tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads((tmp_path / "b.json").read_text())
    assert d["dataset"]["path"] == s3_dataset and d["dataset"]["storage"] == "object"
    assert d["images_per_s"] > 0
    # The GETs are the pipeline's 'read' stage (timed in each worker).
    assert d["stages"]["seconds"]["read"] > 0 and d["stages"]["samples"] > 0
    assert d["cache"]["storage"] == "object"
    assert "object storage" in d["cache"]["note"]


@pytest.mark.slow
def test_bench_of_a_missing_bucket_or_a_silent_endpoint(s3_endpoint: str, s3_creds: None,
                                                        tmp_path: Path) -> None:
    r = _bench("s3://no-such-bkt/train", s3_endpoint, tmp=tmp_path)
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and s3_endpoint in line and "no-such-bkt" in line
    assert "NoSuchBucket" in line
    r = _bench("s3://no-such-bkt/train", "http://127.0.0.1:9", tmp=tmp_path)
    assert r.returncode == 1 and "attempts" in r.stderr and "\n" not in r.stderr.strip()
    assert not (tmp_path / "b.json").exists()


@pytest.mark.slow
def test_bench_child_reads_the_parents_listing(s3_dataset: str, tmp_path: Path) -> None:
    """One LIST per dataset: the measurement process gets the parent's, not its own."""
    from autotune.bench import BenchConfig, run_bench
    from autotune_converters.objstore import S3Config, Store, parse

    cfg = BenchConfig.from_preset("decode-only", num_workers=1, batch_size=4, seconds=1,
                                  warmup_batches=1, compute_ms=0, cold=False)
    res = run_bench(s3_dataset, cfg)
    assert not res.failed, res.reason
    parents = Store(S3Config.from_env()).listing(parse(s3_dataset))  # this process's cache
    assert res.dataset["listed_at"] == parents.listed_at
