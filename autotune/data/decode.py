"""Encoded bytes -> pixels, by Pillow or simplejpeg, optionally shrunk in the DCT domain.

Both decoders are libjpeg-turbo with its accurate integer DCT and fancy upsampling, so at
full size they give the same pixels; simplejpeg decodes straight into a numpy array
(no Pillow image object, no RGBX -> RGB unpacking).

A JPEG can be decoded at 1/2, 1/4 or 1/8 of its size for a fraction of the work (the
inverse DCT computes fewer outputs per 8x8 block). `open_image(...).array(k)` and
`.pil(k)` take that factor; the caller chooses it from the crop it has already drawn
(`Geometry.reduction`), so the resample that follows still only shrinks. Pillow calls
this `draft()`; simplejpeg chooses its scale from a minimum output size.

simplejpeg is an optional dependency (`pip install 'autotune-loader[fast]'`), imported when a
transform asks for it. Files it does not take (PNG, CMYK JPEG, ...) go to Pillow.

Pixel limit: an image's width x height, read from its header, is checked against
Pillow's decompression-bomb limit (`PIL.Image.MAX_IMAGE_PIXELS`, ~89.5 megapixels by
default; None turns it off) before anything is decoded, on both paths: a small file whose
header claims 40000 x 40000 would otherwise allocate 4.8 GB of pixels in every worker.
Over it, SampleError says the dimensions (Pillow's own warning or error never escapes).
"""

from __future__ import annotations

import io
import time
import warnings
from collections.abc import Callable
from typing import Any

from autotune.errors import SampleError, UsageError

DECODERS = ("pil", "simplejpeg")
FAST_INSTALL = "pip install 'autotune-loader[fast]' (or pip install simplejpeg)"
_JPEG_MAGIC = b"\xff\xd8"
_SJ_COLORSPACES = ("YCbCr", "Gray")  # what simplejpeg converts to RGB as Pillow does


def require_simplejpeg() -> Any:
    """The simplejpeg module, or a UsageError naming the install command."""
    try:
        import simplejpeg
    except ImportError:
        raise UsageError(f"transform decoder 'simplejpeg' needs the simplejpeg package, which "
                         f"is not installed: {FAST_INSTALL}, or set decoder: pil.") from None
    return simplejpeg


