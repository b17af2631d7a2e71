"""Exceptions raised by the library; the CLI maps them to one stderr line and an exit code.

Exit codes (documented in README and `autotune --help`):
    0  success
    1  error (a measurement or a tool failed; the message says which and how to fix it)
    2  usage error (bad option or argument)
    3  a gate failed (`--min-iops`, `--min-seq-mibps`: measured figure below the threshold)
    130 interrupted (Ctrl-C / SIGTERM); partial results are kept where the command says so
"""

from __future__ import annotations


class AutotuneError(Exception):
    """Base class: a failure a user can act on. `str(err)` is the one-line message."""

    exit_code = 1


class UsageError(AutotuneError):
    """An option or argument is invalid."""

    exit_code = 2


class GateFailed(AutotuneError):
    """A measured figure is below a threshold the user asked to enforce."""

    exit_code = 3


class ToolMissing(AutotuneError):
    """An external program (fio, iostat, ...) is not installed."""


class NotPermitted(AutotuneError):
    """The operation needs privileges (root, FUSE, cgroups) this process does not have."""
