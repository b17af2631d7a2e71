"""Parsing and formatting of sizes and rates, shared by every command."""

from __future__ import annotations

import re

from autotune_base.errors import UsageError

_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1000, "kib": 1024, "m": 1024**2, "mb": 1000**2,
          "mib": 1024**2, "g": 1024**3, "gb": 1000**3, "gib": 1024**3, "t": 1024**4,
          "tb": 1000**4, "tib": 1024**4}


def parse_size(text: str | int, *, name: str = "size") -> int:
    """'64M', '1GiB', '1.5g', '4096' -> bytes. Bare K/M/G are binary, as in fio and dd."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise UsageError(f"{name} must be a size such as 512M or 1GiB, but got {text!r}.")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value < 1:
        raise UsageError(f"{name} must be at least 1 byte, but got {text!r}.")
    return int(value)


def fmt_bytes(n: float) -> str:
    """Binary units with one decimal: 1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def fmt_rate(x: float | None, unit: str = "") -> str:
    """Three significant figures for tables: 106474.0 -> '106k', 0.4213 -> '0.421'."""
    if x is None:
        return "-"
    ax = abs(x)
    if ax >= 1e6:
        s = f"{x / 1e6:.3g}M"
    elif ax >= 1e4:
        s = f"{x / 1e3:.3g}k"
    elif ax >= 100:
        s = f"{x:.0f}"
    else:
        s = f"{x:.3g}"
    return f"{s} {unit}".rstrip()
