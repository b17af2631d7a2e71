"""Terminal tables of each command's result (rich renderables; never printed here: the
command decides where each goes). Shared cell formats live here."""

from __future__ import annotations

from typing import Any


def _ms(x: float | None) -> str:
    return "-" if x is None else (f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 100 else f"{x:.0f}")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}" if x >= 0.1 else f"{x:.1%}"


def _stat(d: dict[str, Any] | None, key: str = "median", fmt: str = "{:,.1f}") -> str:
    if not d or d.get(key) is None:
        return "-"
    return fmt.format(d[key])


def budget_texts(budget: dict[str, Any] | None, title: str = "time budget") -> list[Any]:
    """The time budget's lines (a line per process class, PSI, notes) under a bold title;
    [] when there is none (autotune.monitor.timebudget)."""
    from rich.text import Text

    from autotune.monitor.timebudget import TimeBudget

    if not budget or not budget.get("available"):
        return []
    b = TimeBudget.from_dict(budget)
    out: list[Any] = [Text(f"{title} (share of each process's wall time, {b.wall_s:.1f} s)",
                           style="bold")]
    out += [Text(f"  {line}", style="dim" if line.startswith("note:") else "")
            for line in b.lines()]
    return out
