"""mkdocs hook: the CLI reference from the parsers' own --help, and the example markers.

Markers in the pages (HTML comments, so a page reads the same on GitHub):

- `<!-- autotune-help: CMD -->` becomes `autotune CMD --help`, generated from
  `autotune.cli.build_parser()` at build time (`<!-- autotune-help: -->` for the top
  level), so the reference can never drift from the code;
- `<!-- run -->` before a fenced example: tests/test_docs.py runs it (hidden in the page);
  `<!-- run: file NAME -->`: the test writes the block to NAME (a module the next
  examples import), shown with its name as a caption;
- `<!-- not-run: REASON -->` before one: shown as "Not run by the tests here: REASON".

`examples(text)` is the one reader of those markers: this hook and the test share it.

It also lets the API reference find the packages that install under other names than
their folders (converters/ as autotune_converters, base/ as autotune_base): mkdocstrings
looks a package up by folder name, and an editable install's mapping is not a folder.
"""

from __future__ import annotations

import argparse
import atexit
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HELP = re.compile(r"<!-- autotune-help: *([a-z]*) *-->")
MARK = re.compile(r"<!-- (run(?:: *file +([\w./-]+))?|not-run: *(.*?)) *-->\n+```(\w+)\n(.*?)\n```",
                  re.DOTALL)
FENCE = re.compile(r"^```(bash|python|sh|console)\s*$", re.MULTILINE)
HELP_COLUMNS = "92"
RENAMED = {"converters": "autotune_converters", "base": "autotune_base"}   # as setup.py


@dataclass(frozen=True)
class Example:
    """One fenced example and what its marker says about it."""
    lang: str
    code: str
    runs: bool
    reason: str   # why it does not run here ("" when it runs)
    file: str     # the file the test writes it to instead of running it ("" for none)


def examples(text: str) -> list[Example]:
    """The marked examples of a page, in order."""
    return [Example(m.group(4), m.group(5), m.group(1).startswith("run"),
                    (m.group(3) or "").strip(), m.group(2) or "")
            for m in MARK.finditer(text)]


def unmarked(text: str) -> int:
    """How many bash/python fences carry no marker (the test wants none)."""
    return len(FENCE.findall(text)) - len(examples(text))


def cli_help(command: str) -> str:
    """`autotune [COMMAND] --help`, as the parser prints it, at a fixed width."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        from autotune.cli import build_parser

        ap = build_parser()
        if not command:
            return ap.format_help()
        sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
        return sub.choices[command].format_help()
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def _help_block(m: re.Match) -> str:
    return "```text\n" + cli_help(m.group(1)).rstrip() + "\n```"


def _marker(m: re.Match) -> str:
    block = f"```{m.group(4)}\n{m.group(5)}\n```"
    if m.group(2):
        return f"`{m.group(2)}`:\n\n{block}"
    if m.group(1).startswith("run"):
        return block
    return f"*Not run by the tests here: {m.group(3).strip()}.*\n\n{block}"


def on_page_markdown(markdown: str, **kwargs) -> str:
    markdown = HELP.sub(_help_block, markdown)
    return MARK.sub(_marker, markdown)


def on_config(config, **kwargs):
    """Point mkdocstrings at links named as the packages install (a temporary folder)."""
    names = Path(tempfile.mkdtemp(prefix="autotune-docs-names-"))
    atexit.register(shutil.rmtree, names, ignore_errors=True)
    for folder, name in RENAMED.items():
        (names / name).symlink_to(ROOT / folder, target_is_directory=True)
    python = config["plugins"]["mkdocstrings"].config["handlers"].setdefault("python", {})
    python["paths"] = [*python.get("paths", ["."]), str(names)]
    return config


on_config.mkdocs_priority = 100   # before mkdocstrings reads its handlers' paths
