"""Synthetic ImageNet-like image folders for tests, benchmarks and the demo.

Real photos are neither noise (incompressible, far too large) nor flat colour (tiny): a
smooth random field plus fine grain lands JPEG sizes where ImageNet's are (typical file
40-150 KB at 300-500 px sides, quality 75-90). Deterministic by seed: image i depends
only on (seed, i), so any subset can be made in parallel and reproduced.
"""

from __future__ import annotations

import io
import os
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
