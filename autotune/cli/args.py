"""Argument types shared by every command: refused in the words of the option."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def _number(name: str, s: str, cast: type = float) -> Any:
    try:
        return cast(s)
    except ValueError:
        kind = "a number" if cast is float else "an integer"
        raise argparse.ArgumentTypeError(f"{name} must be {kind}, but got {s!r}.") from None


def _checked(name: str, ok: Callable[[float], bool], rule: str,
             cast: type = float) -> Callable[[str], Any]:
    def conv(s: str) -> Any:
        v = _number(name, s, cast)
        if not ok(v):
            raise argparse.ArgumentTypeError(f"{name} must be {rule}, but got {s}.")
        return v
    return conv


def positive_float(name: str) -> Callable[[str], float]:
    return _checked(name, lambda v: v > 0, "positive")


def nonneg_float(name: str) -> Callable[[str], float]:
    return _checked(name, lambda v: v >= 0 and v != float("inf"), "a number >= 0")


def int_at_least(name: str, low: int) -> Callable[[str], int]:
    """An integer >= low."""
    return _checked(name, lambda v: v >= low, f"at least {low}", int)


def positive_int(name: str) -> Callable[[str], int]:
    return int_at_least(name, 1)


def nonneg_int(name: str) -> Callable[[str], int]:
    return int_at_least(name, 0)


def int_list(name: str) -> Callable[[str], list[int]]:
    """Comma-separated integers >= 1, e.g. 1,4,16,64."""
    def conv(s: str) -> list[int]:
        try:
            vals = [int(x) for x in s.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be comma-separated integers such as 1,4,16,64, but got {s!r}.") from None
        if not vals or min(vals) < 1:
            raise argparse.ArgumentTypeError(f"{name} values must be at least 1, but got {s!r}.")
        return vals
    return conv


def fraction(name: str) -> Callable[[str], float]:
    """A number in (0, 1]."""
    return _checked(name, lambda v: 0 < v <= 1, "in (0, 1]")


def size(name: str) -> Callable[[str], int]:
    """A size such as 64MiB or 1G, in bytes."""
    def conv(s: str) -> int:
        from autotune_base.errors import UsageError
        from autotune_base.units import parse_size

        try:
            return parse_size(s, name=name)
        except UsageError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return conv


def add_endpoint(p: argparse.ArgumentParser) -> None:
    """--endpoint-url: the S3 endpoint of an s3:// dataset (an S3-compatible server)."""
    p.add_argument("--endpoint-url", metavar="URL", default=None,
                   help="S3 endpoint for s3:// datasets (default AWS_ENDPOINT_URL, else AWS); "
                        "S3-compatible servers are addressed path-style, region AWS_REGION or "
                        "us-east-1; credentials the usual boto3 way")


def apply_endpoint(args: argparse.Namespace) -> None:
    """Hand --endpoint-url to every process of the run (measurement children read the
    environment, as boto3 itself does)."""
    import os

    if getattr(args, "endpoint_url", None):
        os.environ["AWS_ENDPOINT_URL"] = args.endpoint_url


def add_delayacct(p: argparse.ArgumentParser) -> None:
    """--delayacct: the same switch, in the same words, for every command that samples a run."""
    p.add_argument("--delayacct", action="store_true",
                   help="switch kernel.task_delayacct on for the run (root): the time "
                        "budget's I/O is then counted exactly, not sampled; restored after, "
                        "never switched off while another autotune run holds it")


def add_max_open_files(p: argparse.ArgumentParser, *, each_trial: bool = False) -> None:
    """--max-open-files: a cluster's `ulimit -n` for the measurements alone (bench's one, or
    each of search's trials), while the command keeps its own limit."""
    whose = "each trial's measurement" if each_trial else "the measurement"
    p.add_argument("--max-open-files", type=positive_int("--max-open-files"), metavar="N",
                   help=f"RLIMIT_NOFILE for {whose} (reproduce a cluster's ulimit -n; this "
                        "process keeps its own)")


