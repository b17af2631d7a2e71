"""The sample transform: torchvision's ImageNet training transform, exact and fast.

The exact pipeline is checked against a plain re-implementation written here with PIL and
numpy (torchvision itself is not installed in the test venv; scripts/bench_transform.py
compares with it bit for bit). The fast one is checked against the exact one on the
same crop boxes, within the stated FAST_TOLERANCE.
"""

from __future__ import annotations

import io
import math
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from autotune.data import (FolderSource, ImagenetTrainTransform, TransformSpec, build_transform,
                           geometry, load_preset)
from autotune.data.decode import open_image
from autotune.data.transforms import FAST_TOLERANCE, IMAGENET_MEAN, IMAGENET_STD
from autotune.errors import SampleError, UsageError
from autotune.synth import render_jpeg

MEAN = np.array(IMAGENET_MEAN, dtype=np.float32)
STD = np.array(IMAGENET_STD, dtype=np.float32)


# -- a plain reference: torchvision's RandomResizedCrop + flip + ToTensor + Normalize ----

def _ref_box(width: int, height: int) -> tuple[int, int, int, int]:
    """RandomResizedCrop.get_params (scale 0.08-1, ratio 3/4-4/3), written out: draws from
    torch's generator, float32 as torchvision's. (left, top, right, bottom)."""
    area = width * height
    lo, hi = torch.log(torch.tensor([3 / 4, 4 / 3]))
    for _ in range(10):
        target = area * torch.empty(1).uniform_(0.08, 1.0).item()
        aspect = torch.exp(torch.empty(1).uniform_(lo, hi)).item()
        w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, size=(1,)).item())
            left = int(torch.randint(0, width - w + 1, size=(1,)).item())
            return left, top, left + w, top + h
    ratio = width / height
    if ratio < 3 / 4:
        w, h = width, int(round(width / (3 / 4)))
    elif ratio > 4 / 3:
        w, h = int(round(height * (4 / 3))), height
    else:
        w, h = width, height
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


def _reference(data: bytes) -> tuple[np.ndarray, tuple[int, int, int, int], bool]:
    img = Image.open(io.BytesIO(data)).convert("RGB")
    box = _ref_box(*img.size)
    img = img.crop(box).resize((224, 224), Image.BILINEAR)
    flip = torch.rand(1).item() < 0.5
    if flip:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    x = np.asarray(img, dtype=np.float32) / np.float32(255)
    x = (x - MEAN) / STD
    return x.transpose(2, 0, 1), box, flip


def _photo(seed: int, w: int, h: int) -> bytes:
    """A photo-like JPEG of any size (autotune.synth's recipe: a smooth random colour field
    plus grain), for sizes beyond the synthetic set's 300-500 px."""
    rng = np.random.default_rng(seed)
    cw, ch = max(2, w // int(rng.integers(6, 14))), max(2, h // int(rng.integers(6, 14)))
    coarse = rng.integers(0, 256, size=(ch, cw, 3), dtype=np.uint8)
    img = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BICUBIC), dtype=np.int16)
    img = np.clip(img + rng.normal(0, float(rng.uniform(14, 30)), size=(h, w, 1)), 0, 255)
    buf = io.BytesIO()
    Image.fromarray(img.astype(np.uint8)).save(buf, format="JPEG", quality=85)
    return buf.getvalue()


