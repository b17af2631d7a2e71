"""What every command of the CLI is: a small class in the command table (as optuna's CLI).

A command adds its options to its own subparser and runs; it returns the exit status or
raises from the exception tree, which `autotune.cli.main` maps to exit codes in one
place. The library names settings as Python does (`num_workers`); `flag_for` says which
option of this command sets one, so an error can name the flag the user typed.
"""

from __future__ import annotations

import argparse
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from autotune.cli import exits

EXIT_CODES = exits.help_block()   # autotune --help; each command has its own


class Command(ABC):
    """One `autotune` subcommand. Subclasses set the class attributes and implement
    `add_arguments` and `run`."""

    name: str = ""
    help: str = ""
    description: str = ""
    epilog: str = ""
    # What is kept when Ctrl-C or SIGTERM stops the command (for the one-line message).
    after_stop: str = "nothing partial was left"
    # Library setting -> option, where the option's dest is not the setting's name.
    settings: dict[str, str] = {}

    def __init__(self) -> None:
        self._flags: dict[str, str] = {}

    def add_to(self, sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
        p = sub.add_parser(self.name, help=self.help, description=self.description,
                           epilog=self.epilog, parents=[common],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        self.add_arguments(p)
        p.set_defaults(command_obj=self)
        for a in p._actions:
            longs = [o for o in a.option_strings if o.startswith("--")]
            if longs:
                self._flags.setdefault(a.dest, longs[0])

    @abstractmethod
    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        """Add this command's options to its subparser."""

    @abstractmethod
    def run(self, args: argparse.Namespace) -> int:
        """Run; return the exit status (or raise from the exception tree)."""

    def flag_for(self, setting: str) -> str | None:
        """The option of this command that sets a library setting, if any."""
        return self.settings.get(setting) or self._flags.get(setting)


def console(to_stderr: bool) -> Any:
    """A rich console on stdout or stderr, wide enough for the tables when piped to a
    file or a CI log (rich defaults to 80 columns there)."""
    from rich.console import Console

    stream = sys.stderr if to_stderr else sys.stdout
    return Console(file=stream, width=None if stream.isatty() else 110)


def emit(args: argparse.Namespace, data: dict[str, Any], renderable: Any) -> None:
    """The table to stdout (stderr when JSON goes to stdout); JSON to --json FILE or '-'."""
    from autotune import report

    to_stdout = getattr(args, "json", None) == "-"
    console(to_stdout).print(renderable)
    if to_stdout:
        getattr(args, "json_stdout", sys.stdout).write(report.to_json(data))
    elif getattr(args, "json", None):
        try:
            report.write_json(args.json, data)
        except OSError as e:  # checked before the run; a disk that filled up since
            from autotune.errors import AutotuneError

            raise AutotuneError(f"--json {args.json}: cannot write it ({e.strerror or e}); "
                                "the table above is the whole result") from None


class PlainProgress:
    """Progress as plain lines on stderr where it is not a terminal (a batch job's log, a
    pipe), where a spinner or a bar would show nothing: silent for the first `quiet_s`
    seconds (a short command prints its result alone), then a line, with the time,
    whenever the step changes (the text before its first ':', else its first word) and
    otherwise at most one every `every_s` seconds."""

    def __init__(self, quiet_s: float = 10.0, every_s: float = 30.0) -> None:
        self.t0 = time.monotonic()
        self.quiet_s, self.every_s = quiet_s, every_s
        self.head: str | None = None
        self.last = float("-inf")

    def __call__(self, msg: str) -> None:
        now = time.monotonic()
        head = msg.split(":", 1)[0] if ":" in msg else msg.split(" ", 1)[0]
        if now - self.t0 < self.quiet_s or (head == self.head and now - self.last < self.every_s):
            return
        self.head, self.last = head, now
        try:
            sys.stderr.write(f"{time.strftime('%H:%M:%S')} {msg}\n")
            sys.stderr.flush()
        except (OSError, ValueError):   # a closed or broken stderr: progress is not the job
            pass


@contextmanager
def spinner(enabled: bool) -> Iterator[Callable[[str], None] | None]:
    """A spinner on stderr that shows the current step on a terminal; elsewhere plain
    lines now and then (PlainProgress)."""
    if not enabled:
        yield None
        return
    if not sys.stderr.isatty():
        yield PlainProgress()
        return
    from rich.console import Console

    with Console(stderr=True).status("starting") as status:
        yield lambda msg: status.update(msg)
