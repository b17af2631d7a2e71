"""Cap the read IOPS / bandwidth of a disk for some processes, with a real cgroup.

Uses the blkio controller of cgroup v1 (`blkio.throttle.read_iops_device`, ...) when it is
mounted, else the io controller of cgroup v2 (`io.max riops=... rbps=...`). The cap applies
to I/O that reaches the disk: page-cache hits bypass it, so drop caches before a cold
measurement (`autotune.cache.drop_caches`). Buffered writes are not attributed to the
writer under cgroup v1, so only read limits (and direct-I/O writes) are dependable.

    with IoThrottle("/data", read_iops=500) as cap:
        cap.run(["fio", ...])
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from autotune.blockdev import BlockDevice, block_device_for, mount_for, mountinfo
from autotune.cgroups import join_self, remove_cgroup, write_value
from autotune.emulate._cleanup import undo_on_exit
from autotune.errors import AutotuneError, NotPermitted, UsageError
from autotune_base.fsutil import rmdir_quietly

CGROUP_PREFIX = "autotune-"


@dataclass(frozen=True)
class CgroupBackend:
    """Where throttled cgroups are created and which interface file names apply."""

    version: Literal[1, 2]
    parent: Path  # the cgroup our cgroups are created in (and pids are moved back to)


@dataclass(frozen=True)
class IoStats:
    """I/O the cgroup has issued to the throttled disk since it was created."""

    read_ios: int
    read_bytes: int


def _mountinfo() -> list[tuple[str, str, str, str]]:
    """(root, mountpoint, fstype, super options) of every mount."""
    return [(e.root, e.mountpoint, e.fstype, e.super_options) for e in mountinfo()]


def _own_cgroup(match: Callable[[str, str], bool]) -> str:
    """This process's cgroup path in the hierarchy whose /proc/self/cgroup line matches."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if match(hid, controllers):
            return path
    return "/"


def _under(mountpoint: str, mount_root: str, cg_path: str) -> Path:
    # With a cgroup namespace or a bind-mounted subtree, the mount shows `mount_root`.
    rel = os.path.relpath(cg_path, mount_root) if cg_path.startswith(mount_root) else "."
    return (Path(mountpoint) / rel).resolve()


def detect_backend() -> CgroupBackend:
    """The cgroup hierarchy that can throttle block I/O on this machine.

    cgroup v1 blkio wins when mounted (on hybrid systems the io controller is then bound to
    v1 and absent from v2). Raises NotPermitted when neither is available.
    """
    try:
        mounts = _mountinfo()
    except OSError as e:
        raise NotPermitted(f"cannot read /proc/self/mountinfo ({e.strerror}); "
                           "I/O throttling needs Linux cgroups") from e
    for root, mnt, fstype, opts in mounts:
        if fstype == "cgroup" and "blkio" in opts.split(","):
            own = _own_cgroup(lambda _h, c: "blkio" in c.split(","))
            return CgroupBackend(1, _under(mnt, root, own))
    for root, mnt, fstype, _opts in mounts:
        if fstype != "cgroup2":
            continue
        try:
            controllers = (Path(mnt) / "cgroup.controllers").read_text().split()
        except OSError:
            continue
        if "io" in controllers:
            # Created at the top of the hierarchy: a v2 cgroup that holds processes (our own)
            # may not enable controllers for children ("no internal processes" rule).
            return CgroupBackend(2, Path(mnt))
    raise NotPermitted("I/O throttling needs the cgroup v1 blkio controller or the cgroup v2 "
                       "io controller, and neither is mounted/enabled here")


def _permission_error(what: str, path: Path, e: OSError) -> AutotuneError:
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return NotPermitted(f"{what} {path}: {e.strerror}; throttling I/O needs root "
                            "(and a writable cgroup filesystem)")
    return AutotuneError(f"{what} {path}: {e.strerror}")


