"""Image-folder source, format detection, the sample pipeline and presets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from autotune.data import (
    FolderSource,
    TransformSpec,
    build_transform,
    list_presets,
    load_preset,
    open_source,
)
from autotune.data.torchds import ImageDataset
from autotune.data.geometry import rrc_params
from autotune.errors import UsageError
from autotune_converters.registry import detect as detect_format


def test_folder_labels_are_sorted_class_names(small_dataset: Path) -> None:
    src = FolderSource(small_dataset)
    assert src.classes == sorted(src.classes) == [f"class_{i:04d}" for i in range(4)]
    assert len(src) == 64
    for i in range(len(src)):
        data, label = src.read(i)
        assert Path(src.describe(i)).parent.name == src.classes[label]
        assert data[:2] == b"\xff\xd8"  # JPEG
    assert src.info() == {"path": str(small_dataset), "format": "folder", "images": 64, "classes": 4}


def test_folder_rules(tmp_path: Path) -> None:
    (tmp_path / "b" / "sub").mkdir(parents=True)
    (tmp_path / "a").mkdir()
    (tmp_path / ".hidden").mkdir()
    for rel in ("a/1.JPG", "a/2.png", "a/notes.txt", "a/.3.jpg", "b/sub/4.jpeg", ".hidden/5.jpg"):
        (tmp_path / rel).write_bytes(b"x")
    src = FolderSource(tmp_path)
    assert src.classes == ["a", "b"]
    assert [Path(src.describe(i)).name for i in range(len(src))] == ["1.JPG", "2.png", "4.jpeg"]
    assert [src.read(i)[1] for i in range(len(src))] == [0, 0, 1]


def test_folder_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no class subfolders"):
        FolderSource(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match=r"1 class folder\(s\) without images \(empty\)"):
        FolderSource(tmp_path)
    with pytest.raises(UsageError, match="no such file"):
        open_source(tmp_path / "missing")


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_other_formats_are_detected_and_incomplete_ones_refused(tmp_path: Path, fmt: str) -> None:
    # A manifest naming the format but not complete: refused naming the fix (a real
    # conversion is read in tests/bench/test_formats.py).
    (tmp_path / "manifest.json").write_text(json.dumps({"format": fmt}))
    assert detect_format(tmp_path) == fmt
    with pytest.raises(UsageError, match="manifest version None.*convert the dataset again"):
        open_source(tmp_path)
    bare = tmp_path / "bare"
    bare.mkdir()
    with pytest.raises(UsageError, match="needs the manifest.json"):
        open_source(bare, fmt)
    (tmp_path / "manifest.json").write_text("{oops")
    with pytest.raises(UsageError, match="manifest.json: not a readable autotune manifest"):
        detect_format(tmp_path)


@pytest.mark.parametrize("preset", ["resnet50", "resnet50-fast", "decode-only", "heavy-augment"])
def test_pipeline_gives_float32_chw(small_dataset: Path, preset: str) -> None:
    if preset == "resnet50-fast":
        pytest.importorskip("simplejpeg", reason="pip install 'autotune-loader[fast]'")
    ds = ImageDataset(FolderSource(small_dataset), build_transform(load_preset(preset).transform))
    for i in range(4):
        x, y = ds[i]
        assert x.dtype == torch.float32 and tuple(x.shape) == (3, 224, 224)
        assert -3 < float(x.min()) < 0 < float(x.max()) < 3  # normalised, not [0, 255]
        assert isinstance(y, int)


def test_center_crop_is_deterministic_and_random_crop_is_not(small_dataset: Path) -> None:
    data, _ = FolderSource(small_dataset).read(0)
    center = build_transform(TransformSpec(crop_mode="center"))
    assert torch.equal(center(data), center(data))
    rnd = build_transform(TransformSpec(crop_mode="random", flip=True))
    torch.manual_seed(0)  # the draws are torchvision's, on torch's generator
    outs = [rnd(data) for _ in range(6)]
    assert any(not torch.equal(outs[0], o) for o in outs[1:])


def test_draft_is_labelled_and_still_224(small_dataset: Path) -> None:
    spec = TransformSpec(draft=True)
    assert "DRAFT" in spec.describe()
    data, _ = FolderSource(small_dataset).read(1)
    assert tuple(build_transform(spec)(data).shape) == (3, 224, 224)


def test_rrc_params_stay_inside_the_image() -> None:
    torch.manual_seed(1)
    for w, h in ((500, 300), (300, 500), (224, 224), (1000, 100)):
        for _ in range(200):
            i, j, ch, cw = rrc_params(w, h, (0.08, 1.0), (3 / 4, 4 / 3))
            assert 0 <= i and 0 <= j and 0 < ch and 0 < cw and i + ch <= h and j + cw <= w


def test_corrupt_file_error_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    bad = tmp_path / "c" / "bad.jpg"
    bad.write_bytes(b"not a jpeg")
    ds = ImageDataset(FolderSource(tmp_path), build_transform(TransformSpec()))
    with pytest.raises(RuntimeError, match=r"bad\.jpg: cannot decode \(UnidentifiedImageError"):
        ds[0]


def test_presets(tmp_path: Path) -> None:
    assert {"resnet50", "resnet50-fast", "decode-only", "heavy-augment"} <= set(list_presets())
    r = load_preset("resnet50")
    assert r.batch_size == 256 and 50 <= r.compute_ms <= 200 and "A100" in r.compute_source
    # torchvision's standard training transform, exactly; the fast one is its own preset
    assert r.transform.crop_mode == "random_resized" and r.transform.flip
    assert r.transform.output == "float32" and r.transform.normalize and r.transform.exact
    assert r.transform.decoder == "pil" and not r.transform.draft
    fast = load_preset("resnet50-fast")
    assert fast.transform.decoder == "simplejpeg" and fast.transform.draft and not fast.transform.exact
    assert (fast.batch_size, fast.compute_ms) == (r.batch_size, r.compute_ms)
    assert load_preset("decode-only").compute_ms == 0
    heavy = load_preset("heavy-augment")
    assert heavy.transform.crop_mode == "random_resized" and heavy.transform.jitter
    with pytest.raises(UsageError, match="unknown preset 'nope'; available: .*resnet50"):
        load_preset("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("batch_size: 0\n")
    with pytest.raises(UsageError, match="batch_size must be an integer of at least 1, but got 0"):
        load_preset(bad)
    bad.write_text("batch_size: 8\ntransform: {crop: 224, resize: 100}\n")
    with pytest.raises(UsageError, match="resize must be an integer of at least crop"):
        load_preset(bad)
    bad.write_text("batch_size: 8\nloader: {workers: 3}\n")
    with pytest.raises(UsageError, match="unknown loader key"):
        load_preset(bad)


@pytest.mark.parametrize("mode", ["L", "CMYK", "RGBA", "P"])
def test_non_rgb_and_small_images_still_give_3x224x224(tmp_path: Path, mode: str) -> None:
    from PIL import Image

    from autotune.data.transforms import TransformSpec, build_transform

    for size in ((500, 375), (100, 80)):  # the second is padded, as before
        im = Image.new("RGB", size, (200, 30, 40)).convert(mode)
        p = tmp_path / f"x-{size[0]}.{'png' if mode in ('RGBA', 'P') else 'jpg'}"
        im.save(p)
        t = build_transform(TransformSpec(resize=256, crop=224, crop_mode="random", flip=True))
        out = t(p.read_bytes())
        assert tuple(out.shape) == (3, 224, 224) and str(out.dtype) == "torch.float32"
