"""Bad input (issue 8, case 5): truncated, empty, not an image, decompression bomb, odd
modes, EXIF rotation, odd names, duplicate stems, FIFOs, broken links and directory loops
are each skipped with a reason or kept byte for byte; never a crash, never silently lost.
--on-error fail stops at the first bad file, naming it, with nothing left looking
complete."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest

from autotune_converters import ConvertError, ConvertOptions, convert, read_manifest
from autotune_converters.images import BadImage, check_image


def _opts(fmt: str, **kw) -> ConvertOptions:
    return ConvertOptions(format=fmt, shard_size=1 << 20, readers=2, **kw)


def test_skip_lists_every_bad_input_and_keeps_every_good_one(bad_src, bad_cases, fmt, work_dir,
                                                            read_all):
    res = convert(bad_src, work_dir / "out", _opts(fmt))
    m = read_manifest(work_dir / "out")
    skipped = {s["path"].rstrip("/"): s["reason"] for s in m.skipped}
    stored = read_all(work_dir / "out")
    for path, want in bad_cases.items():
        path = path.rstrip("/")
        if want is None:  # hidden files and non-image extensions are not candidates
            assert path not in skipped and path not in stored
        elif want == "keep":
            assert path in stored, (path, skipped.get(path))
            assert stored[path][0] == (bad_src / path).read_bytes()  # original bytes
        else:
            assert skipped.get(path, "").startswith(want), (path, skipped.get(path))
    assert set(stored) | set(skipped) == {p.rstrip("/") for p, w in bad_cases.items() if w}
    assert res.samples == len(stored) and len(res.skipped) == len(skipped)
    assert res.skipped_by_kind["empty file"] == 1 and res.ignored == 1  # notes.txt
    labels = {p: label for p, (_, label) in stored.items()}
    assert labels["a/cmyk.jpg"] == 0 and labels["b/sub/deep.jpeg"] == 1
    assert "bomb" in skipped["a/bomb.png"] and "pixels" in skipped["a/bomb.png"]


def test_kept_odd_images_decode_through_the_training_pipeline(bad_src, work_dir, read_all):
    from autotune.data.transforms import TransformSpec, build_transform

    convert(bad_src, work_dir / "out", _opts("lmdb"))
    tf = build_transform(TransformSpec.from_dict(None))
    for path, (data, _) in read_all(work_dir / "out").items():
        out = tf(data)  # CMYK, P, LA, 16-bit, EXIF: all become 3-channel tensors
        assert tuple(out.shape)[0] == 3, path


@pytest.mark.parametrize("fmt_", ["lmdb", "wds"])
def test_fail_stops_at_the_first_bad_file_and_nothing_looks_complete(bad_src, fmt_, work_dir,
                                                                    run_cli):
    dst = work_dir / "out"
    r = run_cli(bad_src, dst, "--format", fmt_, "--on-error", "fail", "--workers", "2",
                "--shard-size", "64KiB", "--readers", "1")
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autotune convert: error: ")
    assert str(bad_src) in lines[0] and "--on-error skip" in lines[0]
    assert not (dst / "manifest.json").exists()
    assert not (dst / "data.mdb").exists()
    work = dst / ".autotune-convert"
    assert not list((work / "tmp").iterdir())  # no partial shard left anywhere
    for shard in dst.glob("shard-*.tar"):  # any shard under a final name is whole
        rec = json.loads((work / "done" / f"unit-{int(shard.stem[6:]):06d}.json").read_text())
        assert hashlib.sha256(shard.read_bytes()).hexdigest() == rec["shard"]["sha256"]


def test_fail_names_the_file_in_the_library_error(bad_src, work_dir):
    with pytest.raises(ConvertError) as e:
        convert(bad_src, work_dir / "out", _opts("wds", on_error="fail"))
    msg = str(e.value)
    assert msg.startswith(str(bad_src)) and ": " in msg and "--on-error skip" in msg


def _png_with_bad_idat() -> bytes:
    from PIL import Image
    import numpy as np

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(
        buf, format="PNG")
    data = bytearray(buf.getvalue())
    i = data.index(b"IDAT") + 4
    data[i + 10:i + 40] = b"\x00" * 30  # zlib stream broken, IEND still at the end
    return bytes(data)


def test_verify_decode_catches_what_the_header_check_cannot():
    bad = _png_with_bad_idat()
    assert check_image(bad, "header")[0] == "PNG"  # complete-looking file
    with pytest.raises(BadImage, match="^corrupt PNG"):
        check_image(bad, "decode")


@pytest.mark.parametrize("data, reason", [
    (b"", "empty file"),
    (b"GIF89a" + b"\0" * 3, "not an image"),  # Pillow cannot identify a cut header
    (b"%PDF-1.4 not an image", "not an image"),
])
def test_reasons_name_the_kind_first(data, reason):
    with pytest.raises(BadImage, match=f"^{reason}"):
        check_image(data)


def test_truncated_jpeg_is_caught_by_the_header_check_with_its_figure():
    from PIL import Image
    import numpy as np

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(
        buf, format="JPEG")
    data = buf.getvalue()
    with pytest.raises(BadImage, match=r"^truncated JPEG .*bytes not processed"):
        check_image(data[: len(data) * 2 // 3])
    # trailing bytes after a complete JPEG (some cameras append data) are not truncation
    assert check_image(data + b"trailer-data" * 10)[0] == "JPEG"


def test_pillow_global_truncated_flag_is_never_set(bad_src, work_dir):
    from PIL import ImageFile

    convert(bad_src, work_dir / "out", _opts("wds", verify="decode"))
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False
    src = Path(__file__).resolve().parents[2] / "converters"
    assert not any("LOAD_TRUNCATED_IMAGES =" in p.read_text() for p in src.glob("*.py"))


def test_file_list_with_header_integer_labels_repeats_and_missing(img_src, work_dir, read_all):
    files = sorted(p.relative_to(img_src) for p in img_src.rglob("*.jpg"))[:10]
    rows = ["path,label"] + [f"{p},{7 if i % 2 else 3}" for i, p in enumerate(files)]
    rows += [f"{files[0]},3", "nope/missing.jpg,3"]
    csv = work_dir / "list.csv"
    csv.write_text("\n".join(rows) + "\n")
    res = convert(img_src, work_dir / "out", _opts("lmdb", file_list=str(csv)))
    m = read_manifest(work_dir / "out")
    assert m.classes == [str(i) for i in range(8)]  # integer labels keep their values
    got = read_all(work_dir / "out")
    assert {p: lab for p, (_, lab) in got.items()} == {
        str(p): 7 if i % 2 else 3 for i, p in enumerate(files)}
    reasons = {s["path"]: s["reason"] for s in m.skipped}
    assert reasons[str(files[0])].startswith("duplicate entry")
    assert reasons["nope/missing.jpg"].startswith("missing")
    assert res.samples == 10


def test_file_list_with_names_as_labels(img_src, work_dir):
    files = sorted(p.relative_to(img_src) for p in img_src.rglob("*.jpg"))[:6]
    csv = work_dir / "list.csv"
    csv.write_text("".join(f"{p},{'dog' if i < 3 else 'cat'}\n" for i, p in enumerate(files)))
    convert(img_src, work_dir / "out", _opts("wds", file_list=str(csv)))
    assert read_manifest(work_dir / "out").classes == ["cat", "dog"]


def test_bad_files_read_by_workers_are_skipped_the_same(img_src, work_dir, read_all):
    """LMDB hands the reads to worker processes only for decodes (verify=decode): a bad
    file they meet is skipped with the same reason as when the writing process reads it.
    64 KiB units so that several units go to the workers."""
    import shutil

    src = work_dir / "src"
    shutil.copytree(img_src, src)
    for d in sorted(p for p in src.iterdir() if p.is_dir()):
        (d / "zz-junk.jpg").write_bytes(b"junk")
    kw = dict(format="lmdb", shard_size=1 << 16, readers=2, verify="decode")
    here = convert(src, work_dir / "here", ConvertOptions(workers=1, **kw))
    there = convert(src, work_dir / "workers", ConvertOptions(workers=2, **kw))
    assert len(here.skipped) >= 2 and there.skipped == here.skipped
    assert there.samples == here.samples and read_all(work_dir / "workers") == read_all(
        work_dir / "here")
