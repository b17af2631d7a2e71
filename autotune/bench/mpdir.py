"""Where a measurement's multiprocessing makes its folder: one its parent removes.

A DataLoader worker that hands a batch over by file descriptor makes multiprocessing's
folder (pymp-*, holding its socket) and removes it only at a clean exit: every worker a
pruned trial's SIGKILL ended, or a Ctrl-C, left one in TMPDIR. The parent therefore names
the folder, in the run's spec: `mp` inside the run's scratch folder, which the parent
removes however the run ends; where that path is too long for a socket's (107 bytes, with
"/listener-" and 8 characters below the folder: a TMPDIR longer than about 55 bytes),
a short folder beside it, TMPDIR/autotune-mp-XXXXXXXX; where even that is too long (a
TMPDIR past about 70 bytes: a cluster's per-job folder), one in the first of /tmp,
/var/tmp and /dev/shm that takes it. Either is removed with the scratch folder by the run
or, the run killed outright, by the next run (from the dead run's spec.json). Left to
multiprocessing, the workers' sockets did not fit and the measurement hung until its hard
timeout (186 s), leaving pymp-* folders in TMPDIR. Where no folder fits anywhere,
multiprocessing chooses as it would without us.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

PREFIX = "autotune-mp-"
_PATH_MAX = 88   # 107 bytes a socket's path, less "/listener-" and its 8 characters, and slack
_SHORT_BASES = ("/tmp", "/var/tmp", "/dev/shm")


def _fits(folder: str | os.PathLike[str]) -> bool:
    return len(os.fsencode(folder)) <= _PATH_MAX


def fits(folder: str | os.PathLike[str]) -> bool:
    """Whether multiprocessing's sockets fit below `folder` (AF_UNIX: 107 bytes a path)."""
    return _fits(folder)


def short_folder(prefix: str = "pymp-") -> str | None:
    """A new folder whose sockets fit, in the first of /tmp, /var/tmp and /dev/shm that
    takes one (TMPDIR being too long); None where none does."""
    for base in _SHORT_BASES:
        try:
            made = tempfile.mkdtemp(prefix=prefix, dir=base)
        except OSError:
            continue
        if _fits(made):
            return made
        os.rmdir(made)
    return None


def make(scratch: Path) -> str | None:
    """The folder for the run whose scratch folder is `scratch`, made; None: none fits."""
    inner = scratch / "mp"
    if _fits(inner):
        inner.mkdir(exist_ok=True)
        return str(inner)
    short = tempfile.mkdtemp(prefix=PREFIX)
    if _fits(short):
        return short
    os.rmdir(short)
    return short_folder(PREFIX)


def recorded(scratch: Path) -> str | None:
    """The folder a run named in its spec.json (None: none, or unreadable)."""
    try:
        with open(scratch / "spec.json", "rb") as f:
            folder = json.loads(f.read(1 << 22)).get("mp_dir")
    except (OSError, ValueError, AttributeError):
        return None
    return folder if isinstance(folder, str) else None


def remove(scratch: Path, folder: str | None) -> None:
    """Remove `folder` where it is a short folder `make` made (one inside `scratch` goes
    with the scratch folder): only a directory of this user named as `make` names them,
    beside `scratch` or in one of short_folder's places; never a link's target."""
    if not folder:
        return
    p = Path(folder)
    if (p.parent not in (scratch.parent, *map(Path, _SHORT_BASES))
            or not p.name.startswith(PREFIX)):
        return
    try:
        st = p.lstat()
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
        shutil.rmtree(p, ignore_errors=True)


__all__ = ["PREFIX", "fits", "make", "recorded", "remove", "short_folder"]
