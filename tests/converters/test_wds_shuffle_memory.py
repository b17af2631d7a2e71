"""The WebDataset reader's shuffle buffer is bounded in bytes, not only in samples.

1,000 samples of 230 KB images (the default `shuffle_buffer`) held 223 MiB in each
DataLoader worker: two workers reading a 1.2 GB conversion were OOM-killed in a 512 MiB
container. Here 300 samples of ~620 KB go through the default buffer (it grows by one
sample for each it hands out: 150 samples, 90 MB, before), and what the reader holds
(samples expanded from the shards and not yet handed out) stays within
SHUFFLE_BUFFER_BYTES (64 MiB) and two samples."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from autotune.synth import with_comment
from autotune_converters import ConvertOptions, WdsSource, convert
from autotune_converters.wds import reader

MiB = 1 << 20


def _big_images(root: Path, n: int) -> int:
    """n different ~620 KB JPEGs (one noise image, a comment each); the largest size."""
    buf = io.BytesIO()
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (800, 800, 3), dtype=np.uint8)).save(buf, "JPEG",
                                                                               quality=92)
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
    for i in range(n):
        (root / f"c{i % 2}" / f"{i:04d}.jpg").write_bytes(with_comment(buf.getvalue(),
                                                                       b"%d" % i))
    return len(buf.getvalue()) + 8


def _held(tmp_path, monkeypatch, **kw) -> tuple[int, int, int]:
    """(samples read, the most bytes the reader held, the largest sample) through
    WdsSource.dataset(**kw) over 300 ~620 KB images."""
    n = 300
    largest = _big_images(tmp_path / "src", n)
    assert n // 2 * largest > 80 * MiB  # the buffer grew past the bound before
    dst = tmp_path / "wds"
    convert(tmp_path / "src", dst, ConvertOptions(format="wds", readers=1))
    produced = [0]
    expand = reader._expand

    def counting(*a, **kw):
        for s in expand(*a, **kw):
            produced[0] += len(s["image"])
            yield s

    monkeypatch.setattr(reader, "_expand", counting)
    consumed = held = seen = 0
    for data, _label in WdsSource(dst).dataset(None, **kw):
        consumed += len(data)
        seen += 1
        held = max(held, produced[0] - consumed + len(data))
    return seen, held, largest


def test_the_default_shuffle_buffer_holds_at_most_its_bytes(tmp_path, monkeypatch):
    seen, held, largest = _held(tmp_path, monkeypatch)
    assert seen == 300
    assert held <= 64 * MiB + 2 * largest, f"{held / MiB:.1f} MiB held"


def test_a_shuffle_buffer_the_user_sized_is_theirs(tmp_path, monkeypatch):
    # 1,000 samples asked for: the order is webdataset's shuffle(1000) to the pick, and the
    # memory that takes is the user's choice (a byte bound of their own is one keyword more).
    seen, held, _ = _held(tmp_path, monkeypatch, shuffle_buffer=1000)
    assert seen == 300 and held > 80 * MiB, f"{held / MiB:.1f} MiB held"


def test_unbounded_the_buffer_is_webdatasets_shuffle_to_the_pick():
    import webdataset as wds

    from autotune_converters.wds.shuffle import shuffled

    for n in (0, 5, 150, 3000):
        data = [{"__key__": str(i), "image": b"x" * (i % 7)} for i in range(n)]
        ours = [s["__key__"] for s in shuffled(iter(data), 1000, None, 100, seed=7)]
        theirs = [s["__key__"] for s in wds.shuffle(1000, initial=100, seed=7)(iter(data))]
        assert ours == theirs, n
