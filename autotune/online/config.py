"""One loader configuration: the settings the online loader tunes (autotune.params'
LoaderSettings, always applied: no worker-only setting without workers)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from autotune.params import LoaderSettings

TUNED = LoaderSettings.names()


@dataclass(frozen=True)
class Config(LoaderSettings):
    """num_workers, prefetch_factor (None without workers), persistent_workers, pin_memory."""

    def __post_init__(self) -> None:
        # torch refuses the worker-only ones without workers; one spelling per configuration.
        for name, off in self.not_applied().items():
            object.__setattr__(self, name, off)

    def with_(self, **kw: Any) -> Config:
        if kw.get("num_workers") and self.num_workers == 0:
            kw.setdefault("prefetch_factor", 2)
            kw.setdefault("persistent_workers", True)
        return replace(self, **kw)

    def kwargs(self) -> dict[str, Any]:
        """The DataLoader keywords of this configuration."""
        return self.dataloader_kwargs()

    def short(self) -> str:
        if not self.num_workers:
            return "num_workers=0"
        return f"num_workers={self.num_workers}, prefetch_factor={self.prefetch_factor}"