def _reduced(n: int, k: int) -> int:
    return -(-n // k)  # libjpeg's scaled size: ceil(n / k)


def _factor(size: tuple[int, int], got: tuple[int, int]) -> int:
    """The power-of-two factor that took `size` to `got` (1 when none fits exactly)."""
    for k in (8, 4, 2):
        if (_reduced(size[0], k), _reduced(size[1], k)) == got:
            return k
    return 1


def check_pixels(width: int, height: int) -> None:
    """SampleError when width x height is over `PIL.Image.MAX_IMAGE_PIXELS` (read at each
    call, so a program that raises it, or sets it to None, is obeyed)."""
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and width * height > limit:
        raise SampleError(f"image of {width} x {height} = {width * height:,} pixels is over the "
                          f"limit of {limit:,} (PIL.Image.MAX_IMAGE_PIXELS), checked before "
                          "decoding: a decompression bomb or a damaged header; fix the image, "
                          "or raise PIL.Image.MAX_IMAGE_PIXELS if it is genuine")


def _header_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from the header, by the first plugin that takes it, as Image.open
    tries them but without its bomb check (which raises without saying the size)."""
    from PIL import Image

    Image.init()
    for fmt in list(Image.ID):
        factory, accept = Image.OPEN[fmt]
        try:
            ok = not accept or accept(data[:16])
            if ok and not isinstance(ok, str):
                return factory(io.BytesIO(data), "").size
        except Exception:  # noqa: BLE001 (as Image.open: try the next plugin)
            continue
    return None


def _pil_open(data: bytes) -> Any:
    """Image.open with our pixel check instead of Pillow's bomb warning (1x-2x the
    limit; it would print from every worker and let the image through) and error."""
    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            img = Image.open(io.BytesIO(data))
        except Image.DecompressionBombError as e:
            size = _header_size(data)
            if size is not None:
                check_pixels(*size)
            raise SampleError(f"{e} (PIL.Image.MAX_IMAGE_PIXELS), checked before decoding; "
                              "fix the image, or raise the limit if it is genuine") from None
    check_pixels(*img.size)
    return img


class Opened:
    """One encoded image, header read, pixels not yet decoded. `size` is (width, height)
    at full scale."""

    def __init__(self, data: bytes, decoder: str) -> None:
        t0 = time.perf_counter()
        try:
            self._open(data, decoder)
        finally:
            # Seconds spent decoding so far (the header, then pil()/array()): the
            # pipeline's decode stage (autotune.data.stages).
            self.decode_s = time.perf_counter() - t0

    def _open(self, data: bytes, decoder: str) -> None:
        self.data = data
        self._sj: Any = None
        self._img: Any = None
        if decoder == "simplejpeg" and data[:2] == _JPEG_MAGIC:
            sj = require_simplejpeg()
            try:
                h, w, colorspace, _sub = sj.decode_jpeg_header(data)
            except ValueError:
                colorspace = None
            else:
                check_pixels(int(w), int(h))  # simplejpeg has no limit of its own
            if colorspace in _SJ_COLORSPACES:
                self._sj, self.size = sj, (int(w), int(h))
                return
        self._img = _pil_open(data)
        self.size = self._img.size

    def pil(self, k: int = 1) -> tuple[Any, int]:
        """(PIL image as decoded, in the file's own mode; the factor it was shrunk by)."""
        return self._timed(self._pil, k)

    def array(self, k: int = 1) -> tuple[Any, int]:
        """(HxWx3 uint8 RGB array; the factor the image was shrunk by)."""
        return self._timed(self._array, k)

    def _timed(self, decode: Callable[[int], tuple[Any, int]], k: int) -> tuple[Any, int]:
        t0 = time.perf_counter()
        try:
            return decode(k)
        finally:
            self.decode_s += time.perf_counter() - t0

    def _pil(self, k: int) -> tuple[Any, int]:
        if self._sj is not None:
            from PIL import Image

            arr, k = self._array(k)
            return Image.fromarray(arr, "RGB"), k
        img = self._img
        if k > 1 and img.format == "JPEG":
            # Pillow picks the largest scale s in (8, 4, 2, 1) with s <= min(W // w, H // h):
            # asking for (W // k, H // k) gives exactly k.
            img.draft("RGB", (max(1, self.size[0] // k), max(1, self.size[1] // k)))
        img.load()
        return img, _factor(self.size, img.size) if img.size != self.size else 1

    def _array(self, k: int) -> tuple[Any, int]:
        if self._sj is None:
            import numpy as np

            img, k = self._pil(k)
            if img.mode != "RGB":
                img = img.convert("RGB")
            return np.asarray(img), k
        if k == 1:
            return self._sj.decode_jpeg(self.data, colorspace="RGB"), 1
        # The smallest output at least this large is exactly 1/k (min_factor=2 leaves out
        # the fractional scales 7/8..5/8, which have no SIMD inverse DCT and are slower).
        w, h = _reduced(self.size[0], k), _reduced(self.size[1], k)
        arr = self._sj.decode_jpeg(self.data, colorspace="RGB", min_width=w, min_height=h,
                                   min_factor=2)
        return arr, _factor(self.size, (arr.shape[1], arr.shape[0]))


def open_image(data: bytes, decoder: str = "pil") -> Opened:
    """Read the header of `data` with `decoder` ('pil' or 'simplejpeg')."""
    return Opened(data, decoder)


def scale_box(box: tuple[int, int, int, int], k: int) -> tuple[float, float, float, float]:
    """`box` (left, top, right, bottom) in full-size pixels, in the same image decoded k
    times smaller: pixel i of that image covers source pixels k*i .. k*(i + 1), so the
    edges divide by k exactly (fractions kept: rounding them would shift the crop by up
    to k/2 source pixels, a visible misalignment at 1/8)."""
    return box[0] / k, box[1] / k, box[2] / k, box[3] / k
