"""Read one source image, check it, and optionally re-encode it: the per-sample work.

Checks (`verify`):
- "header" (default, cheap enough to keep the conversion disk-bound): the file is not
  empty, Pillow identifies it from its header, its size is within Pillow's decompression
  bomb limit (`Image.MAX_IMAGE_PIXELS`), its mode converts to RGB (as the training
  pipeline does), and it is complete: a JPEG must end with its end-of-image marker and a
  PNG with its IEND chunk; when it does not (truncated, or trailing bytes after the image)
  the image is decoded to decide, at reduced scale for JPEG (libjpeg still reads every
  entropy-coded byte, so truncation is caught).
- "decode": every image is fully decoded and converted to RGB, as the training pipeline
  will (and a PNG's chunk CRCs are verified); costs a full decode per image. An image
  passes when training could decode it: libjpeg decodes some corrupt JPEG data with
  only a warning, and so does this check.

Pillow's global `ImageFile.LOAD_TRUNCATED_IMAGES` is never set: a truncated image is an
error here, as it would be in training. EXIF orientation is not applied, as torchvision's
ImageFolder does not apply it either: the stored bytes are the original ones, and a
re-encoded image keeps its pixel order and its Orientation tag.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from functools import lru_cache

from autotune_converters.jpeghead import jpeg_header
from autotune_converters.records import Entry, Sample, SkippedFile

# Pillow format name -> member suffix. MPO is a camera JPEG with extra frames.
FORMAT_EXT = {"JPEG": "jpg", "MPO": "jpg", "PNG": "png", "WEBP": "webp", "BMP": "bmp",
              "TIFF": "tiff", "PPM": "ppm", "GIF": "gif"}
VERIFY_LEVELS = ("header", "decode")
_EXIF_ORIENTATION = 0x0112


@dataclass(frozen=True)
class SampleOptions:
    """How each sample is checked and re-encoded (picklable, sent to workers)."""

    root: str
    verify: str = "header"
    max_side: int | None = None
    quality: int = 90


class BadImage(Exception):
    """The image cannot be used; str() is the reason recorded in skipped[]."""


def unreadable(entry: Entry, e: OSError) -> SkippedFile:
    return SkippedFile(entry.relpath, f"unreadable ({e.strerror or e})")


def check_sample(entry: Entry, data: bytes | memoryview, opts: SampleOptions) -> Sample | SkippedFile:
    """Check (and maybe re-encode) the bytes read for `entry`. The Sample's data is
    `data` itself (no copy) unless the image was re-encoded."""
    try:
        fmt, size = check_image(data, opts.verify)
        if opts.max_side and max(size) > opts.max_side:
            new = reencode(bytes(data), opts.max_side, opts.quality)
            return Sample(entry.position, entry.label, entry.relpath, "jpg", new,
                          source_bytes=len(data), reencoded=True)
    except BadImage as e:
        return SkippedFile(entry.relpath, str(e))
    return Sample(entry.position, entry.label, entry.relpath, FORMAT_EXT.get(fmt, fmt.lower()),
                  data, source_bytes=len(data))


def _head(data: bytes) -> str:
    """The first bytes, printable, for 'not an image' reasons."""
    s = bytes(data[:24]).decode("latin-1")
    return "".join(c if 32 <= ord(c) < 127 else "." for c in s)


@lru_cache(maxsize=64)
def _mode_converts(mode: str) -> bool:
    from PIL import Image

    try:
        Image.new(mode, (1, 1)).convert("RGB")
        return True
    except (ValueError, OSError):
        return False


def _max_pixels() -> int | None:
    """Pillow's decompression bomb limit, as it is now (a user may change it)."""
    from PIL import Image

    return Image.MAX_IMAGE_PIXELS


def _open(data: bytes):  # -> PIL.Image.Image
    from PIL import Image, UnidentifiedImageError

    # Pillow warns between 1x and 2x MAX_IMAGE_PIXELS and raises above: treat both as
    # bombs (the warning would otherwise print from a worker and let the image through).
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            return Image.open(io.BytesIO(data))
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
            raise BadImage(f"decompression bomb ({e})") from None
        except UnidentifiedImageError:
            raise BadImage(f"not an image (starts with {_head(data)!r}, "
                           f"{len(data)} bytes)") from None
        except (OSError, SyntaxError, ValueError, EOFError) as e:
            raise BadImage(f"corrupt header ({type(e).__name__}: {e})") from None


