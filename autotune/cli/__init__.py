"""The `autotune` command line: a thin layer that parses, calls the library, prints.

This package is the only place that prints or exits. One module per command (a `Command`
in `COMMANDS`), their terminal tables in `tables/`, the argument types in `args`, and one
`main` that maps the exception tree (autotune.errors) to exit codes: a library error
becomes one line on stderr naming the option that sets what it is about; a traceback is
shown only with --debug.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import resource
import signal
import sys
from collections.abc import Sequence

from autotune import __version__
from autotune.cli import exits
from autotune.cli._base import EXIT_CODES, Command
from autotune.cli.analyze import Analyze, Monitor
from autotune.cli.args import check_output_files
from autotune.cli.bench import Bench
from autotune.cli.convert import Convert
from autotune.cli.probe import Probe
from autotune.cli.search import Search
from autotune.cli.stage import Stage
from autotune.errors import AutotuneError

COMMANDS: tuple[type[Command], ...] = (Probe, Bench, Search, Convert, Stage, Monitor, Analyze)


class _Terminated(BaseException):
    """SIGTERM turned into an exception so that `finally` blocks clean up."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise _Terminated()


def _common() -> argparse.ArgumentParser:
    """Options every command takes, before or after its name (`autotune -q convert` or
    `autotune convert -q`)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks on errors")
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="no progress display (see autotune --help)")
    return common


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with `only` (a command's name), only that command's options are
    built, the others get their name and help: building a command's options imports
    what its choices come from (search: the search loop, bench: the presets, analyze:
    the log parsers), 0.4 s of a cold `autotune convert`'s start, measured."""
    ap = argparse.ArgumentParser(
        prog="autotune", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Find what holds a PyTorch input pipeline back (storage, CPU decode, "
                    "DataLoader settings, or the training step) with measurements.",
        epilog="Run `autotune COMMAND --help` for each command.\n\n" + EXIT_CODES)
    ap.add_argument("--version", action="version", version=f"autotune {__version__}")
    ap.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    ap.add_argument("-q", "--quiet", action="store_true",
                    help="no progress display (on a terminal a spinner or a bar; in a batch "
                         "job's log or a pipe, after the first 10 s, a line with the time at "
                         "each new step and every 30 s)")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = _common()
    for cls in COMMANDS:
        if only is None or cls.name == only:
            cls().add_to(sub, common)
        else:
            sub.add_parser(cls.name, help=cls.help, add_help=False)
    return ap


def _chosen(argv: Sequence[str]) -> str | None:
    """The command `argv` runs (its first word that names one), or None."""
    names = {cls.name for cls in COMMANDS}
    for a in argv:
        if a == "--":
            break
        if not a.startswith("-"):
            return a if a in names else None
    return None


def error_line(cmd: Command, e: AutotuneError) -> str:
    """The one stderr line of a library error, naming the options that set what it is
    about when the message does not already name them."""
    from autotune.cli.tables import printable

    msg = printable(str(e))   # it names files from the dataset: no control characters
    flags = [f for s in e.settings if (f := cmd.flag_for(s)) and f not in msg]
    if flags:
        msg += f" (option{'s' if len(flags) > 1 else ''} {', '.join(flags)})"
    gate = e.exit_code in (3, 5)   # a gate's outcome, not an error
    return f"autotune {cmd.name}: {'' if gate else 'error: '}{msg}"


def _unexpected(e: Exception) -> str:
    """The line for an exception that is not the library's own: a bug, except running out
    of file descriptors, which is the limit this process was started with (said without an
    import: one would need a descriptor)."""
    if isinstance(e, OSError) and e.errno == errno.EMFILE:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return (f"error: this process ran out of file descriptors, {soft} allowed (`ulimit -n`): "
                f"{e}; raise the limit (`ulimit -n 4096`, or `docker run --ulimit nofile=4096`)")
    if isinstance(e, OSError) and e.errno == errno.ENFILE:
        return (f"error: the system's open-file table is full: {e}; close what holds files "
                "open, or raise fs.file-max")
    from autotune.cli.tables import printable

    return (f"internal error: {type(e).__name__}: {printable(e)} (rerun with --debug for the "
            "traceback)")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(_chosen(argv)).parse_args(argv)
    cmd: Command = args.command_obj
    old = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        check_output_files(args)
        if getattr(args, "json", None) == "-":
            # stdout is the JSON's alone: whatever else this process prints while the command
            # runs (a user's dataset factory, a library's notice) goes to stderr; emit()
            # writes the JSON to the stdout kept here.
            args.json_stdout = sys.stdout
            with contextlib.redirect_stdout(sys.stderr):
                return int(cmd.run(args) or 0)
        return int(cmd.run(args) or 0)
    except AutotuneError as e:
        if args.debug:
            raise
        print(error_line(cmd, e), file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"autotune {cmd.name}: interrupted; {cmd.after_stop}", file=sys.stderr)
        return exits.INTERRUPTED
    except _Terminated:
        print(f"autotune {cmd.name}: terminated; {cmd.after_stop}", file=sys.stderr)
        return exits.TERMINATED
    except BrokenPipeError:
        return 1
    except Exception as e:  # one line; the traceback is one flag away
        if args.debug:
            raise
        print(f"autotune {cmd.name}: {_unexpected(e)}", file=sys.stderr)
        return exits.ERROR
    finally:
        signal.signal(signal.SIGTERM, old)


__all__ = ["COMMANDS", "Command", "build_parser", "error_line", "main"]
