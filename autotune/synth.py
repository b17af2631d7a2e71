"""Synthetic ImageNet-like image folders for tests, benchmarks and the demo.

Real photos are neither noise (incompressible, far too large) nor flat colour (tiny): a
smooth random field plus fine grain lands JPEG sizes where ImageNet's are (typical file
40-150 KB at 300-500 px sides, quality 75-90). Deterministic by seed: image i depends
only on (seed, i), so any subset can be made in parallel and reproduced.

`make_scale_folder` is the other kind: ImageNet's *count* (1.28 million files, 1,000
classes) at a small size (a mean of a few KiB), in minutes rather than the hours and the
140 GB real-sized images would take. A pool of small JPEGs is rendered once and every
file is one of them with its index in a JPEG comment: every file distinct, every file a
valid JPEG that decodes to its pool image.
"""

from __future__ import annotations

import io
import os
import shutil
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class SynthResult:
    root: Path
    images: int
    classes: int
    bytes: int
    created: int  # images written now (the rest existed already)


def render_jpeg(seed: int, index: int) -> tuple[bytes, int]:
    """One image's JPEG bytes and its class-independent size in bytes."""
    from PIL import Image

    rng = np.random.default_rng([seed, index])
    w, h = (int(v) for v in rng.integers(300, 501, size=2))
    q = int(rng.integers(75, 91))
    # Coarse colour field, upsampled smoothly: large structures like a photo's.
    cw, ch = max(2, w // int(rng.integers(6, 14))), max(2, h // int(rng.integers(6, 14)))
    coarse = rng.integers(0, 256, size=(ch, cw, 3), dtype=np.uint8)
    img = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BICUBIC), dtype=np.int16)
    # Fine grain: texture that JPEG must spend bits on, as on real photos.
    grain = rng.normal(0.0, float(rng.uniform(14, 30)), size=(h, w, 1))
    img = np.clip(img + grain, 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=q)
    data = buf.getvalue()
    return data, len(data)


def _write_range(root: str, seed: int, classes: int, start: int, stop: int) -> tuple[int, int]:
    written = nbytes = 0
    for i in range(start, stop):
        cls = i % classes
        path = os.path.join(root, f"class_{cls:04d}", f"img_{i:07d}.jpg")
        if os.path.exists(path):
            nbytes += os.path.getsize(path)
            continue
        data, n = render_jpeg(seed, i)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # a killed run never leaves a half image under a final name
        written += 1
        nbytes += n
    return written, nbytes


def make_image_folder(root: str | os.PathLike[str], images: int, classes: int = 100, *,
                      seed: int = 0, workers: int | None = None) -> SynthResult:
    """Create (or complete) an image folder `root/class_XXXX/img_XXXXXXX.jpg`.

    Idempotent: existing images are kept, so a rerun after a crash only adds what is
    missing. Uses `workers` processes (default: all cores).
    """
    if images < 1:
        raise ValueError(f"images must be at least 1, but got {images}.")
    if not 1 <= classes <= images:
        raise ValueError(f"classes must be between 1 and images ({images}), but got {classes}.")
    rootp = Path(root)
    for c in range(classes):
        (rootp / f"class_{c:04d}").mkdir(parents=True, exist_ok=True)
    workers = workers or os.cpu_count() or 1
    step = 250
    ranges = [(i, min(i + step, images)) for i in range(0, images, step)]
    written = nbytes = 0
    if workers == 1 or len(ranges) == 1:
        for a, b in ranges:
            w, n = _write_range(str(rootp), seed, classes, a, b)
            written += w
            nbytes += n
    else:
        with ProcessPoolExecutor(max_workers=workers) as ex:
            for w, n in ex.map(_write_range, *zip(*[(str(rootp), seed, classes, a, b)
                                                    for a, b in ranges])):
                written += w
                nbytes += n
    return SynthResult(root=rootp, images=images, classes=classes, bytes=nbytes, created=written)


