"""The one YAML loader: presets, search spaces and log-format patterns are read here, and
a file that cannot be read, is not YAML or is not a mapping is refused in one line that
names it and says what was expected."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import UsageError


def load_yaml(path: str | os.PathLike[str], what: str) -> dict[str, Any]:
    """The mapping in a YAML file; `what` names the file's role in errors ("preset")."""
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except OSError as e:
        raise UsageError(f"{what} {p}: cannot read it ({e.strerror}).") from e
    except yaml.YAMLError as e:
        raise UsageError(f"{what} {p}: not valid YAML ({e}).") from e
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise UsageError(f"{what} {p}: expected a mapping of keys, got {type(raw).__name__}.")
    return raw
