"""Where this process sits in the cgroup hierarchies, for any controller.

`/proc/self/cgroup` names the process's cgroup path per hierarchy, `/proc/self/mountinfo`
where each hierarchy is mounted. A limit set by a container runtime, a Slurm job or a
systemd slice sits on the process's own cgroup or on an ancestor of it, so readers walk
from the process's own directory up to the mount's root and the kernel's rule applies:
every limit on the way up is enforced, the tightest binds. Ancestors above what this mount
namespace shows (a container's mount root) cannot be read and are not walked.

cgroup v1 mounts one hierarchy per controller (or a few together: `cpu,cpuacct`); v2 mounts
one unified hierarchy, entry `0::PATH` in `/proc/self/cgroup`. `autotune.cpus` reads CPU
quotas through this module, `autotune.environment` memory limits; the cgroups that
`autotune.emulate.throttle` and `autotune.probe.hitrate` make are written through
`write_value`, joined with `join_self` and removed with `remove_cgroup`.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

from autotune.errors import AutotuneError

__all__ = ["CGROUP_FILE", "MOUNTINFO_FILE", "cgroup_dirs", "cgroup_mounts", "join_self",
           "own_paths", "remove_cgroup", "write_value"]

CGROUP_FILE = "/proc/self/cgroup"
MOUNTINFO_FILE = "/proc/self/mountinfo"


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as a backslash and three octal
    # digits.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def cgroup_mounts(mountinfo_text: str, controller: str) -> list[tuple[str, str, str]]:
    """(kind, mount root, mountpoint) of each v1 mount carrying `controller` and of each v2
    mount; kind is "v1" or "v2"."""
    out = []
    for line in mountinfo_text.splitlines():
        left, _, right = line.partition(" - ")
        parts, rparts = left.split(), right.split()
        if len(parts) < 5 or not rparts:
            continue
        fstype = rparts[0]
        opts = set(rparts[2].split(",")) if len(rparts) > 2 else set()
        if fstype == "cgroup2":
            out.append(("v2", _unescape(parts[3]), _unescape(parts[4])))
        elif fstype == "cgroup" and controller in opts:
            out.append(("v1", _unescape(parts[3]), _unescape(parts[4])))
    return out


def own_paths(cgroup_text: str, controller: str) -> dict[str, str]:
    """The process's cgroup path in the v1 hierarchy of `controller` and in the v2 one."""
    paths: dict[str, str] = {}
    for line in cgroup_text.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not path:
            continue
        if hid == "0" and controllers == "":
            paths["v2"] = path
        elif controller in controllers.split(","):
            paths["v1"] = path
    return paths


def cgroup_dirs(controller: str, *, cgroup_file: str | os.PathLike[str] = CGROUP_FILE,
                mountinfo_file: str | os.PathLike[str] = MOUNTINFO_FILE
                ) -> list[tuple[str, Path]]:
    """(kind, directory) of every cgroup this process is under for `controller`, own cgroup
    first, then each ancestor up to the mount's root; a hierarchy mounted twice is listed
    once. Raises OSError when /proc cannot be read."""
    own = own_paths(Path(cgroup_file).read_text(), controller)
    mounts = cgroup_mounts(Path(mountinfo_file).read_text(), controller)
    found: list[tuple[str, Path]] = []
    seen: set[str] = set()
    for kind, root, mnt in mounts:
        path = own.get(kind)
        if path is None:
            continue
        root = root.rstrip("/")
        if not (path == root or path.startswith(root + "/") or root == ""):
            continue  # this mount shows another part of the tree, not our cgroup
        top = Path(mnt)
        d = top / path[len(root):].lstrip("/")
        while True:
            key = os.path.realpath(d)
            if key not in seen:
                seen.add(key)
                found.append((kind, d))
            if d == top or top not in d.parents:
                break
            d = d.parent
    return found


def write_value(path: Path, text: str) -> None:
    """Write one value to a cgroup file."""
    # One write() per value: cgroup files parse each write separately.
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def join_self(procs: bytes) -> None:
    """Move the calling process into the cgroup whose `cgroup.procs` file is `procs`.

    Made to run in a child between fork and exec: "0" means "the writing process", so no
    pid formatting (or allocation) is needed."""
    fd = os.open(procs, os.O_WRONLY)
    os.write(fd, b"0")
    os.close(fd)


def remove_cgroup(cg: Path, home_procs: Path | None, poll_s: float) -> None:
    """Remove the cgroup directory `cg`, first moving its processes into the cgroup whose
    `cgroup.procs` is `home_procs` (None: they are left to exit); AutotuneError naming the
    `rmdir` to run when it stays busy for 5 s."""
    deadline = time.monotonic() + 5.0
    while True:
        # Processes can fork while we move them: repeat until rmdir succeeds.
        if home_procs is not None:
            try:
                pids = (cg / "cgroup.procs").read_text().split()
            except OSError:
                pids = []
            for pid in pids:
                try:
                    write_value(home_procs, pid)
                except OSError:
                    pass  # exited meanwhile (ESRCH) or a zombie; rmdir tells if it matters
        try:
            cg.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                raise AutotuneError(f"cannot remove cgroup {cg}: {e.strerror}; remove it "
                                    f"with `rmdir {cg}` once its processes exit") from e
            time.sleep(poll_s)
