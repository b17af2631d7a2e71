"""The settings an earlier run settled on, per dataset and machine: ~/.cache/autotune/online.json.

Keyed by the dataset (a `key=` the user passes, else a root path it exposes, else its class),
its length, the batch size and the machine's usable cores. Written atomically (a temporary
file in the same directory, then rename), so a killed run never leaves half a file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

_ROOT_ATTRS = ("root", "path", "data_dir", "directory", "folder")
LOCK_WAIT_S = 2.0


NO_HOME = ("no cache folder: HOME is not set and this uid has no passwd entry; set "
           "AUTOTUNE_CACHE_DIR (or HOME) to keep the start point between runs")


def cache_file() -> Path | None:
    """$AUTOTUNE_CACHE_DIR/online.json, else $XDG_CACHE_HOME or ~/.cache, then
    autotune/online.json; None without a home (user_cache_dir): nothing is read or kept."""
    from autotune_base.fsutil import user_cache_dir

    if given := os.environ.get("AUTOTUNE_CACHE_DIR"):
        return Path(given) / "online.json"
    base = user_cache_dir()
    return base / "autotune" / "online.json" if base is not None else None


def dataset_key(dataset: Any, key: str | None, batch_size: int | None, cores: int,
                ranks: int = 1) -> str:
    """The cache key of a dataset on this machine, with `ranks` on the node beside it: each
    rank's share of the cores and of /dev/shm is another start point (4 ranks' settings
    started a later 2-rank run too low)."""
    if key is None:
        cls = type(dataset)
        key = f"{cls.__module__}.{cls.__qualname__}"
        for attr in _ROOT_ATTRS:
            val = getattr(dataset, attr, None)
            if isinstance(val, (str, os.PathLike)):
                key = os.path.abspath(os.fspath(val))
                break
    try:
        n: Any = len(dataset)
    except TypeError:
        n = "?"
    return f"{key}|len={n}|batch={batch_size}|cores={cores}" + (
        f"|ranks={ranks}" if ranks > 1 else "")   # one rank: the keys written before


def load(key: str, path: Path | None = None) -> dict[str, Any] | None:
    """The stored settings for `key`, None when there are none or the file is unreadable."""
    path = path or cache_file()
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    entry = data.get(key) if isinstance(data, dict) else None
    return entry if isinstance(entry, dict) else None


def store(key: str, settings: dict[str, Any], path: Path | None = None) -> None:
    """Record `settings` for `key`, keeping the other entries; atomic, and under a lock
    beside the file (a PidLock): two jobs storing at once each read the file before the
    other wrote, and the second rename dropped the first's entry. OSError, or an
    AutotuneError naming the holder when the lock is not had within LOCK_WAIT_S (the
    caller says so and trains on)."""
    from autotune_base.errors import AutotuneError
    from autotune_base.fsutil import PidLock

    path = path or cache_file()
    if path is None:
        raise AutotuneError(NO_HOME)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = PidLock(path.with_name(path.name + ".lock"), lambda holder: AutotuneError(
        f"{path}: not written, {holder} has held its lock for {LOCK_WAIT_S:g} s"))
    lock.acquire(wait=LOCK_WAIT_S)
    try:
        _update(path, key, settings)
    finally:
        lock.release()


def remember(key: str, config: Any, *, cut: bool) -> None:
    """Store the settled `config`'s num_workers and prefetch_factor as the next run's start
    point, unless this run was `cut` to its /dev/shm or memory room or a pool failed: that
    is the room of this run (a full /dev/shm settled at no workers, and the next run with
    room started there), not the dataset's. A write that fails is logged, never raised."""
    from autotune.errors import AutotuneError
    from autotune.online.decisions import emit

    if cut:
        emit("cache", f"{cache_file() or 'the cache'}: not written: this run's start point "
             "was cut to its /dev/shm, memory or open-files room, or a pool failed", why="cut")
        return
    try:
        store(key, {k: v for k, v in config.kwargs().items()
                    if k in ("num_workers", "prefetch_factor")})
    except (OSError, AutotuneError) as e:   # a lock held, a foreign lock file
        emit("cache", f"{cache_file() or 'the start point'}: not written ({e})", why=str(e))


def _update(path: Path, key: str, settings: dict[str, Any]) -> None:
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            data = {}
    except (OSError, ValueError):
        data = {}
    data[key] = settings
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".online.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
