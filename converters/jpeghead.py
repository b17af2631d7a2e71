"""A JPEG's size and mode read from its markers, for the header checks of a conversion.

Pillow's `Image.open` of a small JPEG costs about 80 us (a file object, the plugin's
marker handlers, a dict of everything it finds); at ImageNet's count that is most of a
conversion of small files. Walking the markers up to the start of scan gives the same
size and mode in a few microseconds.

It answers only for a header Pillow reads the same way, and says None for anything else,
so that Pillow decides: the answer is never one Pillow would not give. None for: no
SOI, padding or stray bytes between markers, a marker without a length (RSTn, SOI,
EOI, JPG, JPGn), a segment running past the data, a SOF that is not 8-bit with 1 or 3
components (CMYK, 12-bit), more than one SOF, a malformed DQT, and the segments Pillow
parses further (EXIF, ICC profiles, Photoshop blocks, an MPF index, a short JFIF or
Adobe block),
and a size of zero or over Pillow's decompression bomb limit.
"""

from __future__ import annotations

_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE,
                  0xCF, 0xDE})
_LENGTHLESS = frozenset({0xC8, *range(0xD0, 0xDA), *range(0xF0, 0xFE)})
_MODES = {1: "L", 3: "RGB"}


def _dqt_ok(seg: memoryview) -> bool:
    """As Pillow's DQT handler reads it: each table is 1 + 64 x its precision bytes."""
    i, n = 0, len(seg)
    while i < n:
        i += 1 + (64 if seg[i] < 16 else 128)
        if i > n:
            return False
    return True


def _app_ok(marker: int, seg: memoryview) -> bool:
    """APPn segments Pillow stores as they are; the ones it parses further go to it."""
    head = bytes(seg[:14])
    if marker == 0xE0 and head.startswith(b"JFIF"):
        return len(seg) >= 7
    if marker == 0xE1 and head.startswith(b"Exif\0\0"):
        return False
    if marker == 0xE2 and (head.startswith(b"ICC_PROFILE\0") or head.startswith(b"MPF\0")):
        return False
    if marker == 0xEE and head.startswith(b"Adobe"):
        return len(seg) >= 7
    return not (marker == 0xED and head.startswith(b"Photoshop 3.0\0"))


def jpeg_header(data: bytes | memoryview, max_pixels: int | None) -> tuple[tuple[int, int], str] | None:
    """((width, height), mode) of a JPEG whose header Pillow reads the same way; None
    when Pillow must decide (see the module docstring)."""
    mv = memoryview(data)
    n = len(mv)
    if n < 4 or mv[0] != 0xFF or mv[1] != 0xD8 or mv[2] != 0xFF:
        return None
    pos, found = 2, None
    while pos + 4 <= n:
        if mv[pos] != 0xFF:
            return None
        marker = mv[pos + 1]
        if marker < 0xC0 or marker in _LENGTHLESS or marker == 0xFF:
            return None
        length = (mv[pos + 2] << 8) | mv[pos + 3]
        end = pos + 2 + length
        if length < 2 or end > n:
            return None
        seg = mv[pos + 4:end]
        if marker == 0xDA:                      # start of scan: the header is complete
            if found is None:
                return None
            (w, h), mode = found
            if w < 1 or h < 1 or (max_pixels is not None and w * h > max_pixels):
                return None
            return found
        if marker in _SOF:
            if found is not None or len(seg) < 6 or seg[0] != 8 or seg[5] not in _MODES:
                return None
            found = ((seg[3] << 8) | seg[4], (seg[1] << 8) | seg[2]), _MODES[seg[5]]
        elif marker == 0xDB:
            if not _dqt_ok(seg):
                return None
        elif 0xE0 <= marker <= 0xEF and not _app_ok(marker, seg):
            return None
        pos = end
    return None


__all__ = ["jpeg_header"]
