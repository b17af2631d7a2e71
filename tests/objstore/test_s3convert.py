"""`autotune convert s3://BUCKET/PREFIX DST`: a bucket converts to the same shards, byte for
byte, as the same files in a local folder; killed and rerun, the same again. A real server."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune_converters import ConvertOptions, convert
from autotune_base.errors import UsageError
from autotune_converters.objstore import forget_listings

ROOT = Path(__file__).resolve().parents[2]


def tree_digest(dst: Path) -> dict[str, str]:
    """sha256 of every output file; the manifest without 'created' and with the source
    root (where the files were: a path or an s3:// address) left out."""
    out = {}
    for p in sorted(dst.iterdir()):
        if p.name == "manifest.json":
            m = json.loads(p.read_text())
            m.pop("created")
            m["source"].pop("root")
            m["options"].pop("source")
            out[p.name] = hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest()
        elif p.is_file():
            out[p.name] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[p.name + "/"] = "dir"
    return out


@pytest.fixture(scope="module")
def local_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """96 JPEGs in 4 classes, plus what the scan must treat alike in both places: a
    truncated JPEG (skipped), a 0-byte image (skipped), a text file (ignored), a hidden
    file and a file beside the classes (neither counted)."""
    from autotune.synth import make_image_folder

    root = tmp_path_factory.mktemp("s3conv") / "train"
    make_image_folder(root, 96, 4, seed=3, workers=1)
    good = (root / "class_0000").iterdir().__next__().read_bytes()
    (root / "class_0001" / "cut.jpg").write_bytes(good[: len(good) // 2])
    (root / "class_0002" / "empty.jpg").write_bytes(b"")
    (root / "class_0002" / "notes.txt").write_text("not an image")
    (root / "class_0003" / ".hidden.jpg").write_bytes(good)
    (root / "README.txt").write_text("beside the classes")
    return root


@pytest.fixture
def s3_src(local_src: Path, s3_endpoint: str, s3_client, bucket: str, upload,  # noqa: ANN001
           monkeypatch: pytest.MonkeyPatch) -> str:
    upload(s3_client, bucket, local_src, "data/images")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    forget_listings()
    return f"s3://{bucket}/data/images"


@pytest.mark.parametrize("fmt,workers", [("wds", 2), ("lmdb", 1)])
def test_a_bucket_converts_to_the_local_folders_bytes(s3_src: str, local_src: Path,
                                                      tmp_path: Path, fmt: str,
                                                      workers: int) -> None:
    opts = ConvertOptions(format=fmt, shard_size=1 << 20, readers=2, workers=workers)
    res = convert(s3_src, tmp_path / "from-s3", opts)
    ref = convert(local_src, tmp_path / "from-disk", opts)
    assert res.samples == ref.samples == 96
    assert res.skipped_by_kind == ref.skipped_by_kind and len(res.skipped) == 2
    assert res.ignored == ref.ignored == 1
    if fmt == "wds":
        assert res.shards == ref.shards >= 4
    assert tree_digest(tmp_path / "from-s3") == tree_digest(tmp_path / "from-disk")
    m = json.loads((tmp_path / "from-s3" / "manifest.json").read_text())
    assert m["source"]["root"] == s3_src and m["options"]["source"] == s3_src
    assert not (tmp_path / "from-s3" / ".autotune-convert").exists()
    # rerun: complete already, nothing read again
    again = convert(s3_src, tmp_path / "from-s3", opts)
    assert again.already_complete


def test_unsafe_keys_are_skipped_by_the_name_check(s3_src: str, s3_client, bucket: str,  # noqa: ANN001
                                                   tmp_path: Path) -> None:
    """SeaweedFS normalizes or refuses keys with '.', '..' or empty parts (AWS keeps them):
    on the real server, what it kept converts inside DST; the rule itself on a listing
    holding such keys as AWS would list them."""
    from botocore.exceptions import ClientError

    from autotune_converters.objstore.client import Listing, ObjectInfo
    from autotune_converters.objstore.convsource import scan_bucket
    from autotune_converters.objstore.url import parse
    from autotune_converters.scan import ScanSink

    key0 = s3_client.list_objects_v2(Bucket=bucket, Prefix="data/images/class_0000/"
                                     )["Contents"][0]["Key"]
    img = s3_client.get_object(Bucket=bucket, Key=key0)["Body"].read()
    unsafe = ("data/images/class_0000/../../escape.jpg", "data/images/class_0000//x.jpg",
              "data/images/class_0001/./y.jpg")
    for key in unsafe:
        try:
            s3_client.put_object(Bucket=bucket, Key=key, Body=img)
        except ClientError:
            pass
    res = convert(s3_src, tmp_path / "out", ConvertOptions(format="wds", readers=1))
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["manifest.json",
                                                                    "shard-000000.tar"]
    assert not list(tmp_path.glob("escape.jpg")) and res.samples >= 96

    class FakeStore:  # the listing AWS would give; the real server cannot hold these keys
        def list(self, url):  # noqa: ANN001, ANN202
            objs = [ObjectInfo(k, 10, '"e"') for k in (*unsafe, "data/images/class_0000/ok.jpg")]
            return Listing(url, tuple(objs), 0.0, 0.0, 1)

    (tmp_path / "plan").mkdir()
    sink = ScanSink(tmp_path / "plan", 0, "skip", s3_src)
    scan = scan_bucket(parse(s3_src), sink, store=FakeStore())  # type: ignore[arg-type]
    assert scan.files == 1 and scan.skipped == 3
    reasons = [json.loads(line)["reason"] for line in
               (tmp_path / "plan" / "scan-skipped.jsonl").read_text().splitlines()]
    assert all(r.startswith("unsafe object key") for r in reasons)
    with pytest.raises(Exception, match="unsafe object key"):  # --on-error fail stops on it
        scan_bucket(parse(s3_src), ScanSink(tmp_path / "plan", 0, "fail", s3_src),
                    store=FakeStore())  # type: ignore[arg-type]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "autotune", "convert", "-q", *args]


@pytest.mark.slow
def test_killed_mid_way_and_rerun_gives_the_same_bytes(s3_src: str, local_src: Path,
                                                       tmp_path: Path, s3_endpoint: str) -> None:
    """SIGKILL a real `autotune convert s3://...` after its first shard, rerun it: the
    output is the uninterrupted local conversion's, byte for byte."""
    args = ["--format", "wds", "--shard-size", "64KiB", "--readers", "1", "--workers", "1",
            "--endpoint-url", s3_endpoint]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ref = tmp_path / "ref"
    subprocess.run(_cli(str(local_src), str(ref), *args), check=True, env=env, cwd=ROOT,
                   timeout=300)
    dst = tmp_path / "dst"
    p = subprocess.Popen(_cli(s3_src, str(dst), *args), env=env, cwd=ROOT,
                         stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(dst.glob("shard-*.tar"))) < 3:
        if p.poll() is not None:
            break
        time.sleep(0.01)
    assert p.poll() is None, "finished before it could be killed"
    p.send_signal(signal.SIGKILL)
    p.wait()
    shards = len(json.loads((ref / "manifest.json").read_text())["shards"])
    assert not (dst / "manifest.json").exists() and len(list(dst.glob("shard-*.tar"))) < shards
    r = subprocess.run(_cli(s3_src, str(dst), *args, "--json", "-"), env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["resumed_units"] >= 3
    assert tree_digest(dst) == tree_digest(ref)


def test_a_missing_bucket_is_one_line_exit_2(s3_endpoint: str, s3_creds: None,
                                             tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(_cli("s3://no-such-bucket-here/images", str(tmp_path / "out"),
                            "--format", "wds", "--endpoint-url", s3_endpoint),
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and "NoSuchBucket" in line and "no-such-bucket-here" in line
    assert s3_endpoint.split("//")[1] in line
    assert "autotune-test-secret" not in r.stderr + r.stdout
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_an_endpoint_that_does_not_answer_is_exit_1(s3_creds: None, tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(_cli("s3://some-bucket/images", str(tmp_path / "out"), "--format",
                            "wds", "--endpoint-url", f"http://127.0.0.1:{port}"),
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "\n" not in r.stderr.strip() and f"127.0.0.1:{port}" in r.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_file_list_with_a_bucket_src_is_refused(s3_src: str, tmp_path: Path) -> None:
    fl = tmp_path / "list.csv"
    fl.write_text("a.jpg,0\n")
    with pytest.raises(UsageError, match="--file-list is for a local SRC"):
        convert(s3_src, tmp_path / "out", ConvertOptions(format="wds", file_list=str(fl)))


def test_an_object_deleted_or_changed_since_the_listing_is_a_named_skip(
        s3_src: str, s3_client, bucket: str, tmp_path: Path) -> None:  # noqa: ANN001
    """fetch_ahead: GETs pinned to the plan's ETags; a deleted object and one rewritten
    since the LIST are this sample's skip (named), the others are read."""
    from autotune_converters.sourceread import ETAGS, fetch_ahead
    from autotune_converters.records import Entry, SkippedFile

    objs = s3_client.list_objects_v2(Bucket=bucket, Prefix="data/images/class_0000/")["Contents"]
    rel = [o["Key"][len("data/images/"):] for o in objs[:3]]
    (tmp_path / ETAGS).write_text(json.dumps({r: o["ETag"] for r, o in zip(rel, objs)}))
    s3_client.delete_object(Bucket=bucket, Key=objs[0]["Key"])
    s3_client.put_object(Bucket=bucket, Key=objs[1]["Key"], Body=b"another version")
    entries = [Entry(i, 0, r, int(o["Size"])) for i, (r, o) in enumerate(zip(rel, objs))]
    got = [g for _, g in fetch_ahead(s3_src, str(tmp_path), entries)]
    assert isinstance(got[0], SkippedFile) and "NoSuchKey" in got[0].reason
    assert isinstance(got[1], SkippedFile) and "changed since" in got[1].reason
    assert got[2] == s3_client.get_object(Bucket=bucket, Key=objs[2]["Key"])["Body"].read()


@pytest.mark.slow
def test_an_endpoint_lost_mid_way_stops_with_store_unreachable_and_resumes(
        s3_src: str, local_src: Path, s3_endpoint: str, tmp_path: Path) -> None:
    """The server reached through a proxy that is stopped after a few shards: the run
    stops with StoreUnreachable (exit 1: retries exhausted), no manifest, the finished
    shards kept; the rerun, straight to the server, ends identical to the local folder's."""
    import threading
    from urllib.parse import urlsplit

    from autotune.emulate.delayproxy import DelayProxy
    from autotune_base.errors import StoreUnreachable

    ep = urlsplit(s3_endpoint)
    opts = ConvertOptions(format="wds", shard_size=1 << 16, readers=1, workers=2)
    ref = convert(local_src, tmp_path / "ref", opts)
    dst = tmp_path / "dst"
    proxy = DelayProxy((ep.hostname, ep.port), 0.002)
    proxy.start()

    def cut() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(list(dst.glob("shard-*.tar"))) < 3:
            time.sleep(0.005)
        proxy.stop()

    t = threading.Thread(target=cut)
    t.start()
    try:
        with pytest.raises(StoreUnreachable, match=r"no good answer after \d+ attempts"):
            convert(s3_src, dst, dataclasses.replace(opts, endpoint_url=proxy.url))
    finally:
        t.join()
        proxy.stop()
    kept = len(list(dst.glob("shard-*.tar")))
    assert not (dst / "manifest.json").exists() and 3 <= kept < ref.shards
    res = convert(s3_src, dst, dataclasses.replace(opts, endpoint_url=s3_endpoint))
    assert res.resumed_units >= 3  # the units written before the outage are kept
    assert tree_digest(dst) == tree_digest(tmp_path / "ref")


@pytest.mark.parametrize("src", ["s3://no-such-bucket-here/images", "BUCKET/no-such-prefix"])
@pytest.mark.parametrize("dst_existed", [False, True])
def test_a_refused_scan_leaves_dst_as_it_was(s3_endpoint: str, s3_creds: None, bucket: str,
                                             tmp_path: Path, src: str, dst_existed: bool) -> None:
    """A first run whose LIST is refused (a missing bucket) or finds no images (a mistyped
    prefix) wrote nothing: DST is not left holding a work folder, which `stage` and
    `open_dataset` would then call an unfinished conversion; a DST it created is removed,
    one that existed stays as it was."""
    src = src.replace("BUCKET", f"s3://{bucket}")
    dst = tmp_path / "out"
    if dst_existed:
        dst.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(_cli(src, str(dst), "--format", "wds", "--endpoint-url", s3_endpoint),
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "\n" not in r.stderr.strip()
    if dst_existed:
        assert dst.is_dir() and list(dst.iterdir()) == []
    else:
        assert not os.path.lexists(dst)
