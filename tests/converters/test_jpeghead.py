"""The JPEG header read without Pillow (autotune_converters.jpeghead): the same size and
mode as Pillow's for every header it answers for, on real encoder output and on thousands
of damaged headers, and the header checks' verdicts unchanged by it."""

from __future__ import annotations

import io
import random

import pytest
from PIL import Image

from autotune_converters import images
from autotune_converters.images import BadImage, check_image
from autotune_converters.jpeghead import jpeg_header

LIMIT = Image.MAX_IMAGE_PIXELS


def _jpeg(mode: str = "RGB", size: tuple[int, int] = (40, 28), **kw) -> bytes:
    im = Image.new(mode, size, (90, 160, 30) if mode == "RGB" else 128)
    if mode == "RGB":  # some detail, so the entropy-coded data is not trivial
        for x in range(0, size[0], 3):
            im.putpixel((x, x % size[1]), (255, 0, 0))
    b = io.BytesIO()
    im.save(b, "JPEG", **kw)
    return b.getvalue()


def _exif() -> bytes:
    ex = Image.Exif()
    ex[0x0112] = 6
    return ex.tobytes()


ANSWERED = {
    "baseline": _jpeg(),
    "progressive": _jpeg(progressive=True),
    "grayscale": _jpeg("L"),
    "4:4:4": _jpeg(subsampling=0, quality=95),
    "comment": _jpeg(comment=b"index 17"),
    "optimized": _jpeg(optimize=True),
    "large": _jpeg(size=(1000, 700)),
}
LEFT_TO_PILLOW = {
    "exif": _jpeg(exif=_exif()),
    "icc": _jpeg(icc_profile=b"\0" * 200),
    "cmyk": _jpeg("CMYK"),
}


def _pillow(data: bytes) -> tuple[str, tuple[int, int], str] | str:
    try:
        im = Image.open(io.BytesIO(data))
        return im.format, im.size, im.mode
    except Exception as e:  # noqa: BLE001
        return type(e).__name__


@pytest.mark.parametrize("name", sorted(ANSWERED))
def test_encoder_output_is_answered_as_pillow_reads_it(name):
    data = ANSWERED[name]
    fmt, size, mode = _pillow(data)
    assert fmt == "JPEG"
    assert jpeg_header(data, LIMIT) == (size, mode)


@pytest.mark.parametrize("name", sorted(LEFT_TO_PILLOW))
def test_what_pillow_parses_further_is_left_to_it(name):
    assert jpeg_header(LEFT_TO_PILLOW[name], LIMIT) is None


def test_no_jpeg_a_bomb_and_a_zero_size_are_left_to_pillow():
    data = ANSWERED["baseline"]
    assert jpeg_header(b"", LIMIT) is None and jpeg_header(b"\x89PNG\r\n\x1a\n", LIMIT) is None
    assert jpeg_header(data, 40 * 28 - 1) is None      # over the bomb limit: Pillow says so
    assert jpeg_header(data, 40 * 28) == ((40, 28), "RGB")
    sof = data.index(b"\xff\xc0")
    zero = data[:sof + 5] + b"\0\0" + data[sof + 7:]   # height 0
    assert jpeg_header(zero, LIMIT) is None


@pytest.mark.parametrize("segment", [b"\xff\xe0\x00\x06JFIF", b"\xff\xee\x00\x07Adobe"])
def test_a_short_jfif_or_adobe_block_is_left_to_pillow_which_refuses_it(segment):
    data = ANSWERED["baseline"]
    at = data.index(b"\xff\xe0")
    bad = data[:at] + segment + data[at + 2 + int.from_bytes(data[at + 2:at + 4], "big"):]
    assert jpeg_header(bad, LIMIT) is None
    with pytest.raises(BadImage, match="not an image"):
        check_image(bad)


def _via_pillow(data: bytes, monkeypatch) -> tuple[str, tuple[int, int]] | str:
    with monkeypatch.context() as m:
        m.setattr(images, "jpeg_header", lambda d, limit: None)
        return _verdict(data)


def _verdict(data: bytes) -> tuple[str, tuple[int, int]] | str:
    try:
        return check_image(data)
    except BadImage as e:
        return f"bad: {e}"


def test_damaged_headers_never_get_an_answer_pillow_would_not_give(monkeypatch):
    # 4,000 headers damaged at random (bytes changed, inserted, cut out, the file cut
    # short) in the part before the scan: wherever the reader answers, Pillow opens the
    # same size and mode as a JPEG, and the header checks' verdict is the one Pillow's
    # path gives.
    rng = random.Random(7)
    answered = 0
    for base in (*ANSWERED.values(), *LEFT_TO_PILLOW.values()):
        sos = base.index(b"\xff\xda") + 14
        for _ in range(400):
            b = bytearray(base)
            for _ in range(rng.choice((1, 1, 2, 4))):
                at = rng.randrange(2, min(sos, len(b)))
                kind = rng.random()
                if kind < 0.6:
                    b[at] = rng.choice((0, 0xFF, 0xC0, 0xD8, 0xDA, rng.randrange(256)))
                elif kind < 0.75:
                    b[at:at] = bytes([rng.randrange(256)])
                elif kind < 0.9:
                    del b[at:at + rng.randrange(1, 5)]
                else:
                    del b[at:]
            data = bytes(b)
            got = jpeg_header(data, LIMIT)
            if got is None:
                continue
            answered += 1
            assert _pillow(data) == ("JPEG", *got), (data[:sos].hex(), got)
            assert _verdict(data) == _via_pillow(data, monkeypatch), data[:sos].hex()
    # Most damage makes the header one it leaves to Pillow; some leaves a readable one.
    assert answered > 100