_PREFIX = 16 << 10


def _open_header(data: bytes | memoryview):  # -> PIL.Image.Image
    """Image.open for the header checks. A JPEG's or PNG's header is in its first KBs:
    opening a copy of a 16 KiB prefix spares a copy of the whole file; when the prefix
    is not enough (or anything about it fails) the whole file decides, so the verdict is
    always the one the whole file gets."""
    if len(data) > 2 * _PREFIX and bytes(data[:2]) in (b"\xff\xd8", b"\x89P"):
        try:
            return _open(bytes(data[:_PREFIX]))
        except BadImage:
            pass
    return _open(data)


def _decode(data: bytes, fmt: str, reduced: bool) -> None:
    im = _open(data)
    try:
        if reduced and fmt in ("JPEG", "MPO"):
            im.draft("RGB", (max(1, im.width // 8), max(1, im.height // 8)))
        im.load()
        if not reduced:
            im.convert("RGB")
            if fmt == "PNG":
                _open(data).verify()  # chunk CRCs: load() does not check them
    except BadImage:
        raise
    except Exception as e:  # noqa: BLE001 (any decoder failure is this image's fault)
        msg = str(e)
        kind = "truncated" if "truncated" in msg or isinstance(e, EOFError) else "corrupt"
        raise BadImage(f"{kind} {fmt} ({type(e).__name__}: {msg})") from None


def check_image(data: bytes, verify: str = "header") -> tuple[str, tuple[int, int]]:
    """Check one encoded image; return (Pillow format, (width, height)).

    Raises BadImage with the reason (empty, not an image, decompression bomb, corrupt
    header, unsupported mode, truncated or corrupt data).
    """
    if not data:
        raise BadImage("empty file (0 bytes)")
    # Most JPEGs: their markers read here, as Pillow would read them (jpeghead); any
    # header it does not answer for, Pillow opens.
    head = jpeg_header(data, _max_pixels())
    if head is not None:
        fmt, (size, mode) = "JPEG", head
    else:
        im = _open_header(data)
        fmt, size, mode = im.format or "?", im.size, im.mode
    if size[0] < 1 or size[1] < 1:
        raise BadImage(f"corrupt header (size {size[0]}x{size[1]})")
    if not _mode_converts(mode):
        raise BadImage(f"unsupported mode ({mode} does not convert to RGB)")
    if verify == "decode":
        _decode(data, fmt, reduced=False)
    elif fmt in ("JPEG", "MPO"):
        if not bytes(data[-64:]).rstrip(b"\0\r\n ").endswith(b"\xff\xd9") \
                and not bytes(data).rstrip(b"\0\r\n ").endswith(b"\xff\xd9"):
            _decode(data, fmt, reduced=True)  # no EOI: truncated, or trailing data?
    elif fmt == "PNG":
        if bytes(data[-8:-4]) != b"IEND":
            _decode(data, fmt, reduced=False)
    return fmt, size


def reencode(data: bytes, max_side: int, quality: int) -> bytes:
    """Shrink so the longer side is `max_side`, as an RGB JPEG at `quality`.

    RGB because the training pipeline converts every image to RGB anyway; the EXIF
    Orientation tag is carried over (pixels are not rotated), everything else dropped.
    """
    from PIL import Image

    im = _open(data)
    try:
        orientation = im.getexif().get(_EXIF_ORIENTATION)
    except Exception:  # noqa: BLE001 (a broken EXIF block is not worth a skip)
        orientation = None
    w, h = im.size
    scale = max_side / max(w, h)
    target = (max(1, round(w * scale)), max(1, round(h * scale)))
    try:
        if im.format in ("JPEG", "MPO"):
            im.draft("RGB", target)  # DCT-domain downscale first: much less to decode
        im = im.convert("RGB").resize(target, Image.LANCZOS, reducing_gap=3.0)
    except Exception as e:  # noqa: BLE001
        raise BadImage(f"corrupt {im.format} ({type(e).__name__}: {e})") from None
    out = io.BytesIO()
    kw = {}
    if orientation and orientation != 1:
        exif = Image.Exif()
        exif[_EXIF_ORIENTATION] = orientation
        kw["exif"] = exif.tobytes()
    im.save(out, format="JPEG", quality=quality, **kw)
    return out.getvalue()
