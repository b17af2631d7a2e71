"""remove_tree: the stage's work folder removed through descriptors, on every Python the
package supports (shutil.rmtree's dir_fd= is 3.11's)."""

from __future__ import annotations

import os

from autotune_base.beneath import open_dir, remove_tree


def test_a_tree_is_removed_and_no_link_in_it_is_followed(tmp_path):
    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    (outside / "keep" / "f").write_bytes(b"x")
    (outside / "g").write_bytes(b"y")
    t = tmp_path / "work" / "tmp"
    (t / "a" / "b").mkdir(parents=True)
    (t / "a" / "b" / "part").write_bytes(b"z" * 100)
    (t / "top").write_bytes(b"")
    os.mkfifo(t / "a" / "fifo")
    (t / "a" / "dirlink").symlink_to(outside / "keep")
    (t / "filelink").symlink_to(outside / "g")
    fd = open_dir(tmp_path / "work")
    try:
        remove_tree(fd, "tmp")
        remove_tree(fd, "tmp")          # gone already: nothing to do, no error
    finally:
        os.close(fd)
    assert list((tmp_path / "work").iterdir()) == []
    assert (outside / "keep" / "f").read_bytes() == b"x" and (outside / "g").read_bytes() == b"y"


def test_a_link_named_is_not_followed_and_a_deep_tree_does_not_exhaust_the_stack(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    d = tmp_path / "deep"
    d.mkdir()
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1200):              # deeper than Python's default recursion limit
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(fd)
    root = open_dir(tmp_path)
    try:
        remove_tree(root, "link")
        remove_tree(root, "deep")
    finally:
        os.close(root)
    assert (tmp_path / "real" / "f").read_bytes() == b"x"
    assert not (tmp_path / "deep").exists()
