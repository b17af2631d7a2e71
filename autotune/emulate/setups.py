"""A benchmark's storage set-up: the dataset behind an emulated HDD (a cgroup read-IOPS cap
on a disk of its own) or an NFS-like FUSE delay, and scratch folders on disk.

    with ExitStack() as stack:
        work = scratch_dir("autotune-bench-x-")
        src = own_disk(stack, dataset, work)
        path, monitor_path, cap = enter_setup(stack, "cap", src, iops=100, delay_ms=5,
                                              name="bench-x")

Used by the benchmark scripts (`python -m scripts.bench_loop`, ...). Everything is undone
when the stack closes.
"""

from __future__ import annotations

import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any


def tmp_parent(given: str | None = None) -> Path:
    """Where scratch folders go: the --tmp-dir given, else $TMPDIR, else /var/tmp (on disk:
    /tmp may be tmpfs, which a cold read can never be)."""
    import os

    return Path(given or os.environ.get("TMPDIR") or "/var/tmp")


def scratch_dir(prefix: str, tmp_dir: str | None = None) -> Path:
    """A new folder of this run's own (tempfile.mkdtemp: a fresh name, mode 0700) under
    `tmp_parent(tmp_dir)`; never a fixed name another user or run could hold or link."""
    parent = tmp_parent(tmp_dir)
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


def own_disk(stack: ExitStack, ds: Path, work: Path) -> Path:
    """A copy of `ds` on a disk of its own (an ext4 image on a loop device), so that a cap
    on that disk slows the dataset alone: Python, torch and a staged copy on the root disk
    stay at local speed, as on a node whose data sits on a slow volume. Unmounted when
    `stack` closes."""
    import shutil
    import subprocess

    size = sum(p.stat().st_size for p in ds.rglob("*") if p.is_file())
    img, mnt = work / "disk.img", work / "disk"
    with open(img, "wb") as f:
        f.truncate(size * 13 // 10 + (64 << 20))
    # Inode tables and journal written now: left lazy, the kernel's ext4lazyinit thread
    # writes them in the background for a while after the mount, and that write traffic
    # on the disk under test made its readahead requests (dropped by a busy queue) and
    # its timings depend on how long ago the disk was made.
    subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0",
                    str(img)], check=True)
    mnt.mkdir()
    subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True)
    stack.callback(subprocess.run, ["umount", "-l", str(mnt)], check=False)
    shutil.copytree(ds, mnt / ds.name)
    return mnt / ds.name


def enter_setup(stack: ExitStack, setup: str, ds: Path, *, iops: int, delay_ms: float,
                name: str, mount: Path | None = None) -> tuple[Path, str | None, Any]:
    """(path to read, path whose disk to monitor or None, IoThrottle or None) for `setup`:
    'cap'/'hdd' caps the dataset's disk (the probe and each trial read under it, from just
    after torch is imported); 'fuse'/'nfs' mirrors it behind a FUSE delay; 'unthrottled'
    leaves it as it is. Everything is undone when `stack` closes. `mount`: where the FUSE
    mirror goes (default a new temporary directory); a study names the path it measured,
    so resuming one measured behind FUSE needs the same mount point.

    An unknown `setup` ends the benchmark (SystemExit naming the three), as it always has:
    its callers are scripts, and the name comes from their command line."""
    if setup in ("cap", "hdd"):
        from autotune.emulate import IoThrottle

        return ds, None, stack.enter_context(IoThrottle(ds, read_iops=iops, name=name))
    if setup in ("fuse", "nfs"):
        from autotune.emulate import SlowMount

        if mount is not None:
            mount.mkdir(parents=True, exist_ok=True)
            mnt = mount
        else:
            mnt = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "mnt"
        stack.enter_context(SlowMount(ds, mnt, delay_ms=delay_ms))
        return mnt, str(ds), None
    if setup == "unthrottled":
        return ds, None, None
    raise SystemExit(f"unknown set-up {setup!r}: use unthrottled, cap (hdd) or fuse (nfs)")
