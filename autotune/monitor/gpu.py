"""GPU utilisation and memory per GPU via NVML.

`pynvml` (package nvidia-ml-py) is imported inside `GpuReader.open()`, so importing the
monitor needs neither the package nor a driver. Without either, readings are an
`Unavailable` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.monitor.records import Unavailable, to_jsonable


@dataclass(frozen=True)
class GpuDevice:
    """One GPU at one sample. None where NVML does not support the query (e.g. MIG)."""

    index: int
    name: str
    util_pct: float | None        # % of the last NVML sample period a kernel was running
    mem_util_pct: float | None    # % of that period device memory was read or written
    mem_used_bytes: int | None
    mem_total_bytes: int | None


@dataclass(frozen=True)
class GpuUsage:
    """All GPUs NVML sees, at one sample."""

    devices: list[GpuDevice]

    def to_dict(self) -> dict[str, Any]:
        return {"available": True, "devices": to_jsonable(self.devices)}


_REASONS = (
    ("NVMLError_LibraryNotFound", "NVML: driver library not found (no NVIDIA driver)"),
    ("NVMLError_DriverNotLoaded", "NVML: NVIDIA driver not loaded"),
    ("NVMLError_NoPermission", "NVML: no permission to query the GPU"),
    ("NVMLError_InsufficientPermissions", "NVML: no permission to query the GPU"),
)


def _nvml_reason(err: BaseException, nvml: Any) -> str:
    # The NVMLError subclasses are generated at import time; look them up by name.
    for cls, text in _REASONS:
        t = getattr(nvml, cls, None)
        if t is not None and isinstance(err, t):
            return text
    return f"NVML: {err}"


class GpuReader:
    """Opens NVML once and reads every GPU per sample; `close()` shuts NVML down."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: list[tuple[int, str, Any]] = []
        self.unavailable: Unavailable | None = None

    def open(self) -> Unavailable | None:
        """Initialise NVML; returns why GPUs cannot be read, or None when they can."""
        try:
            import pynvml  # noqa: PLC0415  (lazy: optional dependency, may lack a driver)
        except ImportError:
            self.unavailable = Unavailable("pynvml not installed (pip install nvidia-ml-py)")
            return self.unavailable
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            self.unavailable = Unavailable(_nvml_reason(e, pynvml))
            return self.unavailable
        self._nvml = pynvml
        try:
            count = pynvml.nvmlDeviceGetCount()
            for i in range(count):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(h)
                self._handles.append((i, name.decode() if isinstance(name, bytes) else name, h))
        except pynvml.NVMLError as e:
            self.close()
            self.unavailable = Unavailable(_nvml_reason(e, pynvml))
            return self.unavailable
        if not self._handles:
            self.close()
            self.unavailable = Unavailable("NVML: no GPU found")
        return self.unavailable

    def read(self) -> GpuUsage | Unavailable:
        """Current utilisation and memory of each GPU."""
        if self.unavailable is not None:
            return self.unavailable
        if self._nvml is None:
            if self.open() is not None:
                return self.unavailable  # type: ignore[return-value]
        nvml = self._nvml
        devices: list[GpuDevice] = []
        for i, name, h in self._handles:
            util = mem_util = None
            used = total = None
            try:
                u = nvml.nvmlDeviceGetUtilizationRates(h)
                util, mem_util = float(u.gpu), float(u.memory)
            except nvml.NVMLError:
                pass   # not supported on MIG instances / some vGPUs
            try:
                m = nvml.nvmlDeviceGetMemoryInfo(h)
                used, total = int(m.used), int(m.total)
            except nvml.NVMLError:
                pass
            devices.append(GpuDevice(i, name, util, mem_util, used, total))
        return GpuUsage(devices)

    def close(self) -> None:
        """Shut NVML down (idempotent)."""
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass
            self._nvml = None
            self._handles = []


def gpu_snapshot() -> GpuUsage | Unavailable:
    """One-shot reading of all GPUs (opens and closes NVML)."""
    r = GpuReader()
    try:
        return r.read()
    finally:
        r.close()
