"""Terminal tables of each command's result (rich renderables; never printed here: the
command decides where each goes). Shared cell formats live here."""

from __future__ import annotations

import re
from typing import Any

# Characters that a terminal acts on rather than shows: C0/C1 controls (ESC starts a colour
# or a cursor move, CR overwrites the line) and the invisible or direction-changing ones
# (zero-width, line/paragraph separators, bidi overrides and isolates, BOM).
_UNSHOWN = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m[0])
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(value: object, *, markup: bool = False) -> str:
    """`value` (a path, a file or class name, a message naming one: anything from the
    dataset or the user) as the terminal may print it: control characters written as
    escapes (`\\x1b[31m`), so a file name cannot colour, move or overwrite what is printed.
    `markup=True` where rich reads the string as markup (table cells and titles, a
    console.print of a str): its `[tags]` are escaped too."""
    s = _UNSHOWN.sub(_escape, str(value))
    if markup:
        from rich.markup import escape

        s = escape(s)
    return s


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
    # Per process-second, its threads' time: a process whose threads wait for a CPU
    # together shows over 100 % (runnable 117 % read as a wrong sum under "share").
    out: list[Any] = [Text(f"{title} (its threads' time per second of each process, "
                           f"{b.wall_s:.1f} s; several threads can pass 100 %)", style="bold")]
    out += [Text(f"  {line}", style="dim" if line.startswith("note:") else "")
            for line in b.lines()]
    return out


def environment_texts(env: dict[str, Any] | None) -> list[Any]:
    """The header lines of what the job's container allows (cpu, memory, /dev/shm), then
    each limitation in yellow: what autotune could not do here and what that changes
    (autotune.environment; `env` is Environment.to_dict())."""
    from rich.text import Text

    if not env or not env.get("lines"):
        return []
    limits = set(env.get("limitations") or [])
    out: list[Any] = []
    for line in env["lines"]:
        if line in limits:
            out.append(Text(f"  limitation: {printable(line)}", style="yellow"))
        else:
            out.append(Text(f"  {printable(line)}", style="dim"))
    return out
