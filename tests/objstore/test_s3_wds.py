"""WebDataset shards in a bucket: the same samples as the local shards, one GET a shard."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune_converters import registry
from autotune_base.errors import SampleError
from autotune_converters.objstore import forget_listings
from autotune_converters.wds.bucket import S3WdsSource
from autotune_converters.wds.reader import WdsSource


@pytest.fixture(scope="session")
def wds_dir(small_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from autotune_converters import ConvertOptions, convert

    dst = tmp_path_factory.mktemp("wds") / "train-wds"
    convert(small_dataset, dst, ConvertOptions(format="wds", workers=1, readers=4))
    return dst


@pytest.fixture
def s3_wds(wds_dir: Path, s3_endpoint: str, s3_client, bucket: str, upload,  # noqa: ANN001
           monkeypatch: pytest.MonkeyPatch) -> str:
    upload(s3_client, bucket, wds_dir, "wds")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    forget_listings()
    return f"s3://{bucket}/wds"


def test_shards_in_a_bucket_read_as_the_local_shards(s3_wds: str, wds_dir: Path) -> None:
    assert registry.resolve(s3_wds) == "wds"
    src = registry.open_source(s3_wds)
    local = WdsSource(wds_dir)
    assert isinstance(src, S3WdsSource) and src.num_shards == local.num_shards >= 2
    assert len(src) == len(local) == 64 and src.classes == local.classes
    assert list(src.records()) == list(local.records())
    assert list(src.files()) == [] and src.info()["storage"] == "object"


def test_dataset_through_forked_workers(s3_wds: str, wds_dir: Path) -> None:
    import torch.utils.data

    ds = registry.open_source(s3_wds).dataset(None, shuffle=False, rank=0, world_size=1)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                         multiprocessing_context="fork")
    got = sorted((bytes(b), int(l)) for b, l in loader)
    want = sorted((b, l) for b, l, _ in WdsSource(wds_dir).records())
    assert got == want


def test_a_shard_changed_after_the_listing_is_an_error(s3_wds: str, s3_client,  # noqa: ANN001
                                                      bucket: str, wds_dir: Path) -> None:
    src = registry.open_source(s3_wds)
    first = src.shards[0][0]
    key = first[len(f"s3://{bucket}/"):]
    s3_client.put_object(Bucket=bucket, Key=key, Body=(wds_dir / Path(key).name).read_bytes()
                         + b"\0" * 1024)  # other bytes, another ETag
    with pytest.raises(SampleError, match="changed since the dataset was listed"):
        list(src.records())


def test_a_truncated_shard_names_it(s3_wds: str, s3_client, bucket: str,  # noqa: ANN001
                                    wds_dir: Path) -> None:
    """Refused when the dataset is opened, from the listing's sizes (no request more), as
    a local shard is: it was found only when an epoch reached the shard."""
    src0 = registry.open_source(s3_wds)
    key = src0.shards[0][0][len(f"s3://{bucket}/"):]
    want = (wds_dir / Path(key).name).stat().st_size
    s3_client.put_object(Bucket=bucket, Key=key,
                         Body=(wds_dir / Path(key).name).read_bytes()[:5000])
    forget_listings()
    with pytest.raises(SampleError, match=rf"^s3://{bucket}/{key}: 5,000 bytes but manifest\.json "
                                          rf"says {want:,}; the upload is incomplete or damaged: "
                                          r"upload \(or convert\) again\.$"):
        registry.open_source(s3_wds)


@pytest.mark.slow
def test_bench_streams_shards_from_a_bucket(s3_wds: str, s3_endpoint: str, tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "AWS_ENDPOINT_URL"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    r = subprocess.run(
        [sys.executable, "-m", "autotune", "bench", s3_wds, "--endpoint-url", s3_endpoint, "-q",
         "--warm", "--workers", "2", "--batch-size", "4", "--warmup-batches", "2",
         "--compute-ms", "0", "--seconds", "2", "--json", str(tmp_path / "b.json")],
        env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:] + r.stdout[-2000:]
    d = json.loads((tmp_path / "b.json").read_text())
    assert d["dataset"]["format"] == "wds" and d["dataset"]["storage"] == "object"
    assert d["images_per_s"] > 0 and d["stages"]["seconds"]["read"] > 0


def test_probe_of_shards_claims_no_samples_ceiling(s3_wds: str, s3_endpoint: str) -> None:
    from autotune.probe.objstore import measure_objects, probe_result
    from autotune_converters.objstore import S3Config, Store

    obj = measure_objects(s3_wds, store=Store(S3Config(s3_endpoint)), concurrency=(1,),
                          seconds=1, cold=False)
    assert obj.conversion == "wds" and obj.by_concurrency[0].gets > 0
    d = probe_result(s3_wds, obj).to_dict()
    assert d["verdict"]["storage_samples_per_s"] is None and d["samples"] is None
    assert any("GETs/s is no samples/s ceiling" in e for e in d["verdict"]["evidence"])


# -- read-ahead and the warmed client ------------------------------------------------------

def _forked_client_parses(src: S3WdsSource, conn) -> None:  # noqa: ANN001 (a Pipe end)
    """In a forked child: how many botocore data files making this process's client read."""
    import botocore.loaders

    n = [0]
    orig = botocore.loaders.JSONFileLoader.load_file

    def counted(self, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        n[0] += 1
        return orig(self, *a, **k)

    botocore.loaders.JSONFileLoader.load_file = counted
    try:
        src.members.store.client.head_bucket(Bucket=src.url.bucket)  # made here, and used
        conn.send(n[0])
    except Exception as e:  # noqa: BLE001 (sent to the test to fail with)
        conn.send(repr(e))


def test_a_forked_worker_makes_its_client_from_the_parents_parsed_models(s3_wds: str) -> None:
    import multiprocessing as mp

    src = registry.open_source(s3_wds)  # its LIST and manifest GET made the parent's client
    ctx = mp.get_context("fork")
    here, there = ctx.Pipe()
    p = ctx.Process(target=_forked_client_parses, args=(src, there))
    p.start()
    got = here.recv()
    p.join(60)
    assert got == 0  # no JSON model parsed again; a cold process parses several
    cold = ctx.Process(target=_forked_client_parses, args=(src, there))
    import autotune_converters.objstore.client as client

    saved, client._LOADER = client._LOADER, None  # as a spawned worker starts
    try:
        cold.start()
        parsed = here.recv()
        cold.join(60)
        assert isinstance(parsed, int) and parsed > 0  # the count would see a re-parse
    finally:
        client._LOADER = saved


def test_the_next_shard_is_asked_for_while_this_one_is_read(s3_wds: str) -> None:
    src = registry.open_source(s3_wds)
    it = src.records()
    next(it)  # the first sample of the first shard
    waiting = list(src.members._waiting)
    assert waiting == [src.shards[1][0]]
    rest = list(it)
    assert len(rest) == len(src) - 1 and not src.members._waiting
    it2 = src.records()
    next(it2)
    it2.close()  # an abandoned pass: its read-ahead GET is dropped, not left waiting
    assert not src.members._waiting


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_every_sample_once_across_workers_with_read_ahead(s3_wds: str, wds_dir: Path,
                                                         context: str) -> None:
    import torch.utils.data

    ds = registry.open_source(s3_wds).dataset(None, shuffle=True, seed=3, rank=0,
                                              world_size=1)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=3,
                                         multiprocessing_context=context)
    got = [(bytes(b), int(l)) for b, l in loader]
    want = [(b, l) for b, l, _ in WdsSource(wds_dir).records()]
    assert len(got) == len(want) and sorted(got) == sorted(want)  # each once, none twice


