"""A name -> entry table that code extends at run time (the dataset formats, the DataLoader
settings): a name registered twice is refused, and a built-in entry cannot be removed."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


class Registry(dict[str, T]):
    """A dict of entries by name, in registration order; `builtin` names the entries that
    `remove` refuses. `kind` names an entry in the errors ("format", "parameter")."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.builtin: set[str] = set()

    def add(self, name: str, entry: T, *, replace: bool = False, hint: str = "") -> T:
        """Add `entry` under `name`; ValueError for a name already there unless `replace`
        (`hint` ends that error: how to replace, where the caller offers it)."""
        if name in self and not replace:
            raise ValueError(f"{self.kind} {name!r} is already registered{hint}.")
        self[name] = entry
        return entry

    def remove(self, name: str) -> None:
        """Remove an entry added at run time (nothing for a name not there); ValueError for
        a built-in one."""
        if name in self.builtin:
            raise ValueError(f"{self.kind} {name!r} is built in and cannot be removed.")
        self.pop(name, None)
