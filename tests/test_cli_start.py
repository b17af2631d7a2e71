"""`autotune COMMAND` builds only that command's options: the others' choices import
the search loop, the presets and the log parsers (0.4 s of a cold `autotune convert`)."""

from __future__ import annotations

import subprocess
import sys

from autotune.cli import COMMANDS, build_parser

SHOW = ("import sys\n"
        "from autotune.cli import _chosen, build_parser\n"
        "argv = ['-q', 'convert', '/src', '/dst', '--format', 'lmdb']\n"
        "a = build_parser(_chosen(argv)).parse_args(argv)\n"
        "print(a.command_obj.name, a.format, a.quiet)\n"
        "print(sorted(m for m in ('autotune.search', 'autotune.search.loop', "
        "'autotune.analyze.parsers', 'autotune.data.presets') if m in sys.modules))\n")


def test_convert_parses_without_importing_the_other_commands():
    out = subprocess.run([sys.executable, "-c", SHOW], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == ["convert lmdb True", "[]"]


def test_every_command_is_still_listed_and_fully_built_when_chosen():
    for cls in COMMANDS:
        sub = next(a for a in build_parser(cls.name)._actions if a.dest == "command")
        assert set(sub.choices) == {c.name for c in COMMANDS}
        full = next(a for a in build_parser()._actions if a.dest == "command")
        assert sub.choices[cls.name].format_help() == full.choices[cls.name].format_help()
