"""autotune: find what holds a PyTorch input pipeline back, and fix what can be fixed.

Importing this package needs no GPU, no fio and no root: hardware- and tool-specific
pieces (NVML, fio, FUSE) are imported or executed lazily where they are used.
"""

from autotune.errors import AutotuneError

__version__ = "0.1.0"
__all__ = ["AutotuneError", "__version__"]
