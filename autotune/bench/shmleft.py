"""The /dev/shm files a killed measurement left: found by the pids in their names, removed.

A DataLoader worker hands each batch over in a file it makes in /dev/shm (torch's default
"file_descriptor" sharing: shm_open /dev/shm/torch_<PID>_<RANDOM>_<COUNTER>, ftruncate and
fallocate it to the batch's bytes, then unlink the name and pass the descriptor on). A
worker that dies between the open and the unlink leaves the name for ever: a measurement
ended by SIGKILL (a pruned trial, a timeout, a search stopped by SIGTERM) catches a worker
there every few dozen kills (the fallocate of a 19 MB batch takes 2-10 ms of each batch),
and torch itself leaves it when its allocation fails (a full /dev/shm: ENOSPC). Each name
lists at the batch's size; in a container's 64 MiB /dev/shm such leftovers pile up run
after run, and one killed after its fallocate holds the batch's bytes too.

Only names of the measurement's own processes are removed (the pids its process group
held and those its processes recorded in the run's scratch folder, now all dead), owned by
this user, made since the measurement started, and regular files: never a live process's,
another user's or an older file whose pid was reused. A run killed outright (its parent
too: no `finally`) is swept by the next run, as that removes the dead run's folder.
`autotune.DataLoader` removes its own pools' leftovers as each pool stops (a fallback after
/dev/shm refused a batch leaves one every time).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable

from autotune.monitor.proctree import pid_alive

SHM_DIR = "/dev/shm"
PIDS_NAME = "pids"  # in a run's scratch folder: its processes' pids, one a line
_NAME = re.compile(r"torch_(\d+)_\d+_\d+")


def remove_left(pids: Iterable[int], since: float, shm_dir: str = SHM_DIR) -> list[str]:
    """Remove the torch_<PID>_* files in `shm_dir` of the dead processes `pids` made at or
    after `since` (time.time()); returns their names. Errors are skipped (a name another
    cleaner removed first, a /dev/shm that is not there)."""
    dead = {p for p in set(pids) if p > 0 and not pid_alive(p)}  # gone, or a zombie
    if not dead:
        return []
    try:
        dfd = os.open(shm_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return []
    removed = []
    try:
        for name in os.listdir(dfd):
            m = _NAME.fullmatch(name)
            if m is None or int(m.group(1)) not in dead:
                continue
            try:
                st = os.lstat(name, dir_fd=dfd)
                if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid()
                        or st.st_ctime < since):
                    continue
                os.unlink(name, dir_fd=dfd)
            except OSError:
                continue
            removed.append(name)
    finally:
        os.close(dfd)
    return sorted(removed)


def recorded(folder: str | os.PathLike[str]) -> set[int]:
    """The pids a run's processes recorded in its scratch folder (none when unreadable)."""
    try:
        with open(os.path.join(folder, PIDS_NAME), "rb") as f:
            data = f.read(1 << 20)
    except OSError:
        return set()
    return {int(x) for x in data.split() if x.isdigit()}


__all__ = ["PIDS_NAME", "recorded", "remove_left"]
