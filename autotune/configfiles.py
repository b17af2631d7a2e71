"""The one YAML loader, and where the shipped YAML files are.

Presets, search spaces and log-format patterns are read by `load_yaml`: a file that
cannot be read, is not YAML or is not a mapping is refused in one line that names it and
says what was expected. `config_dir(kind)` finds the shipped presets/spaces: in a checkout
the repository's configs/ (next to the autotune package that is running), else the
package data installed with the wheel (`autotune_configs`, mapped from configs/).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import UsageError


def config_dir(kind: str) -> Path:
    """configs/KIND ('presets' or 'search') of this checkout, else of the installed wheel."""
    here = Path(__file__).resolve().parent.parent / "configs" / kind
    if here.is_dir():
        return here
    from importlib.resources import files

    return Path(str(files("autotune_configs") / kind))


def load_yaml(path: str | os.PathLike[str], what: str) -> dict[str, Any]:
    """The mapping in a YAML file; `what` names the file's role in errors ("preset")."""
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except OSError as e:
        raise UsageError(f"{what} {p}: cannot read it ({e.strerror}).") from e
    except yaml.YAMLError as e:  # PyYAML's message spans lines; an error is one line
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        why = getattr(e, "problem", None) or " ".join(str(e).split())
        raise UsageError(f"{what} {p}: not valid YAML{at} ({why}); fix the file.") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise UsageError(f"{what} {p}: expected a mapping of keys, got {type(raw).__name__}.")
    return raw
