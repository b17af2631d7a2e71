"""data.mdb's index and sha256 from one pass over LMDB's pages, with real conversions and
the real lmdb library: the index is LMDB's own answer for every key (values on overflow
pages and values inside leaf pages), the sha256 is the file's, the writer asks LMDB for
a spread of keys only, and a file the page reader does not know falls back to LMDB."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest

from autotune_converters import ConvertOptions, LmdbSource, convert
from autotune_converters.lmdb import pages
from autotune_converters.lmdb import writer as lmdb_writer
from autotune_converters.lmdb.layout import index_dtype, key


def _lmdb_says(dst: Path, n: int) -> np.ndarray:
    """Each value's (offset, length, label) as LMDB itself locates it: the address of
    the value LMDB hands out in its map of data.mdb, less the map's start (a small value
    may also lie in stale copies of leaf pages, so searching the bytes is no oracle)."""
    import lmdb

    from autotune_converters.lmdb.layout import buffer_address, map_base

    env = lmdb.open(str(dst), readonly=True, lock=False)
    base = map_base(str(dst / "data.mdb"))
    out = np.zeros(n, dtype=index_dtype())
    with env.begin(buffers=True) as txn:
        for i in range(n):
            v = txn.get(key(i))
            out[i] = (buffer_address(v) - base, len(v), bytes(v[1:2])[0])
    env.close()
    return out


@pytest.fixture(scope="module")
def mixed_src(tmp_path_factory) -> Path:
    """Tiny PNGs (their values fit inside leaf pages) beside ~100 KB JPEGs (overflow
    pages), in 3 classes."""
    from PIL import Image

    root = tmp_path_factory.mktemp("mixed") / "train"
    rng = np.random.default_rng(5)
    for c in range(3):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(40):
            if i % 2:
                im = Image.fromarray(rng.integers(0, 255, (4, 4, 3), dtype=np.uint8))
                im.save(root / f"c{c}" / f"{i}.png")
            else:
                im = Image.fromarray(rng.integers(0, 255, (180, 180, 3), dtype=np.uint8))
                im.save(root / f"c{c}" / f"{i}.jpg", quality=95)
    return root


def test_the_pages_index_is_lmdbs_own_for_leaf_and_overflow_values(mixed_src, tmp_path):
    dst = tmp_path / "out"
    convert(mixed_src, dst, ConvertOptions(format="lmdb", shard_size=1 << 20))
    idx = np.fromfile(dst / "data.idx", dtype=index_dtype())
    assert len(idx) == 120
    assert (idx == _lmdb_says(dst, 120)).all()
    assert (idx["length"] < 2000).sum() == 60  # both kinds of value are there
    size, sha, again = pages.hash_and_index(str(dst / "data.mdb"), 120)
    assert (again == idx).all()
    assert sha == hashlib.sha256((dst / "data.mdb").read_bytes()).hexdigest()
    assert size == (dst / "data.mdb").stat().st_size


def test_the_writer_asks_lmdb_for_a_spread_of_keys_only(img_src, tmp_path, monkeypatch):
    asked: list[int] = []
    real = lmdb_writer.LmdbWriter._lmdb_index

    def spy(self, keys):
        keys = list(keys)
        asked.extend(keys)
        return real(self, keys)

    monkeypatch.setattr(lmdb_writer.LmdbWriter, "_lmdb_index", spy)
    dst = tmp_path / "out"
    convert(img_src, dst, ConvertOptions(format="lmdb", shard_size=1 << 20))
    assert 2 <= len(asked) <= 18 and {0, 95} <= set(asked)  # not every one of the 96
    idx = np.fromfile(dst / "data.idx", dtype=index_dtype())
    assert (idx == _lmdb_says(dst, 96)).all()


def test_a_file_the_page_reader_does_not_know_falls_back_to_lmdb(img_src, tmp_path,
                                                                 monkeypatch):
    def unknown(path, samples):
        raise pages.PageFormatError("meta page: magic 0x0, version 9")

    monkeypatch.setattr(pages, "hash_and_index", unknown)
    dst = tmp_path / "out"
    convert(img_src, dst, ConvertOptions(format="lmdb", shard_size=1 << 20))
    idx = np.fromfile(dst / "data.idx", dtype=index_dtype())
    assert (idx == _lmdb_says(dst, 96)).all()
    src = LmdbSource(dst)
    assert len(src) == 96 and bytes(src.read(5)[0])[:2] == b"\xff\xd8"


def test_a_damaged_meta_page_or_node_is_refused_not_misread(img_src, tmp_path):
    dst = tmp_path / "out"
    convert(img_src, dst, ConvertOptions(format="lmdb", shard_size=1 << 20))
    good = (dst / "data.mdb").read_bytes()
    bad = tmp_path / "bad.mdb"
    for at, what in ((16, b"\0\0\0\0"), (20, b"\x02\0\0\0")):  # magic, data version
        for meta in (0, 4096):
            b = bytearray(good)
            b[meta + at:meta + at + 4] = what
            bad.write_bytes(bytes(b))
            with pytest.raises(pages.PageFormatError):
                pages.hash_and_index(str(bad), 96)
    with pytest.raises(pages.PageFormatError):  # the keys are not the samples'
        pages.hash_and_index(str(dst / "data.mdb"), 95)


@pytest.mark.parametrize("keys", [[b"#meta", key(0), key(1), key(3)],   # a gap
                                  [key(0), key(1), key(2), b"zzz"]])     # a stranger's key
def test_keys_that_are_not_the_samples_in_order_are_refused(tmp_path, keys):
    import lmdb

    env = lmdb.open(str(tmp_path), subdir=True, lock=False, map_size=1 << 20)
    with env.begin(write=True) as txn:
        for k in keys:
            txn.put(k, b"x" * 16)
    env.close()
    with pytest.raises(pages.PageFormatError):
        pages.hash_and_index(str(tmp_path / "data.mdb"), 3)