def test_a_shard_changed_while_an_earlier_one_is_read_is_an_error(  # noqa: ANN001
        s3_wds: str, s3_client, bucket: str, wds_dir: Path) -> None:
    src = registry.open_source(s3_wds)
    it = src.records()
    next(it)  # reading shard 0; shard 1 is being asked for ahead, shard 2 not yet
    key = src.shards[2][0][len(f"s3://{bucket}/"):]
    s3_client.put_object(Bucket=bucket, Key=key, Body=(wds_dir / Path(key).name).read_bytes()
                         + b"\0" * 1024)
    with pytest.raises(SampleError, match=f"{Path(key).name}: changed since the dataset"):
        list(it)


def test_a_read_ahead_body_that_fails_first_is_asked_for_again(s3_wds: str) -> None:
    from autotune_converters.wds.bucket import _FirstReadAgain

    src = registry.open_source(s3_wds)
    url = src.shards[0][0]

    class Dropped:  # what a connection the server closed while it waited gives
        closed = False

        def read(self, n: int = -1) -> bytes:
            raise ConnectionResetError("reset by peer")

        def close(self) -> None:
            self.closed = True

    dropped = Dropped()
    body = _FirstReadAgain(dropped, lambda: src.members._open(url))
    assert body.read(512)[:4] and dropped.closed  # a fresh GET's first bytes
    body.close()
    failing = _FirstReadAgain(Dropped(), lambda: Dropped())  # asked once more, no more
    with pytest.raises(ConnectionResetError):
        failing.read(512)
