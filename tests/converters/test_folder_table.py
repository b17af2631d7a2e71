"""The image folder's sample table: what a file costs in memory, and that it reads back
the same paths and labels, odd names included."""

from __future__ import annotations

import os
import tracemalloc

import pytest

from autotune.synth import make_scale_folder
from autotune_base.pathtable import PathTable
from autotune_converters.folder import FolderSource


def test_a_file_costs_its_name_not_a_python_object_per_file(tmp_path):
    root = tmp_path / "t"
    make_scale_folder(root, 5000, 50, pool=4, workers=1)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        src = FolderSource(root)
        per_file = (tracemalloc.get_traced_memory()[0] - before) / len(src)
    finally:
        tracemalloc.stop()
    # A list of (path, label) tuples held about 190 bytes a file; "class_0000/img_0000000.jpg"
    # is 26 bytes, and its end offset and label 12 more.
    assert len(src) == 5000 and per_file < 80, per_file
    paths = [p for p, _ in src._samples]
    assert paths == sorted(paths) and len(set(paths)) == 5000
    assert src.describe(0) == str(root / "class_0000" / "img_0000000.jpg")
    data, label = src.read(4999)
    assert label == 49 and data == (root / "class_0049" / "img_0004999.jpg").read_bytes()


def test_names_that_are_not_utf8_and_nested_folders_read_back(tmp_path):
    root = tmp_path / "d"
    odd = os.fsencode(str(root / "b" / "sub")) + b"/caf\xe9.jpg"   # Latin-1, not UTF-8
    os.makedirs(root / "a")
    os.makedirs(root / "b" / "sub")
    (root / "a" / "x.JPG").write_bytes(b"1")
    with open(odd, "wb") as f:
        f.write(b"2")
    src = FolderSource(root)
    assert len(src) == 2 and src.classes == ["a", "b"]
    assert src.read(0) == (b"1", 0) and src.read(1) == (b"2", 1)
    assert os.fsencode(src.describe(1)) == odd
    assert [os.fsencode(str(p)) for p in src.files()][1] == odd


def test_the_table_indexes_as_a_list_does():
    t = PathTable("/r", "i")
    for i in range(3):
        t.append(f"c/{i}.jpg", i)
    assert t[0] == ("/r/c/0.jpg", 0) and t[-1] == ("/r/c/2.jpg", 2) and t[-3] == t[0]
    assert list(t) == [t[0], t[1], t[2]] and len(t) == 3
    with pytest.raises(IndexError):
        t[3]
    with pytest.raises(IndexError):
        t[-4]


def test_a_folder_is_listed_once_per_process_until_a_class_folder_changes(tmp_path):
    root = tmp_path / "t"
    make_scale_folder(root, 40, 4, pool=2, workers=1)
    a, b = FolderSource(root), FolderSource(root)
    assert a._samples is b._samples and len(b) == 40   # one listing, shared
    b.classes.append("mine")                           # the caller's list, not the cache's
    assert FolderSource(root).classes == [f"class_{i:04d}" for i in range(4)]
    (root / "class_0001" / "img_9999999.jpg").write_bytes(
        (root / "class_0001" / "img_0000001.jpg").read_bytes())
    c = FolderSource(root)
    assert len(c) == 41 and c._samples is not a._samples
    assert c.describe(20) == str(root / "class_0001" / "img_9999999.jpg")
    os.remove(root / "class_0002" / "img_0000002.jpg")
    os.makedirs(root / "class_0004")
    (root / "class_0004" / "x.jpg").write_bytes(b"x")
    d = FolderSource(root)
    assert len(d) == 41 and d.classes[-1] == "class_0004" and d.read(40) == (b"x", 4)
    assert [x.name for x in d.files()] == [os.path.basename(p) for p in d.file_paths()]


def test_links_back_up_the_tree_are_not_entered_and_other_links_are(tmp_path):
    import subprocess
    import sys

    root = tmp_path / "d"
    for c in ("a", "b"):
        os.makedirs(root / c)
        (root / c / f"{c}.jpg").write_bytes(b"x")
    os.makedirs(tmp_path / "elsewhere" / "sub")
    (tmp_path / "elsewhere" / "sub" / "e.jpg").write_bytes(b"x")
    os.symlink("..", root / "a" / "up")                 # the dataset's root: a loop
    os.symlink("..", root / "a" / "up2")                # two of them: os.walk never ended
    os.symlink(".", root / "b" / "self")                # the folder itself
    os.symlink("/", root / "b" / "all")                 # everything above
    os.symlink("../b", root / "a" / "bb")               # a sibling class: followed
    os.symlink(tmp_path / "elsewhere", root / "b" / "far")   # out of the tree: followed
    code = ("import sys; from autotune_converters.folder import FolderSource; "
            "s = FolderSource(sys.argv[1]); print('\\n'.join(s.describe(i) for i in range(len(s))))")
    r = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    listed = [os.path.relpath(p, root) for p in r.stdout.split()]
    # As torchvision's ImageFolder lists them, less the loops.
    assert listed == ["a/a.jpg", "a/bb/b.jpg", "a/bb/far/sub/e.jpg", "b/b.jpg",
                      "b/far/sub/e.jpg"], listed
