"""The DataLoader settings autotune searches: each declared once, here.

A `Param` says everything the rest of the code needs about one setting: its name (the
DataLoader keyword, the BenchConfig field, the key in a space YAML and in JSON), its type
and default choices, whether it only means something with worker processes, how the
bench option sets it, and how it is shown (table column, snippet, YAML). The search
space, the trial's DataLoader call, the knee's cost, the snippet, the YAML block, the
terminal table and the HTML report all iterate `PARAMS`.

Adding a setting is one `register(Param(...))` plus its test; a setting that is not a
BenchConfig field travels in BenchConfig.loader_extra and reaches DataLoader as is.

`LoaderSettings` is one configuration of the built-in settings as a value: the loader part
of a BenchConfig (bench), the configurations autotune.DataLoader switches between (online),
the search's baseline; its validation holds the workers-only rule, written once. A search
configuration stays a dict (a setting its space does not search is absent from it); the
functions below take either.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

from autotune.errors import UsageError
from autotune_base.registry import Registry


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
    needs_workers: the error when a workers_only setting is given (not `off`) with
        num_workers 0; "{value}" is its value.
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
    needs_workers: str = ""

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

    def is_off(self, v: Any) -> bool:
        """`v` says the same as `off` (a flag by its truth: persistent_workers=0 is off)."""
        return bool(v) == bool(self.off) if self.kind is bool else v == self.off

    def python(self, v: Any) -> str:
        return repr(v)

    def yaml(self, v: Any) -> str:
        return str(v).lower() if isinstance(v, bool) else str(v)

    def cell(self, v: Any) -> str:
        if v is None:
            return "-"
        return ("y" if v else "n") if isinstance(v, bool) else str(v)


PARAMS: Registry[Param] = Registry("parameter")


def register(p: Param) -> Param:
    return PARAMS.add(p.name, p)


def unregister(name: str) -> None:
    PARAMS.remove(name)


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


def need_int(name: str, v: Any, lo: int) -> None:
    """Raise UsageError unless `v` is an integer of at least `lo` (a bool is not one)."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise UsageError(f"{name} must be an integer, but got {v!r}.", setting=name)
    if v < lo:
        raise UsageError(f"{name} must be at least {lo}, but got {v}.", setting=name)


@dataclass(frozen=True)
class LoaderSettings:
    """The built-in DataLoader settings of one configuration (each a registered `Param`
    of the same name; batch_size is the model's and stays apart).

    prefetch_factor is None, and persistent_workers False, where they do not apply (no
    workers): `applied()` makes them so, `validate()` refuses them given otherwise.
    """

    num_workers: int = 0
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    pin_memory: bool = False

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> LoaderSettings:
        """Its settings in a configuration dict (absent ones: the defaults above)."""
        return cls(**{k: params[k] for k in cls.names() if k in params})

    def params(self) -> dict[str, Any]:
        """As a configuration dict (its fields are in the registry's order)."""
        return {k: getattr(self, k) for k in self.names()}

    def not_applied(self) -> dict[str, Any]:
        """The settings that do not apply here (workers-only ones without workers), each
        with its `off` value."""
        p = self.params()
        return {k: PARAMS[k].off for k in p if not PARAMS[k].applies(p)}

    def applied(self) -> LoaderSettings:
        """The same with the settings that do not apply set to `off`."""
        return replace(self, **self.not_applied())

    def validate(self) -> LoaderSettings:
        """Raise UsageError, in the words of the setting, for what DataLoader would refuse:
        an integer below its minimum, a workers-only setting given without workers, no
        prefetch_factor with them. Returns self."""
        p = self.params()
        for k, v in p.items():
            prm = PARAMS[k]
            if prm.kind is int and prm.workers_only and v is None:
                if prm.applies(p):
                    raise UsageError(f"{k} must be at least {prm.minimum} when num_workers > 0, "
                                     "but got None.", setting=k)
            elif prm.kind is int:
                need_int(k, v, prm.minimum)
            if not prm.applies(p) and not prm.is_off(v):
                raise UsageError(prm.needs_workers.format(value=v), setting=(k, "num_workers"))
        return self

    @property
    def queue(self) -> int:
        """Batches the workers hold in flight: num_workers x prefetch_factor."""
        return self.num_workers * (self.prefetch_factor or 0)

    def label(self) -> str:
        """'w4 pf2 persistent pin' (see `label`)."""
        return label(self.params())

    def dataloader_kwargs(self) -> dict[str, Any]:
        """The DataLoader keywords (see `loader_kwargs`: no worker-only ones without workers)."""
        return loader_kwargs(self.params())


# -- resolvers of "auto" ---------------------------------------------------------------

def _auto_workers(ctx: dict[str, Any]) -> tuple[list[Any], str | None]:
    bound, why = ctx["worker_bound"]
    cands = ctx.get("candidates") or list(range(0, bound + 1))
    return sorted({c for c in cands if c <= bound} | {0, bound}), f"num_workers 0..{bound}: {why}"


def _auto_pin(ctx: dict[str, Any]) -> tuple[list[Any], str | None]:
    if ctx.get("cuda"):
        return [False, True], None
    return [False], "pin_memory fixed to false: no CUDA here, so pinning has no effect"


register(Param("num_workers", int, "auto", minimum=0, option="--workers", column="workers",
               cost=0, ordered=True, resolve=_auto_workers,
               help="DataLoader num_workers (0 = load in the main process)"))
register(Param("prefetch_factor", int, [1, 2, 4, 8], minimum=1, workers_only=True,
               column="prefetch", cost=1, ordered=True,
               help="batches each worker loads ahead (only with --workers > 0)",
               needs_workers="prefetch_factor={value} needs num_workers > 0: with 0 workers the "
                             "main process loads each batch when it is asked for and nothing "
                             "is prefetched. Drop prefetch_factor or set num_workers."))
register(Param("persistent_workers", bool, [False, True], workers_only=True, off=False,
               column="persist", cost=2,
               help="keep workers between epochs (only with --workers > 0)",
               needs_workers="persistent_workers needs num_workers > 0 (with 0 workers there "
                             "is no worker process to keep between epochs)."))
register(Param("pin_memory", bool, "auto", column="pin", cost=3, resolve=_auto_pin,
               help="DataLoader pin_memory (no effect without CUDA: the result says so)"))
register(Param("batch_size", int, None, minimum=1, column="batch", searched_by_default=False,
               help="samples per batch"))
PARAMS.builtin.update(PARAMS)  # the settings above; register() adds more at run time

__all__ = ["PARAMS", "LoaderSettings", "Param", "cells", "config_key", "cost_key", "label",
           "loader_kwargs", "need_int", "register", "shown", "unregister"]