# A comment segment (APP markers are read by some decoders; COM never is): FF FE, a big-endian
# length that counts itself, then the text.
def with_comment(jpeg: bytes, text: bytes) -> bytes:
    return jpeg[:2] + b"\xff\xfe" + (len(text) + 2).to_bytes(2, "big") + text + jpeg[2:]


def render_small_jpeg(seed: int, index: int) -> bytes:
    """A small photo-like JPEG (48-112 px sides, quality 60-85: about 2-6 KiB)."""
    from PIL import Image

    rng = np.random.default_rng([seed, index, 1])
    w, h = (int(v) for v in rng.integers(48, 113, size=2))
    coarse = rng.integers(0, 256, size=(max(2, h // 8), max(2, w // 8), 3), dtype=np.uint8)
    img = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BICUBIC), dtype=np.int16)
    img = np.clip(img + rng.normal(0.0, 12.0, size=(h, w, 1)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=int(rng.integers(60, 86)))
    return buf.getvalue()


def _scale_pool(seed: int, size: int) -> list[bytes]:
    return [render_small_jpeg(seed, i) for i in range(size)]


def _write_scale_classes(root: str, seed: int, images: int, classes: int, pool_size: int,
                         class_ids: list[int]) -> tuple[int, int, int]:
    """Write whole classes; (classes written, files written, bytes written)."""
    pool: list[bytes] = []   # rendered only when a class is missing
    done = files = nbytes = 0
    for c in class_ids:
        final = os.path.join(root, f"class_{c:04d}")
        if os.path.isdir(final):
            continue
        # A class appears under its final name only whole: a killed run leaves a
        # `.partial` folder, which the next run deletes and writes again.
        part = final + ".partial"
        if os.path.isdir(part):
            shutil.rmtree(part)
        os.mkdir(part)
        pool = pool or _scale_pool(seed, pool_size)
        for i in range(c, images, classes):
            data = with_comment(pool[i % pool_size], b"autotune-scale %d" % i)
            with open(os.path.join(part, f"img_{i:07d}.jpg"), "wb") as f:
                f.write(data)
            files += 1
            nbytes += len(data)
        os.rename(part, final)
        done += 1
    return done, files, nbytes


def make_scale_folder(root: str | os.PathLike[str], images: int = 1_281_167,
                      classes: int = 1000, *, seed: int = 0, pool: int = 1024,
                      workers: int | None = None) -> SynthResult:
    """Create (or complete) `root/class_XXXX/img_XXXXXXX.jpg` with `images` small JPEGs.

    Image i is in class i % classes, as in `make_image_folder`. Files are distinct (each
    carries its index in a JPEG comment) but their pixels repeat with period `pool`: a
    scale test of listing, opening and moving files, not of decode variety. Idempotent by
    class: a rerun after a crash writes only the classes missing. Returns the bytes of the
    files written now (0 for a folder that was complete).
    """
    if images < 1:
        raise ValueError(f"images must be at least 1, but got {images}.")
    if not 1 <= classes <= images:
        raise ValueError(f"classes must be between 1 and images ({images}), but got {classes}.")
    if pool < 1:
        raise ValueError(f"pool must be at least 1, but got {pool}.")
    rootp = Path(root)
    rootp.mkdir(parents=True, exist_ok=True)
    workers = max(1, workers or os.cpu_count() or 1)
    parts = [list(range(k, classes, workers)) for k in range(min(workers, classes))]
    args = [(str(rootp), seed, images, classes, min(pool, images), ids) for ids in parts]
    if len(args) == 1:
        results = [_write_scale_classes(*args[0])]
    else:
        with ProcessPoolExecutor(max_workers=len(args)) as ex:
            results = list(ex.map(_write_scale_classes, *zip(*args)))
    return SynthResult(root=rootp, images=images, classes=classes,
                       bytes=sum(r[2] for r in results), created=sum(r[1] for r in results))
