"""Results for scripts: JSON (this module) and the self-contained HTML report (`html`).

Library code: a Python caller gets the same documents the CLI writes. Terminal tables
live beside the CLI (autotune.cli.tables).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from autotune_base.fsutil import write_text_atomic


def _clean(o: Any) -> Any:
    # JSON has no NaN/Infinity: emit null rather than invalid JSON.
    if isinstance(o, float):
        return None if math.isnan(o) or math.isinf(o) else round(o, 4)
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o


def to_json(d: dict[str, Any]) -> str:
    """Indented JSON with NaN and infinities as null and floats rounded to 4 places."""
    return json.dumps(_clean(d), indent=2, sort_keys=False) + "\n"


def write_json(path: str | os.PathLike[str], d: dict[str, Any]) -> None:
    """A result as JSON to `path`, atomically (never a half-written file); missing folders
    above it are made."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, to_json(d))


__all__ = ["to_json", "write_json"]
