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

from autotune.configfiles import config_dir, load_yaml
from autotune.errors import UsageError
from autotune.params import PARAMS, config_key

SPACES_DIR = config_dir("search")


@dataclass
class SearchSpace:
    """Resolved choices of each searched setting (autotune.params); a single choice means
    the setting is fixed, a setting absent is not searched (the preset's value)."""

    choices: dict[str, list[Any]]
    notes: list[str] = field(default_factory=list)
    source: str = ""

    def __getattr__(self, name: str) -> Any:
        if name in PARAMS:
            return self.__dict__["choices"].get(name)
        raise AttributeError(name)

    def to_dict(self) -> dict[str, Any]:
        return {k: self.choices.get(k) for k in PARAMS} | {"notes": self.notes,
                                                            "source": self.source}

    def suggest(self, trial: Any) -> dict[str, Any]:
        """Draw one configuration from an Optuna trial (worker-only settings only when
        workers > 0: DataLoader refuses prefetch_factor with 0 workers)."""
        p: dict[str, Any] = {}
        for name, prm in PARAMS.items():
            if name not in self.choices:
                continue
            p[name] = _pick(trial, name, self.choices[name]) if prm.applies(p) else prm.off
        return p

    def optuna_params(self, p: dict[str, Any]) -> dict[str, Any]:
        """A configuration as Optuna records it (an index for ordered choices), to enqueue."""
        out: dict[str, Any] = {}
        for name, v in p.items():
            ch = self.choices.get(name)
            if not ch or len(ch) == 1 or v is None or not PARAMS[name].applies(p):
                continue
            if _is_ordered(ch):
                out[index_name(name)] = ch.index(v)
            else:
                out[name] = v
        return out

    def from_optuna(self, op: dict[str, Any]) -> dict[str, Any]:
        """A configuration from what Optuna recorded (indices back to values)."""
        p: dict[str, Any] = {}
        for name, prm in PARAMS.items():
            ch = self.choices.get(name)
            if not ch:
                continue
            if not prm.applies(p):
                p[name] = prm.off
            elif len(ch) == 1:
                p[name] = ch[0]
            elif index_name(name) in op:
                p[name] = ch[min(int(op[index_name(name)]), len(ch) - 1)]
            else:
                p[name] = op.get(name, ch[0])
        return p

    def grid(self) -> list[dict[str, Any]]:
        """Every distinct configuration of the space (workers 0 has no prefetch choices)."""
        out: list[dict[str, Any]] = []
        seen: set[tuple] = set()
        names = [n for n in PARAMS if n in self.choices]
        for values in itertools.product(*(self.choices[n] for n in names)):
            p: dict[str, Any] = {}
            for n, v in zip(names, values):
                p[n] = v if PARAMS[n].applies(p) else PARAMS[n].off
            key = config_key(p)
            if key not in seen:
                seen.add(key)
                out.append(p)
        return out


def _pick(trial: Any, name: str, choices: list[Any]) -> Any:
    if len(choices) == 1:
        return choices[0]
    if _is_ordered(choices):
        # Ordered numbers (workers 0,1,2,3,4,6,8; prefetch 1,2,4,8): TPE models an index
        # into them as a number, so a good 6 makes 8 likely next; as categories each is
        # learnt alone and 8 trials of a 49-point space found 0.86 of the grid's best
        # behind a 5 ms FUSE delay. The index is what Optuna records: the value measured
        # is choices[index], exactly (never an int snapped to a choice afterwards).
        return choices[trial.suggest_int(index_name(name), 0, len(choices) - 1)]
    return trial.suggest_categorical(name, choices)


def index_name(name: str) -> str:
    return f"{name}_index"


def _is_ordered(xs: list[Any]) -> bool:
    return (len(xs) > 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in xs)
            and xs == sorted(set(xs)))


def max_workers_for(cores: int, best_concurrency: int | None) -> tuple[int, str]:
    """The num_workers bound (autotune.verdict.bounds.worker_bound, the one the verdict
    and the in-loop tuner use): cores, raised (up to 4x cores, at most 64) when the
    storage probe found that more reads in flight give more files/s (latency-bound
    storage)."""
    from autotune.verdict.bounds import worker_bound

    bound = worker_bound(max(1, cores), reads_in_flight=best_concurrency)
    why = f"{cores} usable core(s)"
    if bound > max(1, cores):
        why += (f"; storage served most files/s with {best_concurrency} reads in flight, so up "
                f"to {bound} workers (latency hidden by more workers than cores)")
    return bound, why


def load_space(path: str | Path | None = None, *, cores: int, cuda: bool,
               best_concurrency: int | None = None) -> SearchSpace:
    """Read a space YAML and resolve its `auto` entries."""
    p = Path(path) if path else SPACES_DIR / "default.yaml"
    if not p.is_file() and path and (SPACES_DIR / f"{path}.yaml").is_file():
        p = SPACES_DIR / f"{path}.yaml"
    raw = load_yaml(p, "search space")
    unknown = sorted(set(raw) - set(PARAMS))
    if unknown:
        raise UsageError(f"{p}: unknown setting(s) {', '.join(unknown)}; a space may set "
                         f"{', '.join(PARAMS)}.")
    ctx = {"cores": cores, "cuda": cuda,
           "worker_bound": max_workers_for(cores, best_concurrency)}
    notes: list[str] = []
    choices: dict[str, list[Any]] = {}
    for name, prm in PARAMS.items():
        entry = raw.get(name, {"choices": prm.choices})
        if not isinstance(entry, dict):
            entry = {"choices": entry}
        v = entry.get("choices", prm.choices)
        if v is None:
            continue  # not searched: the preset's value
        if v == "auto" and prm.resolve is not None:
            v, note = prm.resolve({**ctx, "candidates": entry.get("candidates")})
            if note:
                notes.append(note)
        choices[name] = (_bool_list(p, name, v) if prm.kind is bool
                         else _int_list(p, name, v, prm.minimum))
    if "batch_size" in choices:
        notes.append(f"batch size searched over {choices['batch_size']}: it changes training "
                     "(learning rate, convergence); only images/s is compared here")
    return SearchSpace(choices, notes, str(p))


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