def _levels(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean |a - b| of two normalised images, in levels of 255."""
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return float(((a - b).abs() * std * 255).mean())


# -- the exact pipeline -----------------------------------------------------------------

def test_resnet50_preset_matches_the_plain_reference(small_dataset: Path) -> None:
    t = build_transform(load_preset("resnet50").transform)
    src = FolderSource(small_dataset)
    blobs = [src.read(i)[0] for i in range(16)] + [_photo(5, 1000, 300), _photo(6, 260, 900)]
    flips = set()
    for i, data in enumerate(blobs):
        torch.manual_seed(i)
        ref, box, flip = _reference(data)
        torch.manual_seed(i)
        got = t(data)
        torch.manual_seed(i)
        size = open_image(data).size
        assert geometry.plan(t.spec, *size).box == box  # the same crop box from the same seed
        assert got.dtype == torch.float32 and tuple(got.shape) == (3, 224, 224)
        # float32 arithmetic in a different order (numpy / 255 vs torch * (1/255)): ulps.
        assert np.abs(got.numpy() - ref).max() < 1e-5, i
        flips.add(flip)
    assert flips == {True, False}  # both branches were compared


def test_normalisation_on_a_known_image() -> None:
    # A solid colour: every output value is (c / 255 - mean) / std of its channel.
    colour = (200, 100, 30)
    buf = io.BytesIO()
    Image.new("RGB", (400, 300), colour).save(buf, format="PNG")  # lossless: exact pixels
    for fast in (False, True):
        x = ImagenetTrainTransform(fast=fast, decoder="pil")(buf.getvalue())
        assert x.dtype == torch.float32 and tuple(x.shape) == (3, 224, 224)
        want = (np.array(colour, dtype=np.float32) / 255 - MEAN) / STD
        assert np.allclose(x.numpy().reshape(3, -1), want[:, None], atol=1e-5), fast
    # The mean image maps to 0; a random photo has mean near 0 and std near 1 per channel.
    buf = io.BytesIO()
    Image.new("RGB", (300, 300), tuple(int(round(m * 255)) for m in IMAGENET_MEAN)).save(buf, "PNG")
    assert ImagenetTrainTransform()(buf.getvalue()).abs().max() < 0.01
    x = ImagenetTrainTransform()(render_jpeg(0, 3)[0])
    assert x.min() < -1 and x.max() > 1 and abs(float(x.mean())) < 1.5


def test_flip_actually_flips() -> None:
    # Left half red, right half blue: a flip moves the blue to the left.
    arr = np.zeros((300, 300, 3), dtype=np.uint8)
    arr[:, :150, 0] = 255
    arr[:, 150:, 2] = 255
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    for exact in (True, False):
        t = build_transform(TransformSpec(resize=None, crop=224, crop_mode="center", flip=True,
                                          exact=exact))
        outs = {}
        for seed in range(20):  # center crop draws nothing: the flip is the only draw
            torch.manual_seed(seed)
            flipped = torch.rand(1).item() < 0.5
            torch.manual_seed(seed)
            outs.setdefault(flipped, t(buf.getvalue()))
        assert set(outs) == {True, False}
        plain, mirrored = outs[False], outs[True]
        assert plain[0, :, :100].mean() > 1 and plain[2, :, :100].mean() < -1  # red on the left
        assert torch.equal(mirrored, plain.flip(-1)), exact


def test_uint8_output_is_the_same_pixels(small_dataset: Path) -> None:
    data, _ = FolderSource(small_dataset).read(2)
    for exact in (True, False):
        u8 = build_transform(TransformSpec(crop_mode="random_resized", flip=True, output="uint8",
                                           normalize=False, exact=exact))
        f32 = build_transform(TransformSpec(crop_mode="random_resized", flip=True, exact=exact))
        torch.manual_seed(3)
        a = u8(data)
        torch.manual_seed(3)
        b = f32(data)
        assert a.dtype == torch.uint8 and tuple(a.shape) == (3, 224, 224)
        back = (b * torch.tensor(IMAGENET_STD).view(3, 1, 1) + torch.tensor(IMAGENET_MEAN).view(3, 1, 1)) * 255
        assert (back - a.float()).abs().max() < 1e-3


def test_random_draws_follow_torchs_generator(small_dataset: Path) -> None:
    data, _ = FolderSource(small_dataset).read(0)
    t = build_transform(load_preset("heavy-augment").transform)
    torch.manual_seed(7)
    a = t(data)
    torch.manual_seed(7)
    b = t(data)
    torch.manual_seed(8)
    c = t(data)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_rrc_fallback_is_a_centred_crop_of_clamped_ratio() -> None:
    # A 1000 x 10 strip: no attempt fits, the fallback keeps the height and 4/3 of it.
    torch.manual_seed(0)
    i, j, h, w = geometry.rrc_params(1000, 10, (0.9, 1.0), (3 / 4, 4 / 3))
    assert (h, w) == (10, 13) and (i, j) == (0, (1000 - 13) // 2)


# -- the fast pipeline ------------------------------------------------------------------

def test_reduction_keeps_the_resample_a_downscale_by_two() -> None:
    def geo(side: int) -> geometry.Geometry:
        return geometry.Geometry(box=(0, 0, side, side), out=(224, 224), crop=(0, 0), pad=False,
                                 flip=False)

    assert geo(447).reduction() == 1      # 447 / 2 < 2 x 224: no room
    assert geo(896).reduction() == 2      # 896 / 2 = 448 = 2 x 224
    assert geo(1791).reduction() == 2
    assert geo(1792).reduction() == 4
    assert geo(4000).reduction() == 8
    assert geo(1000).reduction(gap=1.0) == 4


DECODERS = ["pil", pytest.param("simplejpeg", marks=pytest.mark.skipif(
    __import__("importlib").util.find_spec("simplejpeg") is None,
    reason="simplejpeg not installed (pip install 'autotune-loader[fast]')"))]


@pytest.mark.parametrize("decoder", DECODERS)
def test_fast_is_within_the_stated_tolerance(decoder: str) -> None:
    exact = ImagenetTrainTransform()
    fast = ImagenetTrainTransform(fast=True, decoder=decoder)
    blobs = [render_jpeg(11, i)[0] for i in range(12)]          # 300-500 px: full scale
    blobs += [_photo(i, *size) for i, size in enumerate([(1600, 1200), (1200, 1600), (2400, 1800),
                                                         (3000, 2000)] * 3)]
    worst = {"full_scale": 0.0, "dct_scaled": 0.0}
    scaled = 0
    for i, data in enumerate(blobs):
        torch.manual_seed(i)
        k = geometry.plan(fast.spec, *open_image(data).size).reduction()
        torch.manual_seed(i)
        a = exact(data)
        torch.manual_seed(i)
        b = fast(data)
        assert b.dtype == torch.float32 and tuple(b.shape) == (3, 224, 224) and b.is_contiguous()
        key = "dct_scaled" if k > 1 else "full_scale"
        scaled += k > 1
        worst[key] = max(worst[key], _levels(a, b))
        assert _levels(a, b) <= FAST_TOLERANCE[key], (i, k, _levels(a, b))
    assert scaled >= 4, "the test must exercise DCT-domain downscaling"
    assert worst["dct_scaled"] > 0  # a reduced decode is not the same pixels: the bound is real


@pytest.mark.parametrize("mode", ["center", "random"])
def test_fast_resize_then_crop_is_within_tolerance(small_dataset: Path, mode: str) -> None:
    src = FolderSource(small_dataset)
    ex = build_transform(TransformSpec(resize=256, crop_mode=mode, flip=True))
    fa = build_transform(TransformSpec(resize=256, crop_mode=mode, flip=True, exact=False))
    for i in range(8):
        data, _ = src.read(i)
        torch.manual_seed(i)
        a = ex(data)
        torch.manual_seed(i)
        b = fa(data)
        assert _levels(a, b) <= FAST_TOLERANCE["full_scale"], i


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("mode", ["L", "CMYK", "RGBA", "P"])
def test_non_rgb_images_give_3x224x224_on_both_paths(tmp_path: Path, mode: str, decoder: str) -> None:
    for size in ((500, 375), (100, 80)):  # the second is padded by the random crop
        im = Image.new("RGB", size, (200, 30, 40)).convert(mode)
        buf = io.BytesIO()
        im.save(buf, format="PNG" if mode in ("RGBA", "P") else "JPEG")
        for spec in (TransformSpec(resize=None, crop_mode="random", flip=True, decoder=decoder,
                                   exact=False),
                     TransformSpec(crop_mode="random_resized", decoder=decoder, draft=True, exact=False),
                     TransformSpec(crop_mode="random_resized")):
            torch.manual_seed(0)
            out = build_transform(spec)(buf.getvalue())
            assert tuple(out.shape) == (3, 224, 224) and out.dtype == torch.float32, spec


def test_simplejpeg_missing_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "simplejpeg", None)  # import simplejpeg -> ImportError
    with pytest.raises(UsageError, match=r"needs the simplejpeg package.*pip install 'autotune-loader\[fast\]'"):
        build_transform(load_preset("resnet50-fast").transform)
    with pytest.raises(UsageError, match="simplejpeg"):
        ImagenetTrainTransform(fast=True)
    ImagenetTrainTransform(fast=True, decoder="pil")  # the fast path without the extra


# -- the public object and the spec -----------------------------------------------------

def test_imagenet_train_transform_is_the_presets_and_trains(small_dataset: Path) -> None:
    from torch.utils.data import DataLoader

    from autotune.data.torchds import ImageDataset

    assert ImagenetTrainTransform().spec == load_preset("resnet50").transform
    fast = ImagenetTrainTransform(fast=True, decoder="pil")
    assert fast.spec == TransformSpec.from_dict({**load_preset("resnet50-fast").transform.to_dict(),
                                                 "decoder": "pil"})
    t = pickle.loads(pickle.dumps(fast))  # DataLoader workers get a pickled copy
    files = sorted(small_dataset.rglob("*.jpg"))
    torch.manual_seed(0)
    a = t(files[0])  # a path works as well as bytes
    torch.manual_seed(0)
    assert torch.equal(a, fast(files[0].read_bytes()))
    ds = ImageDataset(FolderSource(small_dataset), ImagenetTrainTransform())
    x, y = next(iter(DataLoader(ds, batch_size=8, num_workers=0)))
    assert x.dtype == torch.float32 and tuple(x.shape) == (8, 3, 224, 224) and y.shape == (8,)
    assert "ImagenetTrainTransform(fast=True)" in (ImagenetTrainTransform.__doc__ or "")


@pytest.mark.parametrize("bad, msg", [
    ({"decoder": "turbo"}, "transform decoder must be pil or simplejpeg, but got 'turbo'."),
    ({"output": "float16"}, "transform output must be float32 or uint8, but got 'float16'."),
    ({"output": "uint8"}, "transform normalize needs output float32, but got output 'uint8'"),
    ({"mean": [0.5, 0.5]}, "transform mean must be three numbers (R, G, B), but got [0.5, 0.5]."),
    ({"std": [0.2, 0.0, 0.2]}, "transform std must be three numbers > 0, but got [0.2, 0.0, 0.2]."),
    ({"exact": "yes"}, "transform exact must be true or false, but got 'yes'."),
])
def test_spec_errors_name_the_setting_and_value(tmp_path: Path, bad: dict, msg: str) -> None:
    with pytest.raises(UsageError) as e:
        TransformSpec.from_dict(bad)
    assert msg in str(e.value)
    y = tmp_path / "p.yaml"  # and from a preset file, naming the file
    y.write_text("batch_size: 8\ntransform: " + str(bad).replace("'", '"') + "\n")
    with pytest.raises(UsageError, match=f"preset {y}"):
        load_preset(y)


def test_spec_round_trips_and_says_what_it_does() -> None:
    for name in ("resnet50", "resnet50-fast", "decode-only", "heavy-augment"):
        spec = load_preset(name).transform
        assert TransformSpec.from_dict(spec.to_dict()) == spec
        assert "float32 normalised" in spec.describe()
    fast = load_preset("resnet50-fast").transform.describe()
    assert "simplejpeg" in fast and "DRAFT" in fast and "FAST" in fast
    assert "FAST" not in load_preset("resnet50").transform.describe()


# -- the pixel limit, read from the header before decoding -------------------------------

def _claiming(fmt: str, width: int, height: int) -> bytes:
    """An 8x8 image whose header says width x height (a JPEG's SOF0, a PNG's IHDR)."""
    import struct
    import zlib

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 200, 30)).save(buf, format=fmt)
    d = bytearray(buf.getvalue())
    if fmt == "JPEG":
        struct.pack_into(">HH", d, d.index(b"\xff\xc0") + 5, height, width)
    else:
        struct.pack_into(">II", d, 16, width, height)
        struct.pack_into(">I", d, 29, zlib.crc32(bytes(d[12:29])))
    return bytes(d)


@pytest.mark.filterwarnings("error")  # Pillow's DecompressionBombWarning must not escape
@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
@pytest.mark.parametrize("width, height", [(40000, 40000), (10000, 10000)])  # >2x, 1x-2x
def test_an_image_over_the_pixel_limit_is_refused_before_decoding(fmt, decoder, width, height):
    """simplejpeg had no limit at all (a 40000 x 40000 header would be decoded: 4.8 GB);
    Pillow's warned between 1x and 2x the limit and let the image through."""
    with pytest.raises(SampleError, match=rf"image of {width} x {height} = [\d,]+ pixels is "
                                          r"over the limit of 89,478,485 "
                                          r"\(PIL\.Image\.MAX_IMAGE_PIXELS\)"):
        open_image(_claiming(fmt, width, height), decoder)


@pytest.mark.parametrize("decoder", DECODERS)
def test_the_pixel_limit_is_pillows_setting(monkeypatch, decoder):
    data = _claiming("JPEG", 8, 8)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 63)
    with pytest.raises(SampleError, match=r"image of 8 x 8 = 64 pixels is over the limit of 63"):
        open_image(data, decoder)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)  # off, as Pillow's
    assert open_image(_claiming("JPEG", 10000, 10000), decoder).size == (10000, 10000)


@pytest.mark.parametrize("decoder", DECODERS)
def test_a_bomb_in_a_dataset_names_its_file_and_dimensions(tmp_path, decoder):
    from autotune.data.torchds import ImageDataset

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "bomb.jpg").write_bytes(_claiming("JPEG", 40000, 40000))
    ds = ImageDataset(FolderSource(tmp_path), build_transform(TransformSpec(decoder=decoder)))
    with pytest.raises(SampleError, match=r"a/bomb\.jpg.*: cannot decode \(SampleError: image "
                                          r"of 40000 x 40000 = 1,600,000,000 pixels"):
        ds[0]
