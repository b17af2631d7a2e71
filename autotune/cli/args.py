"""Argument types shared by every command: refused in the words of the option."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def positive_float(name: str) -> Callable[[str], float]:
    def conv(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, but got {s!r}.") from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be positive, but got {s}.")
        return v
    return conv


def nonneg_float(name: str) -> Callable[[str], float]:
    def conv(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, but got {s!r}.") from None
        if not v >= 0 or v == float("inf"):
            raise argparse.ArgumentTypeError(f"{name} must be a number >= 0, but got {s}.")
        return v
    return conv


def int_at_least(name: str, low: int) -> Callable[[str], int]:
    """An integer >= low."""
    def conv(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, but got {s!r}.") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"{name} must be at least {low}, but got {s}.")
        return v
    return conv


def positive_int(name: str) -> Callable[[str], int]:
    return int_at_least(name, 1)


def nonneg_int(name: str) -> Callable[[str], int]:
    return int_at_least(name, 0)


def int_list(name: str) -> Callable[[str], list[int]]:
    """Comma-separated integers >= 1, e.g. 1,4,16,64."""
    def conv(s: str) -> list[int]:
        try:
            vals = [int(x) for x in s.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be comma-separated integers such as 1,4,16,64, but got {s!r}.") from None
        if not vals or min(vals) < 1:
            raise argparse.ArgumentTypeError(f"{name} values must be at least 1, but got {s!r}.")
        return vals
    return conv


def fraction(name: str) -> Callable[[str], float]:
    """A number in (0, 1]."""
    def conv(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, but got {s!r}.") from None
        if not 0 < v <= 1:
            raise argparse.ArgumentTypeError(f"{name} must be in (0, 1], but got {v:g}.")
        return v
    return conv


def size(name: str) -> Callable[[str], int]:
    """A size such as 64MiB or 1G, in bytes."""
    def conv(s: str) -> int:
        from converters.errors import UsageError
        from converters.units import parse_size

        try:
            return parse_size(s, name=name)
        except UsageError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return conv
