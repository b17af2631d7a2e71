"""Names the docs share with the code, checked against the code's own lists: the storage
classes (autotune.probe.classify.CLASSES), the Debian packages of scripts/setup, the
extras of pyproject.toml (the Install page's table)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autotune.cli import build_parser
from autotune.probe.classify import CLASSES

ROOT = Path(__file__).resolve().parents[1]


def _help(cmd: str) -> str:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices[cmd].format_help()


def test_probe_names_the_storage_classes_the_classifier_gives():
    page = (ROOT / "docs" / "commands" / "probe.md").read_text()
    line = next(ln for ln in page.splitlines() if "**Classification**" in ln)
    help_text = " ".join(_help("probe").split())
    for c in CLASSES:
        assert re.search(rf"\b{c}\b", line), (c, line)
        assert re.search(rf"\b{c}\b", help_text), c


@pytest.mark.parametrize("page", ["development.md", "getting-started.md"])
def test_the_debian_packages_of_setup_are_the_ones_the_pages_name(page):
    setup = (ROOT / "scripts" / "setup").read_text()
    pkgs = re.search(r"^apt_pkgs=\(([^)]*)\)", setup, re.M).group(1).split()
    text = (ROOT / "docs" / page).read_text()
    named = set(re.findall(r"`([a-z0-9][a-z0-9.+-]*)`", text))
    assert set(pkgs) <= named, f"docs/{page} lacks {sorted(set(pkgs) - named)}"


def test_the_step_is_named_file_py_function_everywhere():
    """`--step FILE.py:FUNCTION` (any function name), never a fixed `:step`."""
    bad = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").rglob("*.md"))
           if "--step FILE.py:step" in p.read_text()]
    assert not bad, bad


def test_the_install_page_lists_every_extra():
    tomllib = pytest.importorskip("tomllib")   # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    page = (ROOT / "docs" / "install.md").read_text()
    rows = set(re.findall(r"^\| `([a-z0-9-]+)`(?:, `([a-z0-9-]+)`)? \|", page, re.M))
    listed = {n for row in rows for n in row if n}
    assert listed == set(extras), (sorted(listed), sorted(extras))
