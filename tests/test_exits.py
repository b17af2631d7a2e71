"""Exit statuses: one table (autotune/cli/exits.py) that `--help` prints and the docs show.

The docs tables are parsed and compared with the module, so a page that says "exits 0"
where the code returns 1 fails here; a few real runs check codes the table names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autotune.cli import COMMANDS, build_parser, exits, main

DOCS = Path(__file__).resolve().parents[1] / "docs"
ROW = re.compile(r"^\| *(\d+) *\|(.*)\|\s*$")


def _tables(text: str) -> dict[str | None, dict[int, list[str]]]:
    """The tables of a page, by the `## heading` above each (None before the first):
    code -> its other cells."""
    out: dict[str | None, dict[int, list[str]]] = {}
    heading = None
    for line in text.splitlines():
        if line.startswith("## "):
            heading = line[3:].strip()
        elif m := ROW.match(line):
            out.setdefault(heading, {})[int(m.group(1))] = [
                c.strip() for c in m.group(2).split("|")]
    return out


def test_the_reference_page_is_the_table_of_the_code():
    tables = _tables((DOCS / "reference" / "exit-status.md").read_text())
    assert tables[None] == {e.code: [e.name, e.meaning] for e in exits.EXITS}
    for cmd in exits.BY_COMMAND:
        want = {code: [meaning] for code, meaning in exits.BY_COMMAND[cmd].items()}
        assert tables.get(cmd) == want, (f"docs/reference/exit-status.md, ## {cmd}: write "
                                         f"the table as\n{exits.markdown_table(cmd)}")


@pytest.mark.parametrize("cmd", sorted(exits.BY_COMMAND))
def test_each_command_page_shows_its_own_table(cmd: str):
    page = DOCS / "commands" / f"{cmd}.md"
    tables = _tables(page.read_text())
    want = {code: [meaning] for code, meaning in exits.BY_COMMAND[cmd].items()}
    assert tables.get("Exit status") == want, (f"{page}: the Exit status section should "
                                               f"be\n{exits.markdown_table(cmd)}")


def test_help_prints_the_same_table_for_every_command():
    ap = build_parser()
    assert {c.name for c in COMMANDS} == set(exits.BY_COMMAND)
    assert exits.help_block() in ap.format_help()
    sub = next(a for a in ap._actions if a.dest == "command")
    for name, p in sub.choices.items():
        assert exits.help_block(name) in p.format_help(), name


def test_every_code_a_command_names_is_in_the_general_table():
    known = {e.code for e in exits.EXITS}
    for cmd, codes in exits.BY_COMMAND.items():
        assert set(codes) <= known, cmd


def test_real_runs_exit_with_the_codes_the_table_gives(tmp_path, capsys):
    # A bad option: argparse's usage error.
    with pytest.raises(SystemExit) as e:
        main(["bench", str(tmp_path), "--workers", "-1"])
    assert e.value.code == exits.USAGE
    # analyze on a log that is not there: a file that could not be read is 1 or a usage 2,
    # either one the table lists for analyze.
    code = main(["analyze", str(tmp_path / "missing.log")])
    assert code in exits.BY_COMMAND["analyze"] and code != exits.OK, code
