"""The scale generator: distinct, valid JPEGs in whole classes, resumable after a kill."""

from __future__ import annotations

import hashlib
import os

import pytest
from PIL import Image

from autotune.synth import make_scale_folder


def _files(root):
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)


def test_every_file_distinct_decodable_and_in_its_class(tmp_path):
    r = make_scale_folder(tmp_path / "t", 300, 7, pool=16, workers=2)
    files = _files(tmp_path / "t")
    assert len(files) == r.created == 300 and len(os.listdir(tmp_path / "t")) == 7
    assert len({hashlib.sha1(open(f, "rb").read()).hexdigest() for f in files}) == 300
    assert r.bytes == sum(os.path.getsize(f) for f in files)
    assert r.bytes / 300 <= 8 * 1024   # the bound on the mean
    for f in files[::37]:
        i = int(os.path.basename(f)[4:11])
        assert os.path.basename(os.path.dirname(f)) == f"class_{i % 7:04d}"
        with Image.open(f) as im:
            im.load()
            assert im.info["comment"] == b"autotune-scale %d" % i


def test_a_partial_class_is_written_again_and_complete_ones_are_kept(tmp_path):
    root = tmp_path / "t"
    make_scale_folder(root, 100, 4, pool=8, workers=1)
    before = {f: os.stat(f).st_mtime_ns for f in _files(root)}
    # A run killed inside class 2: its folder under the partial name, half written.
    os.rename(root / "class_0002", root / "class_0002.partial")
    os.remove(next(iter(sorted((root / "class_0002.partial").iterdir()))))
    r = make_scale_folder(root, 100, 4, pool=8, workers=1)
    assert r.created == 25 and not (root / "class_0002.partial").exists()
    after = _files(root)
    assert sorted(before) == after
    assert all(os.stat(f).st_mtime_ns == before[f] for f in after if "class_0002" not in f)
    assert make_scale_folder(root, 100, 4, pool=8).created == 0


@pytest.mark.parametrize("kw, word", [({"images": 0}, "images"), ({"classes": 0}, "classes"),
                                      ({"pool": 0}, "pool")])
def test_bad_sizes_are_one_line_naming_the_figure(tmp_path, kw, word):
    args = {"images": 10, "classes": 2, "pool": 4, **kw}
    with pytest.raises(ValueError, match=rf"^{word} must be"):
        make_scale_folder(tmp_path / "t", **args)
