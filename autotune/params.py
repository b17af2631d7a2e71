"""The DataLoader settings autotune searches: each declared once, here.

A `Param` says everything the rest of the code needs about one setting: its name (the
DataLoader keyword, the BenchConfig field, the key in a space YAML and in JSON), its type
and default choices, whether it only means something with worker processes, how the
bench option sets it, and how it is shown (table column, snippet, YAML). The search
space, the trial's DataLoader call, the knee's cost, the snippet, the YAML block, the
terminal table and the HTML report all iterate `PARAMS`.

Adding a setting is one `register(Param(...))` plus its test; a setting that is not a
BenchConfig field travels in BenchConfig.loader_extra and reaches DataLoader as is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Param:
    """One DataLoader setting.

    name: DataLoader keyword (also BenchConfig field or loader_extra key, YAML key).
    kind: int or bool.
    choices: the default space's choices; "auto" is resolved by `resolve` (machine, probe).
    minimum: smallest int value DataLoader accepts.
    workers_only: meaningful only with num_workers > 0 (DataLoader refuses it, or it has
        no effect); then it takes `off` when num_workers is 0.
    option, dest: the bench option that sets it ("--workers") and its argparse dest.
    column: table header; cost: its place in the knee's "cheaper" order (lower first);
    ordered: TPE models int choices as numbers (a good 6 makes 8 likely next).
    resolve: f(ctx) -> (choices, note) for "auto" (ctx: cores, cuda, worker_bound, ...).
    """

    name: str
    kind: type
    choices: Any
    help: str
    minimum: int = 0
    workers_only: bool = False
    off: Any = None
    option: str | None = None
    column: str = ""
    cost: int = 100
    ordered: bool = False
    resolve: Callable[[dict[str, Any]], tuple[list[Any], str | None]] | None = None
    searched_by_default: bool = True

    @property
    def flag(self) -> str:
        return self.option or "--" + self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        """The argparse dest of `flag`."""
        return self.flag[2:].replace("-", "_")

    def applies(self, params: dict[str, Any]) -> bool:
        return not (self.workers_only and not params.get("num_workers"))

    def value(self, params: dict[str, Any]) -> Any:
        """Its value in a configuration (`off` where it does not apply)."""
        return params.get(self.name) if self.applies(params) else self.off

    def python(self, v: Any) -> str:
        return repr(v)

    def yaml(self, v: Any) -> str:
        return str(v).lower() if isinstance(v, bool) else str(v)

    def cell(self, v: Any) -> str:
        if v is None:
            return "-"
        return ("y" if v else "n") if isinstance(v, bool) else str(v)


PARAMS: dict[str, Param] = {}


def register(p: Param) -> Param:
    if p.name in PARAMS:
        raise ValueError(f"parameter {p.name!r} is already registered.")
    PARAMS[p.name] = p
    return p


def unregister(name: str) -> None:
    if name in _BUILTIN:
        raise ValueError(f"parameter {name!r} is built in and cannot be removed.")
    PARAMS.pop(name, None)


def searched() -> list[Param]:
    return list(PARAMS.values())


def config_key(params: dict[str, Any]) -> tuple:
    """A hashable identity of a configuration (for duplicates and look-ups); a setting
    the configuration does not search (batch_size unless searched) is left out."""
    return tuple((k, params.get(k)) for k, p in PARAMS.items()
                 if k in params or p.searched_by_default)


def cost_key(params: dict[str, Any]) -> tuple:
    """Cheaper first: fewer workers, then lower prefetch, then the flags off."""
    ordered = sorted(PARAMS.values(), key=lambda p: p.cost)
    return tuple(_as_cost(p.value(params)) for p in ordered if p.cost < 100)


def _as_cost(v: Any) -> float:
    return 0.0 if v is None else float(v)


def label(params: dict[str, Any]) -> str:
    """'w4 pf2 persistent pin': the short name of a configuration."""
    parts = [f"w{params.get('num_workers', 0)}"]
    if params.get("num_workers"):
        parts.append(f"pf{params.get('prefetch_factor')}")
    parts += [p.name.split("_")[0] for p in PARAMS.values()
              if p.kind is bool and p.value(params)]
    if "batch_size" in params:
        parts.append(f"bs{params['batch_size']}")
    return " ".join(parts)


def shown(configs: list[dict[str, Any]]) -> list[Param]:
    """The settings a table of these configurations shows: every searched one, and the
    others (batch size) only when some configuration sets them."""
    return [p for n, p in PARAMS.items()
            if p.searched_by_default or any(n in c for c in configs)]


def cells(params: dict[str, Any], columns: list[Param]) -> list[str]:
    """Table cells of a configuration ('-' where a setting does not apply)."""
    return [p.cell(p.value(params)) for p in columns]


def loader_kwargs(params: dict[str, Any]) -> dict[str, Any]:
    """The DataLoader keywords of a configuration (worker-only ones only with workers)."""
    return {k: params[k] for k, p in PARAMS.items() if k in params and p.applies(params)}


# -- resolvers of "auto" ---------------------------------------------------------------

def _auto_workers(ctx: dict[str, Any]) -> tuple[list[Any], str | None]:
    bound, why = ctx["worker_bound"]
    cands = ctx.get("candidates") or list(range(0, bound + 1))
    return sorted({c for c in cands if c <= bound} | {0, bound}), f"num_workers 0..{bound}: {why}"


def _auto_pin(ctx: dict[str, Any]) -> tuple[list[Any], str | None]:
    if ctx.get("cuda"):
        return [False, True], None
    return [False], "pin_memory fixed to false: no CUDA here, so pinning has no effect"


_BUILTIN = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory", "batch_size")

register(Param("num_workers", int, "auto", minimum=0, option="--workers", column="workers",
               cost=0, ordered=True, resolve=_auto_workers,
               help="DataLoader num_workers (0 = load in the main process)"))
register(Param("prefetch_factor", int, [1, 2, 4, 8], minimum=1, workers_only=True,
               column="prefetch", cost=1, ordered=True,
               help="batches each worker loads ahead (only with --workers > 0)"))
register(Param("persistent_workers", bool, [False, True], workers_only=True, off=False,
               column="persist", cost=2,
               help="keep workers between epochs (only with --workers > 0)"))
register(Param("pin_memory", bool, "auto", column="pin", cost=3, resolve=_auto_pin,
               help="DataLoader pin_memory (no effect without CUDA: the result says so)"))
register(Param("batch_size", int, None, minimum=1, column="batch", searched_by_default=False,
               help="samples per batch"))

__all__ = ["PARAMS", "Param", "cells", "config_key", "cost_key", "label", "loader_kwargs",
           "register", "shown", "unregister"]
