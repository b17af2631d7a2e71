"""How the DataLoader's parts (epoch, switch, budget) hold the loader: weakly, as the
Controller's memory callback does, so that a dropped loader is freed at once and stops its
workers, as torch's does (a strong reference would be a cycle, left to the collector)."""

from __future__ import annotations

import copy
import weakref
from typing import Any


class WeakOwner:
    """A weak reference to the loader that copy.deepcopy follows: a deep copy of the loader
    gets parts that hold the copy, not the original."""

    def __init__(self, owner: Any) -> None:
        self._ref = weakref.ref(owner)

    def __call__(self) -> Any:
        return self._ref()

    def __deepcopy__(self, memo: dict[int, Any]) -> WeakOwner:
        return WeakOwner(copy.deepcopy(self._ref(), memo))
