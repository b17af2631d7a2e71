"""autotune: find what holds a PyTorch input pipeline back, and fix what can be fixed.

Importing this package needs no GPU, no fio and no root: hardware- and tool-specific
pieces (NVML, fio, FUSE) are imported or executed lazily where they are used, and so is
`instrument` (from autotune.instrumentation: a module named like the function would
be shadowed by it as an attribute of the package), `DataLoader` (autotune.online,
which imports torch) and `open_dataset` (autotune.data.open, torch too).
"""

from __future__ import annotations

from typing import Any

from autotune.errors import AutotuneError

__version__ = "0.1.0"
__all__ = ["AutotuneError", "DataLoader", "__version__", "instrument", "loader_kwargs",
           "open_dataset", "tune"]


def __getattr__(name: str) -> Any:
    # PEP 562: `autotune.instrument(loader)` without importing it at package import.
    if name == "instrument":
        from autotune.instrumentation import instrument
        return instrument
    if name == "DataLoader":
        # torch is imported only by those who use it.
        from autotune.online import DataLoader
        return DataLoader
    if name == "open_dataset":
        from autotune.data.open import open_dataset
        return open_dataset
    if name in ("loader_kwargs", "tune"):
        from autotune import handoff
        return getattr(handoff, name)
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")
