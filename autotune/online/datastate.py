"""What a worker kept from an earlier epoch would not see: the dataset changed in this process.

A DataLoader worker holds a copy of the dataset from when it started (forked, or unpickled
from the copy spawn sent it). torch's default, persistent_workers=False, starts new workers
every epoch, so a loop that sets `dataset.size = 160` or `dataset.transform = t` between
epochs (an image-size schedule, a curriculum) reaches them. The tuner turns
persistent_workers on where the user did not give it; `state()` is how it sees such a
change, to start new workers for that epoch instead.

The state is a bounded walk of the dataset's attributes (`__dict__`, and the items of small
lists, tuples and dicts, a few levels down): scalars and strings by value, everything
else by identity, lists and dicts with their length. It sees an attribute given a new
value or a new object, an item appended to a short list, an attribute of a transform
changed; not a change inside a large container, an array or a tensor written in place, or
an object without a `__dict__` (a C extension's), whose state only its own code knows.
Nothing is called: no property, no `__getattr__` beyond the type's own `__dict__` slot.
"""

from __future__ import annotations

import types
from typing import Any

_SCALARS = (bool, int, float, complex, str, bytes, type(None))
_OPAQUE = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType,
           types.MethodType)
MAX_NODES = 2000     # attributes and items visited at the most (about a millisecond)
MAX_DEPTH = 4        # dataset.transform.transforms[0].size
MAX_ITEMS = 64       # a longer list or dict counts by its length and identity only


def state(dataset: Any) -> tuple[Any, ...]:
    """A fingerprint of `dataset`'s attributes that changes when the loop changes them."""
    out: list[Any] = []
    todo: list[tuple[str, Any, int]] = [("dataset", dataset, 0)]
    while todo and len(out) < MAX_NODES:
        name, v, depth = todo.pop()
        if isinstance(v, _SCALARS):
            out.append((name, type(v).__name__, hash(v)))
            continue
        out.append((name, type(v).__name__, id(v)))
        if depth >= MAX_DEPTH or isinstance(v, _OPAQUE):
            continue
        if isinstance(v, (list, tuple)):
            out.append((name, len(v)))
            if len(v) <= MAX_ITEMS:
                todo.extend((f"{name}[{i}]", x, depth + 1) for i, x in enumerate(v))
        elif isinstance(v, dict):
            out.append((name, len(v)))
            if len(v) <= MAX_ITEMS:
                todo.extend((f"{name}[{k!r}]", x, depth + 1) for k, x in list(v.items())
                            if isinstance(k, _SCALARS))
        else:
            d = _own_dict(v)
            if d:
                todo.extend((f"{name}.{k}", x, depth + 1) for k, x in list(d.items()))
    return tuple(out)


def _own_dict(v: Any) -> dict[str, Any] | None:
    """`v.__dict__` read from the type's slot (no __getattr__ of a proxy is called)."""
    for klass in type(v).__mro__:
        slot = klass.__dict__.get("__dict__")
        if slot is not None:
            try:
                d = slot.__get__(v, type(v))
            except Exception:  # noqa: BLE001 (a descriptor of a class we do not know)
                return None
            return d if isinstance(d, dict) else None
    return None


def changed(before: tuple[Any, ...], after: tuple[Any, ...]) -> str | None:
    """The first attribute that differs between two states (its path), or None."""
    if before == after:
        return None
    for a, b in zip(before, after):
        if a != b:
            return a[0]
    return (before[len(after)] if len(before) > len(after) else after[len(before)])[0]
