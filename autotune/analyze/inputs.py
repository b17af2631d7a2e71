"""The inputs of `analyze`: a log file or a monitor's output directory, the probe's JSON,
the log's format and its parser."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.analyze.parsers import BUILTIN, LogParser
from autotune.analyze.parsers.regex import RegexParser
from autotune.analyze.reader import MAX_LINE, bounded_lines, head_and_tail
from autotune.errors import UsageError

# Files `autotune monitor --out DIR` writes (see autotune.monitor.run).
RUN_FILES = {"log": "train.log", "steps": "steps.jsonl", "metrics": "metrics.jsonl",
             "run": "run.json"}


@dataclass
class Inputs:
    log: Path
    metrics: Path | None
    dataset: str | None
    notes: list[str]
    run: dict[str, Any] | None = None    # the monitor's run.json (analyze.runinfo reads it)
    run_dir: Path | None = None          # the folder it is in (its train.log)


def step_log_beside(log: Path) -> Path | None:
    """autotune's step log in the folder of `log` (another file), where it holds steps:
    a monitor's run folder analysed through its train.log."""
    steps = log.parent / RUN_FILES["steps"]
    return steps if log.name != steps.name and _has_steps(steps) else None


def _has_steps(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            for i, raw in enumerate(bounded_lines(f)):
                if raw is not None and b'"wait_s"' in raw:
                    return True
                if i > 50:
                    break
    except OSError:
        return False
    return False


def _run_json(folder: Path) -> dict[str, Any] | None:
    """The monitor's run.json in `folder`, or None (absent, unreadable, not an object)."""
    try:   # a side file: read up to MAX_LINE, never whole
        with (folder / RUN_FILES["run"]).open("rb") as f:
            run = json.loads(f.read(MAX_LINE))
    except (OSError, ValueError, RecursionError):
        return None
    return run if isinstance(run, dict) else None


def resolve_inputs(log: str | os.PathLike[str], metrics: str | os.PathLike[str] | None,
                   dataset: str | None) -> Inputs:
    """A log file, or an `autotune monitor` output directory (its step log when the job
    was instrumented, else its train.log; its metrics.jsonl; the dataset from run.json).
    run.json is read from the directory, or from beside --metrics."""
    p = Path(log)
    notes: list[str] = []
    run_dir: Path | None = None
    if not p.exists():
        raise UsageError(f"{p}: no such file or directory; give a training log or the "
                         "directory `autotune monitor --out` wrote")
    if p.is_dir():
        steps, train = p / RUN_FILES["steps"], p / RUN_FILES["log"]
        if _has_steps(steps):
            chosen = steps
        elif train.is_file():
            chosen = train
            if steps.exists():
                notes.append(f"{steps} has no step, using {train}")
        else:
            raise UsageError(f"{p}: holds neither {RUN_FILES['steps']} nor {RUN_FILES['log']}; "
                             "give the log file itself")
        mine = p / RUN_FILES["metrics"]
        if metrics is None and mine.is_file():
            if mine.stat().st_size:
                metrics = mine
            else:  # the command ended before the monitor's first sample: the log alone
                notes.append(f"{mine} holds no sample (the command ended before the first "
                             "one): analysed without the machine's figures")
        run_dir, p = p, chosen
    elif metrics is not None:
        run_dir = Path(metrics).parent
    run = _run_json(run_dir) if run_dir is not None else None
    if run is None:
        run_dir = None
    elif dataset is None and isinstance(run.get("data"), str):
        dataset = run["data"]
    return Inputs(p, Path(metrics) if metrics is not None else None, dataset, notes, run,
                  run_dir)


def load_probe(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON of `autotune probe --json FILE`."""
    p = Path(path)
    try:
        d = json.loads(p.read_text())
    except OSError as e:
        raise UsageError(f"probe file {p}: {e.strerror}", setting="probe") from e
    except ValueError as e:
        raise UsageError(f"probe file {p}: not JSON ({e}); give the file `autotune probe "
                         "--json FILE` wrote", setting="probe") from e
    if not isinstance(d, dict) or "verdict" not in d:
        raise UsageError(f"probe file {p}: no 'verdict' in it; give the file `autotune probe "
                         "--json FILE` wrote", setting="probe")
    return d


def detect_format(log: str | os.PathLike[str]) -> str:
    """The built-in format most lines of the log's head (and tail) match."""
    parsers = {name: cls() for name, cls in BUILTIN.items()}
    hits = dict.fromkeys(parsers, 0)
    seen = 0
    for ln in head_and_tail(log):
        seen += 1
        for name, parser in parsers.items():
            if parser.sniff(ln):
                hits[name] += 1
    best = max(hits, key=lambda k: hits[k])   # ties: the first, most specific format
    if hits[best] == 0:
        raise UsageError(f"{log}: no known step-timing format in its first {min(seen, 5000)} "
                         f"lines and last MiB (known: {', '.join(BUILTIN)}); pass --format, or "
                         "--regex FILE with a pattern for your lines, or wrap the loader with "
                         "autotune.instrument(loader) (Lightning: InstrumentCallback()); a "
                         "step log written elsewhere (log=PATH) is analysed by that path")
    return best


def make_parser(fmt: str, regex: str | os.PathLike[str] | None) -> LogParser:
    if regex is not None:
        return RegexParser.from_yaml(regex)
    if fmt == "regex":
        raise UsageError("format regex needs a regex file (a YAML file with a 'pattern')",
                         setting=("format", "regex"))
    try:
        return BUILTIN[fmt]()
    except KeyError:
        raise UsageError(f"format {fmt}: unknown; known: auto, {', '.join(BUILTIN)}, regex",
                         setting="format") from None
