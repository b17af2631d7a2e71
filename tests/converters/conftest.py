"""Fixtures for the converter tests: small real image folders (good and hostile), the
two output formats as one parameter, and helpers to run and read conversions.

Helpers are fixtures returning functions (test modules cannot import conftest).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["lmdb", "wds"])
def fmt(request: pytest.FixtureRequest) -> str:
    """Every writer/reader contract test runs for both formats."""
    return request.param


@pytest.fixture(scope="session")
def img_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """96 ImageNet-like JPEGs (~80 KB each) in 4 classes, made once per session."""
    from autotune.synth import make_image_folder

    root = tmp_path_factory.mktemp("convsrc") / "train"
    make_image_folder(root, 96, 4, seed=3, workers=1)
    return root


def _jpeg(size=(64, 48), mode="RGB", **save) -> bytes:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(size[0] * 7 + size[1])
    arr = rng.integers(0, 255, size=(size[1], size[0], 3), dtype=np.uint8)
    im = Image.fromarray(arr)
    if mode != "RGB":
        im = im.convert(mode)
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=85, **save)
    return buf.getvalue()


def _png(im) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def bomb_png(w: int = 30000, h: int = 30000) -> bytes:
    """A valid PNG header claiming w x h pixels (900 MP) with a tiny body."""
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr)
            + _png_chunk(b"IDAT", zlib.compress(b"\0" * 64)) + _png_chunk(b"IEND", b""))


# What each hostile file in `bad_src` should become: "keep", or the start of the
# reason it is skipped with (None: not an image candidate at all).
BAD_CASES: dict[str, str | None] = {
    "a/truncated.jpg": "truncated",
    "a/empty.jpg": "empty file",
    "a/page.jpg": "not an image",
    "a/bomb.png": "decompression bomb",
    "a/cmyk.jpg": "keep",
    "a/palette.png": "keep",
    "a/la.png": "keep",
    "a/sixteen.png": "keep",
    "a/exif_rot.jpg": "keep",
    "a/dup.jpg": "keep",
    "a/dup.png": "keep",
    "b/name.with.dots and spaces é.jpg": "keep",
    "b/ünïcödé 名前.JPG": "keep",
    "b/fifo.jpg": "not a regular file",
    "b/broken.jpg": "broken symlink",
    "b/sub/deep.jpeg": "keep",
    "b/loop/": "directory loop",
    "b/self/": "directory loop",
    "b/.hidden.jpg": None,
    "b/notes.txt": None,
}


@pytest.fixture(scope="session")
def bad_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An image folder holding every kind of bad input the converter must handle."""
    import numpy as np
    from PIL import Image

    root = tmp_path_factory.mktemp("badsrc") / "train"
    (root / "a").mkdir(parents=True)
    (root / "b" / "sub").mkdir(parents=True)
    good = _jpeg((120, 90))
    (root / "a" / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (root / "a" / "empty.jpg").write_bytes(b"")
    (root / "a" / "page.jpg").write_bytes(b"<!DOCTYPE html><html><body>404</body></html>\n")
    (root / "a" / "bomb.png").write_bytes(bomb_png())
    (root / "a" / "cmyk.jpg").write_bytes(_jpeg((80, 60), mode="CMYK"))
    rgb = Image.fromarray(np.random.default_rng(1).integers(0, 255, (40, 50, 3), dtype=np.uint8))
    (root / "a" / "palette.png").write_bytes(_png(rgb.convert("P")))
    (root / "a" / "la.png").write_bytes(_png(rgb.convert("LA")))
    (root / "a" / "sixteen.png").write_bytes(
        _png(Image.fromarray((np.arange(40 * 50).reshape(40, 50) * 20).astype(np.uint16))))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 CW when displayed
    (root / "a" / "exif_rot.jpg").write_bytes(_jpeg((100, 50), exif=exif.tobytes()))
    (root / "a" / "dup.jpg").write_bytes(_jpeg((30, 30)))
    (root / "a" / "dup.png").write_bytes(_png(rgb))
    (root / "b" / "name.with.dots and spaces é.jpg").write_bytes(_jpeg((70, 40)))
    (root / "b" / "ünïcödé 名前.JPG").write_bytes(_jpeg((40, 70)))
    os.mkfifo(root / "b" / "fifo.jpg")
    os.symlink(root / "b" / "gone.jpg", root / "b" / "broken.jpg")
    (root / "b" / "sub" / "deep.jpeg").write_bytes(_jpeg((33, 44)))
    os.symlink("..", root / "b" / "loop")  # b/loop -> SRC: a loop through the root
    os.symlink(".", root / "b" / "self")  # b/self -> b
    (root / "b" / ".hidden.jpg").write_bytes(_jpeg((10, 10)))
    (root / "b" / "notes.txt").write_text("not an image\n")
    return root


@pytest.fixture
def bad_cases() -> dict[str, str | None]:
    return dict(BAD_CASES)


@pytest.fixture
def run_cli() -> Callable[..., subprocess.CompletedProcess]:
    """Run `autotune convert` as a user would: a real process."""
    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "autotune", "convert", "-q", *map(str, args)],
                              capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    return run


@pytest.fixture
def popen_cli() -> Callable[..., subprocess.Popen]:
    def start(*args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "autotune", "convert", "-q",
                                 *map(str, args)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, cwd=ROOT)
    return start


def _tree_digest(dst: Path) -> dict[str, str]:
    out = {}
    for p in sorted(dst.iterdir()):
        if p.name == "manifest.json":
            m = json.loads(p.read_text())
            m.pop("created")
            out[p.name] = hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest()
        elif p.name == "lock.mdb":
            continue  # created by other LMDB tools (mdb_stat), not by autotune
        elif p.is_file():
            out[p.name] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[p.name + "/"] = "dir"
    return out


@pytest.fixture
def tree_digest() -> Callable[[Path], dict[str, str]]:
    """sha256 of every output file (the manifest without its 'created' field)."""
    return _tree_digest


def _read_all(dst: Path) -> dict[str, tuple[bytes, int]]:
    """{original relative path: (stored bytes, label)} through autotune's own reader."""
    from autotune_converters import open_converted

    src = open_converted(dst)
    out: dict[str, tuple[bytes, int]] = {}
    for data, label, path in src.records():
        assert path not in out, f"{path} stored twice"
        out[path] = (data, label)
    return out


@pytest.fixture
def read_all() -> Callable[[Path], dict[str, tuple[bytes, int]]]:
    return _read_all
