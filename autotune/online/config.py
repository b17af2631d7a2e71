"""One loader configuration: the settings the online loader tunes."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

TUNED = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory")


@dataclass(frozen=True)
class Config:
    """num_workers, prefetch_factor (None without workers), persistent_workers, pin_memory."""

    num_workers: int
    prefetch_factor: int | None
    persistent_workers: bool
    pin_memory: bool

    def __post_init__(self) -> None:
        if self.num_workers == 0:
            # torch refuses both without workers; one spelling per configuration.
            object.__setattr__(self, "prefetch_factor", None)
            object.__setattr__(self, "persistent_workers", False)

    @property
    def queue(self) -> int:
        """Batches a pool holds in flight: workers x prefetch."""
        return self.num_workers * (self.prefetch_factor or 0)

    def with_(self, **kw: Any) -> Config:
        if kw.get("num_workers") and self.num_workers == 0:
            kw.setdefault("prefetch_factor", 2)
            kw.setdefault("persistent_workers", True)
        return replace(self, **kw)

    def kwargs(self) -> dict[str, Any]:
        """The DataLoader keywords of this configuration."""
        kw: dict[str, Any] = {"num_workers": self.num_workers}
        if self.num_workers:
            kw.update(prefetch_factor=self.prefetch_factor,
                      persistent_workers=self.persistent_workers)
        kw["pin_memory"] = self.pin_memory
        return kw

    def short(self) -> str:
        if not self.num_workers:
            return "num_workers=0"
        return f"num_workers={self.num_workers}, prefetch_factor={self.prefetch_factor}"
