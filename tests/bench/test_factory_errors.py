"""A dataset factory that returns the wrong thing is the user's input, not autotune's bug:
a usage error the CLI shows as one line (exit 2), never as an internal error."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.cli import COMMANDS, error_line
from autotune.errors import UsageError


@pytest.mark.parametrize("body, says", [
    ("def make(path):\n    return [1, 2]\n", "returned list, not a torch.utils.data.Dataset"),
    ("def make(path):\n    return {'data': []}\n", "returned a dict with keys ['data']"),
    ("def make(path):\n    raise KeyError('labels')\n", "raised KeyError: 'labels'"),
])
def test_a_factory_returning_the_wrong_thing_is_a_usage_error(tmp_path: Path, body: str,
                                                              says: str) -> None:
    from autotune.bench import factory

    mod = tmp_path / "userfactory.py"
    mod.write_text(body)
    with pytest.raises(UsageError) as e:
        factory.build(f"{mod}:make", str(tmp_path))
    assert e.value.exit_code == 2 and says in str(e.value), str(e.value)
    search = next(c for c in COMMANDS if c.name == "search")
    line = error_line(search, e.value)
    assert line.startswith("autotune search: error: dataset factory ") and "\n" not in line
