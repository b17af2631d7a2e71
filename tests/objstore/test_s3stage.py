"""`autotune stage s3://BUCKET/PREFIX DST`: a conversion in a bucket staged to local disk by
ranged GETs, verified against its manifest's sha256, resumable, atomic. A real server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune_converters import ConvertOptions, convert
from autotune_base.errors import UnsafeName
from autotune_converters.objstore import forget_listings
from autotune_converters import stagesrc
from autotune_converters.stage import stage as stage_s3

ROOT = Path(__file__).resolve().parents[2]


def files_of(d: Path) -> dict[str, bytes]:
    """Every file a stage publishes (its work folder left out)."""
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 96-image WebDataset conversion of many small shards (1 to 3 per class of sizes)."""
    from autotune.synth import make_image_folder

    base = tmp_path_factory.mktemp("s3stage")
    make_image_folder(base / "train", 96, 4, seed=5, workers=1)
    convert(base / "train", base / "wds", ConvertOptions(format="wds", shard_size=1 << 16,
                                                         readers=8, workers=1))
    return base / "wds"


@pytest.fixture
def remote(converted: Path, s3_endpoint: str, s3_client, bucket: str,  # noqa: ANN001
           monkeypatch: pytest.MonkeyPatch) -> str:
    """The conversion uploaded to s3://BUCKET/sets/wds, its manifest last."""
    for p in sorted(converted.iterdir(), key=lambda p: p.name == "manifest.json"):
        s3_client.put_object(Bucket=bucket, Key=f"sets/wds/{p.name}", Body=p.read_bytes())
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    forget_listings()
    return f"s3://{bucket}/sets/wds"


def test_staged_from_a_bucket_by_ranged_gets_is_the_conversion(
        remote: str, converted: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stagesrc, "PART", 16 << 10)  # every shard in several ranged GETs
    res = stage_s3(remote, tmp_path / "dst", workers=4)
    assert not res.failures and res.manifest_written and res.copied == res.files >= 8
    assert files_of(tmp_path / "dst") == files_of(converted)
    again = stage_s3(remote, tmp_path / "dst")  # a rerun: verified already
    assert again.copied == 0 and again.skipped == res.files
    from autotune_converters import open_converted

    assert len(open_converted(tmp_path / "dst")) == 96


def test_a_corrupt_or_missing_shard_is_named_exit_4_and_nothing_published_for_it(
        remote: str, converted: Path, s3_endpoint: str, s3_client, bucket: str,  # noqa: ANN001
        tmp_path: Path) -> None:
    shards = sorted(p.name for p in converted.glob("shard-*.tar"))
    bad, gone = shards[1], shards[2]
    size = (converted / bad).stat().st_size
    s3_client.put_object(Bucket=bucket, Key=f"sets/wds/{bad}", Body=b"\0" * size)
    s3_client.delete_object(Bucket=bucket, Key=f"sets/wds/{gone}")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    dst = tmp_path / "dst"
    r = subprocess.run([sys.executable, "-m", "autotune", "stage", "-q", remote, str(dst),
                        "--endpoint-url", s3_endpoint, "--json", "-"], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 4, r.stderr
    fails = {f["file"]: f["reason"] for f in json.loads(r.stdout)["failures"]}
    assert set(fails) == {bad, gone}
    assert "sha256" in fails[bad] and "not in the bucket" in fails[gone]
    assert not (dst / "manifest.json").exists()
    assert not (dst / bad).exists() and not (dst / gone).exists()
    assert all((dst / n).read_bytes() == (converted / n).read_bytes()
               for n in shards if n not in (bad, gone))
    assert "autotune-test-secret" not in r.stdout + r.stderr
    # the bucket repaired: the rerun fetches only those two and publishes the manifest
    for n in (bad, gone):
        s3_client.put_object(Bucket=bucket, Key=f"sets/wds/{n}",
                             Body=(converted / n).read_bytes())
    forget_listings()
    res = stage_s3(remote, dst)
    assert res.copied == 2 and not res.failures
    assert files_of(dst) == files_of(converted)


@pytest.mark.slow
def test_killed_mid_way_and_rerun_gives_the_same_bytes(remote: str, converted: Path,
                                                       s3_endpoint: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    dst = tmp_path / "dst"
    cmd = [sys.executable, "-m", "autotune", "stage", "-q", remote, str(dst), "--workers", "1",
           "--endpoint-url", s3_endpoint]
    p = subprocess.Popen(cmd, env=env, cwd=ROOT, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(dst.glob("shard-*.tar"))) < 2:
        if p.poll() is not None:
            break
        time.sleep(0.005)
    assert p.poll() is None, "finished before it could be killed"
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert not (dst / "manifest.json").exists()
    # whatever is under a final name is whole
    for f in dst.glob("shard-*.tar"):
        assert f.read_bytes() == (converted / f.name).read_bytes()
    r = subprocess.run(cmd + ["--json", "-"], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["skipped"] >= 2
    assert files_of(dst) == files_of(converted)


def test_per_node_copy(remote: str, converted: Path, tmp_path: Path) -> None:
    from autotune_converters.wds.split import NODE_FILE

    res = stage_s3(remote, tmp_path / "n0", node_rank=0, nnodes=2)
    got = files_of(tmp_path / "n0")
    assert NODE_FILE in got and "manifest.json" in got
    shards = [n for n in got if n.startswith("shard-")]
    assert 0 < len(shards) < len(list(converted.glob("shard-*.tar"))) and not res.failures
    assert all(got[n] == (converted / n).read_bytes() for n in shards)


def test_a_manifest_naming_a_path_outside_is_refused(remote: str, converted: Path,
                                                     s3_client, bucket: str,  # noqa: ANN001
                                                     tmp_path: Path) -> None:
    m = json.loads((converted / "manifest.json").read_text())
    m["shards"][0]["file"] = "../../escape.tar"
    s3_client.put_object(Bucket=bucket, Key="sets/wds/manifest.json", Body=json.dumps(m))
    with pytest.raises(UnsafeName, match="escape.tar"):
        stage_s3(remote, tmp_path / "a" / "dst")
    assert not (tmp_path / "a").exists() and not list(tmp_path.rglob("escape.tar"))


def test_a_missing_bucket_or_manifest_is_one_line_exit_2(s3_endpoint: str, s3_creds: None,
                                                         bucket: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for src, want in ((f"s3://no-such-bucket-{os.getpid()}/wds", "NoSuchBucket"),
                      (f"s3://{bucket}/nothing-here", "no manifest.json")):
        r = subprocess.run([sys.executable, "-m", "autotune", "stage", "-q", src,
                            str(tmp_path / "dst"), "--endpoint-url", s3_endpoint],
                           env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r.stderr
        assert want in r.stderr and "\n" not in r.stderr.strip()
        assert "autotune-test-secret" not in r.stderr
        assert not (tmp_path / "dst").exists()
