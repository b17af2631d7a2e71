"""The search space: which DataLoader settings `autotune search` tries.

Loaded from YAML (configs/search/default.yaml); `auto` entries are resolved against the
machine (usable cores, CUDA) and the storage probe (how many reads in flight pay).
The same space drives the TPE study and the exhaustive `--grid`, so the two compare.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import UsageError

SPACES_DIR = Path(__file__).resolve().parent.parent.parent / "configs" / "search"
_KEYS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory", "batch_size")


@dataclass
class SearchSpace:
    """Resolved choices for each setting; a single choice means the setting is fixed."""

    num_workers: list[int]
    prefetch_factor: list[int]
    persistent_workers: list[bool]
    pin_memory: list[bool]
    batch_size: list[int] | None = None  # None: the preset's batch size, not searched
    notes: list[str] = field(default_factory=list)
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in _KEYS} | {"notes": self.notes, "source": self.source}

    def suggest(self, trial: Any) -> dict[str, Any]:
        """Draw one configuration from an Optuna trial (prefetch only when workers > 0:
        DataLoader refuses prefetch_factor with 0 workers)."""
        p: dict[str, Any] = {"num_workers": _pick(trial, "num_workers", self.num_workers)}
        if p["num_workers"] > 0:
            p["prefetch_factor"] = _pick(trial, "prefetch_factor", self.prefetch_factor)
            p["persistent_workers"] = _pick(trial, "persistent_workers", self.persistent_workers)
        else:
            p["prefetch_factor"] = None
            p["persistent_workers"] = False
        p["pin_memory"] = _pick(trial, "pin_memory", self.pin_memory)
        if self.batch_size:
            p["batch_size"] = _pick(trial, "batch_size", self.batch_size)
        return p

    def grid(self) -> list[dict[str, Any]]:
        """Every distinct configuration of the space (workers 0 has no prefetch choices)."""
        out: list[dict[str, Any]] = []
        seen: set[tuple] = set()
        for w, pf, pers, pin, bs in itertools.product(
                self.num_workers, self.prefetch_factor, self.persistent_workers,
                self.pin_memory, self.batch_size or [None]):
            p = {"num_workers": w, "prefetch_factor": pf if w else None,
                 "persistent_workers": pers if w else False, "pin_memory": pin}
            if bs is not None:
                p["batch_size"] = bs
            key = config_key(p)
            if key not in seen:
                seen.add(key)
                out.append(p)
        return out


def config_key(p: dict[str, Any]) -> tuple:
    """A hashable identity of a configuration (for duplicates and look-ups)."""
    return tuple((k, p.get(k)) for k in _KEYS if k in p or k != "batch_size")


def _pick(trial: Any, name: str, choices: list[Any]) -> Any:
    if len(choices) == 1:
        return choices[0]
    if _is_ordered(choices):
        # Ordered numbers (workers 0,1,2,3,4,6,8; prefetch 1,2,4,8): TPE models them as
        # numbers, so a good 6 makes 8 likely next; as categories each is learnt alone and
        # 8 trials of a 49-point space found 0.86 of the grid's best behind a 5 ms FUSE delay.
        # The drawn integer snaps to the nearest choice (a grid's enqueued values are exact).
        v = trial.suggest_int(name, choices[0], choices[-1])
        return min(choices, key=lambda c: (abs(c - v), c))
    return trial.suggest_categorical(name, choices)


def _is_ordered(xs: list[Any]) -> bool:
    return (len(xs) > 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in xs)
            and xs == sorted(set(xs)))


def max_workers_for(cores: int, best_concurrency: int | None) -> tuple[int, str]:
    """The num_workers bound: cores, raised (up to 4x cores, at most 64) when the storage
    probe found that more reads in flight give more files/s (latency-bound storage)."""
    bound = max(1, cores)
    why = f"{cores} usable core(s)"
    if best_concurrency and best_concurrency > cores:
        bound = min(max(cores * 4, 4), 64, max(best_concurrency, cores))
        why += (f"; storage served most files/s with {best_concurrency} reads in flight, so up "
                f"to {bound} workers (latency hidden by more workers than cores)")
    return bound, why


def load_space(path: str | Path | None = None, *, cores: int, cuda: bool,
               best_concurrency: int | None = None) -> SearchSpace:
    """Read a space YAML and resolve its `auto` entries."""
    p = Path(path) if path else SPACES_DIR / "default.yaml"
    if not p.is_file() and path and (SPACES_DIR / f"{path}.yaml").is_file():
        p = SPACES_DIR / f"{path}.yaml"
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except OSError as e:
        raise UsageError(f"{p}: cannot read the search space ({e.strerror}).") from e
    except yaml.YAMLError as e:
        raise UsageError(f"{p}: not valid YAML ({e}).") from e
    if not isinstance(raw, dict):
        raise UsageError(f"{p}: a search space is a mapping of setting -> choices.")
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise UsageError(f"{p}: unknown setting(s) {', '.join(unknown)}; a space may set "
                         f"{', '.join(_KEYS)}.")
    notes: list[str] = []

    def choices(key: str, default: Any) -> Any:
        entry = raw.get(key, {"choices": default})
        if not isinstance(entry, dict):
            entry = {"choices": entry}
        return entry.get("choices", default), entry

    w, wentry = choices("num_workers", "auto")
    if w == "auto":
        bound, why = max_workers_for(cores, best_concurrency)
        cands = wentry.get("candidates") or list(range(0, bound + 1))
        w = sorted({c for c in cands if c <= bound} | {0, bound})
        notes.append(f"num_workers 0..{bound}: {why}")
    w = _int_list(p, "num_workers", w, 0)
    pf = _int_list(p, "prefetch_factor", choices("prefetch_factor", [1, 2, 4, 8])[0], 1)
    pers = _bool_list(p, "persistent_workers", choices("persistent_workers", [False, True])[0])
    pin_raw = choices("pin_memory", "auto")[0]
    if pin_raw == "auto":
        pin = [False, True] if cuda else [False]
        if not cuda:
            notes.append("pin_memory fixed to false: no CUDA here, so pinning has no effect")
    else:
        pin = _bool_list(p, "pin_memory", pin_raw)
    bs = choices("batch_size", None)[0]
    bs = None if bs is None else _int_list(p, "batch_size", bs, 1)
    if bs:
        notes.append(f"batch size searched over {bs}: it changes training (learning rate, "
                     "convergence); only images/s is compared here")
    return SearchSpace(w, pf, pers, pin, bs, notes, str(p))


def _int_list(p: Path, name: str, v: Any, lo: int) -> list[int]:
    if isinstance(v, int) and not isinstance(v, bool):
        v = [v]
    if not isinstance(v, list) or not v or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise UsageError(f"{p}: {name} choices must be a list of integers, but got {v!r}.")
    if min(v) < lo:
        raise UsageError(f"{p}: {name} must be at least {lo}, but got {min(v)}.")
    return sorted(set(v))


def _bool_list(p: Path, name: str, v: Any) -> list[bool]:
    if isinstance(v, bool):
        v = [v]
    if not isinstance(v, list) or not v or not all(isinstance(x, bool) for x in v):
        raise UsageError(f"{p}: {name} choices must be true/false values, but got {v!r}.")
    return sorted(set(v))


__all__ = ["SearchSpace", "load_space", "max_workers_for", "config_key", "SPACES_DIR"]
