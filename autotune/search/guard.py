"""What keeps a study whole: one search process per SQLite file, no SQLite on a network
filesystem, and trials of a search process that died marked failed on resume.

SQLite serialises writers with file locks. Optuna's docs warn against several processes
on one SQLite file; on NFS and other network filesystems those locks are not reliable at
all, and a study can be corrupted. Two searches on one machine would also measure each
other's load. So a second process on the same SQLite file is refused (with the pid that
holds it), and machines that share a study are pointed at a server database.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError
from autotune_base.fsutil import PidLock

SERVER_HINT = ("several machines (or several searches) share one study through a server "
               "database: --storage postgresql://USER@HOST/DB or mysql://...")


def sqlite_path(url: str) -> Path | None:
    """The database file of a sqlite:/// URL; None for other storages or in-memory."""
    if not url.startswith("sqlite:///"):
        return None
    rest = url[len("sqlite:///"):].split("?", 1)[0]  # sqlite:////abs/x.db -> /abs/x.db
    return None if rest in ("", ":memory:") else Path(rest).absolute()


class StudyFileLock(PidLock):
    """An exclusive lock beside a SQLite study file (DB + '.lock'), held for the search
    (a PidLock: the kernel drops it when the process dies, however it dies)."""

    def __init__(self, db: Path) -> None:
        self.db = db
        super().__init__(db.with_name(db.name + ".lock"), self._busy,
                         tag=f"autotune search pid {os.getpid()} on {socket.gethostname()}")

    def _busy(self, holder: str) -> AutotuneError:
        return AutotuneError(
            f"{self.db}: this SQLite study file is in use by {holder}; two searches on one "
            "file would contend for SQLite's lock and, on one machine, measure each other's "
            f"load. Wait for it to finish, use another --out, or: {SERVER_HINT}.")

    def acquire(self) -> StudyFileLock:
        _refuse_network_fs(self.db)
        super().acquire()
        return self


def _refuse_network_fs(db: Path) -> None:
    from autotune.blockdev import mount_for

    parent = db.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    m = mount_for(parent)
    if m is not None and m.is_network:
        raise AutotuneError(
            f"{db}: a SQLite study on {m.fstype} ({m.mountpoint}) can be corrupted: file locks "
            f"are not reliable on network filesystems. Put --out on local disk, or: {SERVER_HINT}.")


def owner_tag() -> dict[str, Any]:
    """Who runs a trial: set on the trial when asked, checked on resume."""
    import psutil

    me = psutil.Process()
    return {"host": socket.gethostname(), "pid": me.pid, "started": me.create_time()}


def owner_gone(owner: dict[str, Any]) -> bool:
    """The process `owner` (owner_tag()) names is gone from this host (or its pid was
    reused); another host's owner is taken as running."""
    import psutil

    if owner.get("host") != socket.gethostname():
        return False  # another machine's trial: it may well be running
    try:
        p = psutil.Process(int(owner["pid"]))
        return abs(p.create_time() - float(owner["started"])) > 1.0  # pid reused
    except (psutil.NoSuchProcess, KeyError, ValueError, TypeError):
        return True


def orphaned_trials(study: Any, *, exclusive: bool) -> list[Any]:
    """RUNNING trials whose search process is gone (killed mid-trial). exclusive: this
    process holds the study's only lock (SQLite), so every RUNNING trial is an orphan."""
    from optuna.trial import TrialState

    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = t.user_attrs.get("owner")
        if exclusive or (owner is not None and owner_gone(owner)):
            out.append(t)
    return out


def interrupted_reason(owner: dict[str, Any] | None) -> str:
    pid = (owner or {}).get("pid", "?")
    when = (owner or {}).get("started")
    since = f", started {time.strftime('%Y-%m-%d %H:%M', time.localtime(when))}" if when else ""
    return (f"interrupted: the search process (pid {pid}{since}) ended during this trial "
            "(killed or crashed); the configuration was not measured")


def silent_reason(owner: dict[str, Any] | None, grace: float) -> str:
    host = (owner or {}).get("host", "?")
    pid = (owner or {}).get("pid", "?")
    return (f"interrupted: its host {host} (pid {pid}) sent no heartbeat for more than "
            f"{grace:g} s (killed, crashed or cut off); the configuration is measured again")
