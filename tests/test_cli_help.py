"""`--help` answers the question: every option and argument of every command says what it
is, and an option several commands share says it in the same words."""

from __future__ import annotations

import argparse

from autotune.cli import COMMANDS, build_parser


def _parsers() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_option_and_argument_of_every_command_has_help():
    parsers = _parsers()
    assert sorted(parsers) == sorted(c.name for c in COMMANDS)
    silent = [f"{name} {'/'.join(a.option_strings) or a.dest}"
              for name, p in parsers.items() for a in p._actions
              if a.help != argparse.SUPPRESS and not (a.help or "").strip()]
    assert not silent, f"no help text: {silent}"


def test_json_and_seed_read_the_same_in_every_command():
    seen: dict[str, list[str]] = {"--json": [], "--seed": []}
    for name, p in _parsers().items():
        for a in p._actions:
            for flag in seen.keys() & set(a.option_strings):
                seen[flag].append(f"{name}: {a.help}")
    assert len(seen["--json"]) == len(_parsers())      # every command writes JSON
    for h in seen["--json"]:
        assert "as JSON to FILE ('-': the JSON on stdout, " in h and h.endswith(" on stderr)"), h
    assert len(seen["--seed"]) == 4
    for h in seen["--seed"]:
        assert ": seed of " in h and h.endswith("(default 0)"), h
