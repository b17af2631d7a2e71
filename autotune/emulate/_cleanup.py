"""The exit of an emulation's context manager: undo what it set up without hiding an error."""

from __future__ import annotations

from collections.abc import Callable

from autotune.errors import AutotuneError


def undo_on_exit(undo: Callable[[], None], exc: BaseException | None) -> None:
    """Run `undo` (unmount, remove the cgroup) from `__exit__`. Its AutotuneError is raised
    when the body ended normally; when the body raised, it becomes a note on the body's
    error, which stays the one raised (the cause the user needs to see)."""
    try:
        undo()
    except AutotuneError as cleanup_err:
        if exc is None:
            raise
        if hasattr(exc, "add_note"):  # 3.11+
            exc.add_note(str(cleanup_err))
