"""The steady-state replay: the sample's inodes loaded and held, and the JSON saying how."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import json
import shutil
from pathlib import Path

import pytest

from autotune.probe.replay import pinned_inodes, replay

pytestmark = pytest.mark.alone  # it judges what it measures: CI runs it alone (.ci/run)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_pinned_inodes_holds_one_descriptor_per_file_and_releases_them(tmp_path):
    paths = []
    for i in range(50):
        p = tmp_path / f"{i}.jpg"
        p.write_bytes(b"x")
        paths.append(str(p))
    paths.append(str(tmp_path / "gone.jpg"))
    before = _open_fds()
    with pinned_inodes(paths) as (held, took):
        assert held == 50 and took >= 0
        assert _open_fds() == before + 50
    assert _open_fds() == before


@pytest.mark.root
def test_steady_pass_holds_the_whole_sample_and_says_how(small_dataset):
    if os.geteuid() != 0:
        pytest.skip("the steady pass needs drop_caches (root)")
    r = replay(small_dataset, concurrency=(1, 4), seconds_per_level=30)
    assert [lv.concurrency for lv in r.steady] == [1, 4]
    assert r.steady_inodes_held == r.files_sampled == 64
    for lv in r.steady:
        assert lv.files == 64 and lv.ios_per_file is not None
    c = r.to_dict()["ceiling"]
    assert c["pass"] == "steady-state" and c["io_source"]
    assert "64 held open" in c["method"] and "drop_caches=1" in c["method"]


def test_cold_only_ceiling_method_names_the_drop(small_dataset):
    r = replay(small_dataset, concurrency=(2,), steady=False)
    m = r.to_dict()["ceiling"]["method"]
    assert m.startswith(("cold: drop_caches=3", "cold: posix_fadvise")), m
    assert "2 threads" in m


IOPS = 100


@pytest.fixture
def capped_loop_disk():
    """2,000 JPEG-sized files freshly written on an ext4 loop disk of their own (root):
    enough inode-table windows that a short cold pass leaves most of them cold, and each
    file's first read due an atime update (relatime)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (a loop disk and a cgroup cap)")
    from autotune.synth import render_jpeg, with_comment

    base = Path(tempfile.mkdtemp(prefix="autotune-probe-cap-", dir="/var/tmp"))
    img, mnt = base / "disk.img", base / "mnt"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(320 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True, capture_output=True)
    r = subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"cannot mount a loop device here: {r.stderr.strip()}")
    try:
        # ImageNet-sized JPEGs (render_jpeg: 300-500 px, 40-150 KB), 100 rendered and each
        # written 20 times with its index in a comment (distinct files, the same sizes;
        # rendering all 2,000 took 28 s), in the order one process writes them (class
        # folders first, then image by image): contiguous files.
        pool = [render_jpeg(5, i)[0] for i in range(100)]
        for c in range(20):
            (mnt / "train" / f"class_{c:04d}").mkdir(parents=True)
        for i in range(2000):
            (mnt / "train" / f"class_{i % 20:04d}" / f"img_{i:07d}.jpg").write_bytes(
                with_comment(pool[i % 100], b"%d" % i))
        os.sync()
        yield mnt / "train"
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.root
def test_ceiling_behind_a_real_cap_is_most_of_what_the_cap_allows(capped_loop_disk):
    from autotune.emulate import IoThrottle

    with IoThrottle(capped_loop_disk, read_iops=IOPS, name="probe-cap-test") as cap:
        r = cap.run([sys.executable, "-m", "autotune", "-q", "probe", str(capped_loop_disk),
                     "--no-fio", "--concurrency", "16", "--replay-seconds", "3",
                     "--replay-files", "1000", "--json", "-"],
                    capture_output=True, text=True, timeout=300)
    assert r.returncode in (0, 3), r.stderr
    rp = json.loads(r.stdout)["replay"]
    c = rp["ceiling"]
    assert c["pass"] == "steady-state" and "bios charged by the cgroup's read cap" == c["io_source"]
    # What the cap allows for these files: its IOPS over the bios a whole-file read needs
    # (one per 128 KiB readahead window). The metadata a long run pays once (inode-table
    # readahead on open, and on the atime update of a first read) is not in it: before the
    # fix the steady pass paid 2-25 charged bios a file and read 10-55 files/s.
    per_file = max(1, math.ceil(rp["mean_file_bytes"] / (128 * 1024)))
    assert c["files_per_s"] >= 0.5 * IOPS / per_file, c
    assert c["ios_per_file"] <= 2 * per_file, c