def add_window(p: argparse.ArgumentParser, default_s: int, *, what: str) -> None:
    """--seconds: the measured window (bench's and each search trial's), lengthened by the
    same rule for a long emulated step."""
    p.add_argument("--seconds", type=positive_float("--seconds"), metavar="S",
                   help=f"{what} (default {default_s}, longer for a long "
                        "--compute-ms: warm-up + max(10, twice workers x prefetch) steps; "
                        "kept open longer, up to as long again, until it holds 10 "
                        "batches)")


def add_step(p: argparse.ArgumentParser, *, compute_help: str, step_help: str) -> None:
    """--compute-ms or --step, not both: the training step, emulated (a hold per batch) or
    the user's own function."""
    step = p.add_mutually_exclusive_group()
    step.add_argument("--compute-ms", type=nonneg_float("--compute-ms"), metavar="MS",
                      help=compute_help)
    step.add_argument("--step", metavar="FILE.py:FUNCTION", help=step_help)


def add_json(p: argparse.ArgumentParser, what: str = "the result", *,
             moved: str = "the table") -> None:
    """--json: one wording everywhere, which says what moves to stderr when JSON takes
    stdout (a script reads stdout as one JSON document)."""
    p.add_argument("--json", metavar="FILE",
                   help=f"also write {what} as JSON to FILE ('-': the JSON on stdout, "
                        f"{moved} on stderr)")


def add_seed(p: argparse.ArgumentParser, what: str) -> None:
    """--seed: every seeded command names what the seed drives (the run is then repeatable)."""
    p.add_argument("--seed", type=int, default=0, help=f"seed of {what} (default 0)")


def add_read_format(p: argparse.ArgumentParser) -> None:
    """--format of a dataset that is read (bench, search): folder or a conversion."""
    from autotune_converters import registry

    p.add_argument("--format", choices=registry.choices(), default="auto",
                   help="dataset format (default auto: manifest.json's, else folder; lmdb "
                        "and wds read a conversion written by `autotune convert`)")


# Options that name a file the command writes when it ends, after minutes of work.
_OUTPUT_FILES = (("json", "--json"), ("timeline", "--timeline"))


def _writable_file(path: Any) -> bool:
    """An existing file (not a folder) this user may write: opened and written in place,
    as --timeline is (--json is renamed into place: its folder must be writable)."""
    import os

    try:
        return os.path.exists(path) and not os.path.isdir(path) and os.access(path, os.W_OK)
    except OSError:
        return False


def _link_or_device(path: Any) -> bool:
    import os
    import stat

    try:
        mode = os.lstat(path).st_mode
    except OSError:   # absent, or behind a folder this user cannot search: checked below
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def check_output_files(args: argparse.Namespace) -> None:
    """Refuse an output file that cannot be written before the work starts, not after it
    (a search that ran for an hour and then failed to save its result)."""
    from pathlib import Path

    from autotune_base.errors import UsageError
    from autotune_base.fsutil import unwritable_reason

    for dest, flag in _OUTPUT_FILES:
        value = getattr(args, dest, None)
        if value is None or value == "-":
            continue
        if not value.strip():
            raise UsageError(f"{flag} needs a file name ('-' for stdout), but got {value!r}.")
        path = Path(value)
        if dest == "timeline" and _writable_file(path):
            continue  # /dev/stderr, a pipe (>(gzip > t.gz)), a file made writable for it
        if dest == "json" and _link_or_device(path):
            # renamed into place, it would replace the link (/dev/stdout) or the device
            raise UsageError(f"{flag} {value}: a link or a device, not a file; '--json -' "
                             "writes the JSON to stdout")
        try:
            if path.is_dir():
                raise UsageError(f"{flag} {value}: a directory; name a file in it, e.g. "
                                 f"{path / ('result.json' if dest == 'json' else 'timeline.jsonl')}")
        except PermissionError:   # a folder above it this user cannot search
            pass
        # Missing folders are made when the file is written (`--out run1 --json run1/a.json`).
        top, why = unwritable_reason(path.parent)
        if why:
            # The folder by its whole path: "." said nothing of where the command ran.
            raise UsageError(f"{flag} {value}: {top.absolute()} {why}; name a file in a "
                             "folder you can write")