def remove_stale_cgroups(backend: CgroupBackend | None = None) -> list[Path]:
    """Remove empty autotune cgroups whose creating process is gone (a killed run's leftovers).

    Returns the directories removed. Best effort: anything that cannot be removed stays.
    """
    backend = backend or detect_backend()
    removed = []
    for d in backend.parent.glob(f"{CGROUP_PREFIX}*"):
        m = re.search(r"-(\d+)-[0-9a-f]+$", d.name)
        if not m or Path(f"/proc/{m.group(1)}").exists():
            continue
        try:  # a minute's grace: its creator may live in another pid namespace
            if time.time() - d.stat().st_mtime < 60:
                continue
        except OSError:
            continue
        rmdir_quietly(d, removed)
    return removed


class IoThrottle:
    """A cgroup that caps I/O to the disk behind `path`; a context manager.

    Args:
        path: any file or directory on the filesystem to throttle; its whole disk is capped
            (partitions map to their disk, as blkio requires).
        read_iops, read_bps, write_iops, write_bps: the caps; None means unlimited.
        name: a label for the cgroup name (letters, digits, '-', '_').

    Processes join with `popen`/`run` (the child enters the cgroup before it execs, so
    none of its I/O escapes the cap) or `add_pid`; their children (DataLoader workers)
    inherit the cgroup. On exit every process still inside is
    moved back to the parent cgroup (it loses the cap) and the cgroup is removed, also
    when the body raises.
    """

    def __init__(self, path: str | os.PathLike[str], read_iops: int | None = None,
                 read_bps: int | None = None, *, write_iops: int | None = None,
                 write_bps: int | None = None, name: str | None = None) -> None:
        limits = {"read_iops": read_iops, "read_bps": read_bps,
                  "write_iops": write_iops, "write_bps": write_bps}
        for key, val in limits.items():
            if val is not None and (not isinstance(val, int) or val <= 0):
                raise UsageError(f"IoThrottle {key}={val!r}: must be a positive integer")
        if all(v is None for v in limits.values()):
            raise UsageError("IoThrottle needs at least one of read_iops, read_bps, "
                             "write_iops, write_bps")
        if name is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", name):
            raise UsageError(f"IoThrottle name {name!r}: use 1-40 letters, digits, '-' or '_'")
        self.path = os.fspath(path)
        self.limits = limits
        self.name = name or "throttle"
        self.device: BlockDevice = self._resolve_device(self.path)
        self.backend: CgroupBackend | None = None
        self.cgroup: Path | None = None

    @staticmethod
    def _resolve_device(path: str) -> BlockDevice:
        try:
            os.stat(path)
        except OSError as e:
            raise UsageError(f"{path}: {e.strerror} (IoThrottle needs a path on the disk to "
                             "throttle)") from e
        dev = block_device_for(path)
        if dev is None:
            m = mount_for(path)
            fs = f"{m.fstype} at {m.mountpoint}" if m else "an unknown filesystem"
            raise UsageError(f"{path}: on {fs}, which has no block device to throttle; "
                             "point --path at a directory on a local disk (or emulate "
                             "network latency with scripts/slowfs)")
        return dev

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> IoThrottle:
        self.backend = detect_backend()
        remove_stale_cgroups(self.backend)
        cg = self.backend.parent / f"{CGROUP_PREFIX}{self.name}-{os.getpid()}-{secrets.token_hex(3)}"
        if self.backend.version == 2:
            try:
                write_value(self.backend.parent / "cgroup.subtree_control", "+io")
            except OSError as e:
                raise _permission_error("cannot enable the io controller in",
                                        self.backend.parent, e) from e
        try:
            cg.mkdir()
        except OSError as e:
            raise _permission_error("cannot create cgroup", cg, e) from e
        self.cgroup = cg
        try:
            self._set_limits()
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        undo_on_exit(self._remove, exc)

    def _set_limits(self) -> None:
        assert self.cgroup is not None and self.backend is not None
        mm = self.device.majmin
        if self.backend.version == 1:
            files = {"read_iops": "blkio.throttle.read_iops_device",
                     "read_bps": "blkio.throttle.read_bps_device",
                     "write_iops": "blkio.throttle.write_iops_device",
                     "write_bps": "blkio.throttle.write_bps_device"}
            writes = [(files[k], f"{mm} {v}") for k, v in self.limits.items() if v is not None]
        else:
            keys = {"read_iops": "riops", "read_bps": "rbps",
                    "write_iops": "wiops", "write_bps": "wbps"}
            spec = " ".join(f"{keys[k]}={v}" for k, v in self.limits.items() if v is not None)
            writes = [("io.max", f"{mm} {spec}")]
        for fname, text in writes:
            try:
                write_value(self.cgroup / fname, text)
            except OSError as e:
                raise AutotuneError(f"cannot set '{text}' in {self.cgroup / fname}: "
                                    f"{e.strerror} (device {self.device.name} {mm} behind "
                                    f"{self.path})") from e

    def _remove(self) -> None:
        cg, self.cgroup = self.cgroup, None
        if cg is None or self.backend is None:
            return
        remove_cgroup(cg, self.backend.parent / "cgroup.procs", poll_s=0.02)

    @staticmethod
    def _read_pids(cg: Path) -> list[int]:
        try:
            return [int(x) for x in (cg / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    # -- processes ---------------------------------------------------------------------

    def _live(self) -> Path:
        if self.cgroup is None:
            raise UsageError("IoThrottle is not active: use it as `with IoThrottle(...) as cap:`")
        return self.cgroup

    def _preexec(self, user_fn: Callable[[], Any] | None) -> Callable[[], None]:
        procs = os.fsencode(self._live() / "cgroup.procs")

        def join() -> None:
            join_self(procs)  # in the child between fork and exec
            if user_fn is not None:
                user_fn()
        return join

    def popen(self, cmd: Sequence[str] | str, **kwargs: Any) -> subprocess.Popen[Any]:
        """Start `cmd` inside the cgroup (kwargs as for subprocess.Popen)."""
        kwargs["preexec_fn"] = self._preexec(kwargs.get("preexec_fn"))
        try:
            return subprocess.Popen(cmd, **kwargs)
        except subprocess.SubprocessError as e:  # the preexec_fn failed: say where
            raise AutotuneError(f"cannot start {cmd!r} inside cgroup {self.cgroup}: {e}") from e

    def run(self, cmd: Sequence[str] | str, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """Run `cmd` inside the cgroup to completion (kwargs as for subprocess.run)."""
        kwargs["preexec_fn"] = self._preexec(kwargs.get("preexec_fn"))
        try:
            return subprocess.run(cmd, **kwargs)
        except subprocess.SubprocessError as e:
            if isinstance(e, (subprocess.CalledProcessError, subprocess.TimeoutExpired)):
                raise
            raise AutotuneError(f"cannot start {cmd!r} inside cgroup {self.cgroup}: {e}") from e

    def add_pid(self, pid: int) -> None:
        """Move a running process (all its threads) into the cgroup."""
        procs = self._live() / "cgroup.procs"
        try:
            write_value(procs, str(pid))
        except OSError as e:
            raise AutotuneError(f"cannot move pid {pid} into {procs}: {e.strerror}") from e

    @contextlib.contextmanager
    def joined(self) -> Iterator[None]:
        """This process (all its threads, and children it starts meanwhile) under the cap
        for the body, then back in the parent cgroup: e.g. a probe or a conversion that
        reads the slow storage from the process that also starts uncapped work."""
        self.add_pid(os.getpid())
        try:
            yield
        finally:
            assert self.backend is not None
            write_value(self.backend.parent / "cgroup.procs", str(os.getpid()))

    def pids(self) -> list[int]:
        """Processes currently inside the cgroup."""
        return self._read_pids(self._live())

    def stats(self) -> IoStats:
        """Reads (count and bytes) this cgroup has issued to the throttled disk."""
        cg, mm = self._live(), self.device.majmin
        assert self.backend is not None
        if self.backend.version == 1:
            def read_total(fname: str) -> int:
                for line in (cg / fname).read_text().splitlines():
                    f = line.split()
                    if len(f) == 3 and f[0] == mm and f[1] == "Read":
                        return int(f[2])
                return 0
            return IoStats(read_total("blkio.throttle.io_serviced"),
                           read_total("blkio.throttle.io_service_bytes"))
        for line in (cg / "io.stat").read_text().splitlines():
            f = line.split()
            if f and f[0] == mm:
                kv = dict(x.split("=", 1) for x in f[1:])
                return IoStats(int(kv.get("rios", 0)), int(kv.get("rbytes", 0)))
        return IoStats(0, 0)

