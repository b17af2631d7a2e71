"""GPU via NVML: a clean 'no GPU' record here; sane numbers where a GPU exists."""

from __future__ import annotations

import subprocess
import sys

from autotune.monitor import GpuUsage, Unavailable, gpu_snapshot


def test_gpu_record_is_clean_either_way() -> None:
    g = gpu_snapshot()
    if isinstance(g, Unavailable):
        d = g.to_dict()
        assert d["available"] is False
        assert "NVML" in d["reason"] or "pynvml" in d["reason"]
        return
    assert isinstance(g, GpuUsage) and g.devices
    for dev in g.devices:
        assert dev.name
        if dev.util_pct is not None:
            assert 0.0 <= dev.util_pct <= 100.0
        if dev.mem_total_bytes is not None:
            assert 0 < dev.mem_total_bytes and 0 <= dev.mem_used_bytes <= dev.mem_total_bytes
    assert g.to_dict()["available"] is True


def test_import_and_read_without_pynvml() -> None:
    # sys.modules[name] = None makes `import pynvml` raise ImportError, as when absent.
    code = ("import sys; sys.modules['pynvml'] = None\n"
            "import autotune.monitor as m\n"
            "g = m.gpu_snapshot()\n"
            "assert isinstance(g, m.Unavailable), g\n"
            "print(g.reason)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pynvml not installed" in out.stdout


def test_importing_the_monitor_does_not_import_pynvml() -> None:
    code = "import sys, autotune.monitor; print('pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


class _FakeNvml:
    """Stands in for pynvml to exercise the adapter where no GPU exists (the real path is
    the test above on a GPU machine): device 1 does not support utilisation (as MIG)."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    def __init__(self) -> None:
        self.shut = False

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: self.shut = True
    def nvmlDeviceGetCount(self) -> int: return 2
    def nvmlDeviceGetHandleByIndex(self, i: int) -> int: return i
    def nvmlDeviceGetName(self, h: int) -> bytes: return b"NVIDIA H200" if h == 0 else "MIG 1g"

    def nvmlDeviceGetUtilizationRates(self, h: int):
        if h == 1:
            raise self.NVMLError_NotSupported("Not Supported")
        return type("U", (), {"gpu": 87, "memory": 40})()

    def nvmlDeviceGetMemoryInfo(self, h: int):
        return type("M", (), {"used": 10 << 30, "total": 141 << 30})()


def test_adapter_with_a_stand_in_nvml(monkeypatch) -> None:
    from autotune.monitor import GpuReader
    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    r = GpuReader()
    assert r.open() is None
    g = r.read()
    assert isinstance(g, GpuUsage)
    d0, d1 = g.devices
    assert (d0.name, d0.util_pct, d0.mem_util_pct) == ("NVIDIA H200", 87.0, 40.0)
    assert d0.mem_used_bytes == 10 << 30 and d0.mem_total_bytes == 141 << 30
    assert d1.name == "MIG 1g" and d1.util_pct is None and d1.mem_used_bytes == 10 << 30
    r.close()
    assert fake.shut
