"""What the benchmark scripts share: one place that puts a dataset behind an emulated
HDD (a cgroup read-IOPS cap) or an NFS-like FUSE delay; a timestamped progress line; a
DataLoader configuration's short label."""

from __future__ import annotations

import sys
import tempfile
import time
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
    subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True)
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
    so resuming one measured behind FUSE needs the same mount point."""
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


def workload_args(ap: Any, *, trials: int, compute_ms: float, space: str, iops: int) -> None:
    """The options the loop and search benchmarks share: the slow storage, the search,
    the workload (a step per batch of 64)."""
    ap.add_argument("--iops", type=int, default=iops)
    ap.add_argument("--delay-ms", type=float, default=5.0)
    ap.add_argument("--trials", type=int, default=trials)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--space", default=space)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--compute-ms", type=float, default=compute_ms)


def log(msg: str) -> None:
    """A progress line on stderr, with the time (stdout carries the results)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def config_label(params: dict | None) -> str:
    """'w4 pf2 persistent' for a DataLoader configuration (autotune.params.label); '-'."""
    from autotune.params import label

    return label(params) if params else "-"


def expect_line(p: Any, word: str, kind: str) -> None:
    """A reading child's next line must be `word` (READY, FIRST); else it failed, and its
    stderr says why."""
    line = p.stdout.readline()
    if line.strip() != word:
        p.kill()
        raise SystemExit(f"read {kind} failed: {line}{p.stderr.read()[-3000:]}")


def go(p: Any) -> None:
    """Let a reading child past its handshake."""
    p.stdin.write("GO\n")
    p.stdin.flush()


def start_reader(p: Any, cap: Any, kind: str) -> tuple[Any, Any]:
    """Through a reading child's handshake: (the cgroup's I/O counters before its first
    batch, at its first batch); the child then reads its window."""
    expect_line(p, "READY", kind)
    before = cap.stats()
    go(p)
    expect_line(p, "FIRST", kind)
    first = cap.stats()
    go(p)
    return before, first
