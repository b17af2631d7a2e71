"""The exit statuses of `autotune`: one table that the commands' `--help` and the docs page
(docs/reference/exit-status.md, checked by tests/test_exits.py) are both made from.

`EXITS` is what each code means for every command; `BY_COMMAND` says, per command, which
codes it returns and what they mean there.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

OK = 0
ERROR = 1
USAGE = 2
GATE_FAILED = 3
PARTIAL = 4
GATE_UNMEASURED = 5
INTERRUPTED = 130   # 128 + SIGINT
TERMINATED = 143    # 128 + SIGTERM


@dataclass(frozen=True)
class Exit:
    """One exit status: its code, a short name, and what it means."""

    code: int
    name: str
    meaning: str


EXITS: tuple[Exit, ...] = (
    Exit(OK, "ok", "success"),
    Exit(ERROR, "error", "error: a measurement or tool failed; one line on stderr says which "
         "and how to fix it (`--debug` for a traceback)"),
    Exit(USAGE, "usage", "usage error: a bad option or argument, or an input autotune cannot "
         "use"),
    Exit(GATE_FAILED, "gate-failed", "gate failed: a measured figure is below `--min-iops` / "
         "`--min-seq-mibps`"),
    Exit(PARTIAL, "partial", "partial: some items failed and are named (`stage`); the rest is "
         "done; rerun to resume"),
    Exit(GATE_UNMEASURED, "gate-unmeasured", "gate not measured: `--min-iops` / "
         "`--min-seq-mibps` could not be judged (fio missing or failed, a buffered run the "
         "page cache served, RAM-backed scratch)"),
    Exit(INTERRUPTED, "interrupted", "interrupted by Ctrl-C; scratch files are removed first"),
    Exit(TERMINATED, "terminated", "terminated by SIGTERM; scratch files are removed first"),
)

# Per command: code -> what it means there. `monitor` returns its command's own status.
BY_COMMAND: dict[str, dict[int, str]] = {
    "probe": {
        OK: "measured (and every gate passed)",
        ERROR: "a measurement or tool failed (fio, the replay): the message says which",
        USAGE: "usage error: a bad option or path",
        GATE_FAILED: "a gate failed: a figure below --min-iops / --min-seq-mibps",
        GATE_UNMEASURED: "a gate could not be judged: its figure was not measured (fio "
                         "missing or failed) or is not the storage's (the page cache or RAM "
                         "served it); the message says which",
        INTERRUPTED: "interrupted (Ctrl-C); 143 terminated (SIGTERM); scratch files removed",
    },
    "bench": {
        OK: "the configuration was measured",
        ERROR: "the measurement failed (crashed or hung worker, full /dev/shm, too many open "
               "files, OOM, timeout, too small a dataset): the table and JSON carry the reason "
               "and a hint, and no process of the measurement is left running; or the "
               "configuration's batches cannot fit in /dev/shm (measured from one batch made "
               "without workers): refused before it starts, with the size that would fit",
        USAGE: "usage error: a bad option, preset, dataset or --step, or --delayacct where "
               "the switch cannot be set (not root, a read-only /proc/sys, a kernel before "
               "5.14)",
        INTERRUPTED: "interrupted (Ctrl-C); 143 terminated (SIGTERM); the measurement is "
                     "killed first",
    },
    "search": {
        OK: "a recommendation was made",
        ERROR: "an error (an unreachable PostgreSQL server: one line, before anything is "
               "written; a second search on a SQLite study file another search holds, naming "
               "it), or no configuration completed (each trial's reason is in the table and "
               "JSON)",
        USAGE: "usage error: a bad option, a dataset on which too few configurations fit, a study "
               "measured with other settings, or --delayacct where the switch cannot be set "
               "(not root, a read-only /proc/sys, a kernel before 5.14)",
        INTERRUPTED: "interrupted (Ctrl-C); 143 terminated (SIGTERM): the study keeps every "
                     "measured trial, the running one is recorded interrupted and measured "
                     "again when the same command is rerun",
    },
    "convert": {
        OK: "done (skipped files, if any, are listed in DST/manifest.json and the summary)",
        ERROR: "the conversion stopped (the message names the file and the fix); rerun the "
               "same command to resume, finished work is kept (WebDataset shards, LMDB's "
               "committed batches)",
        USAGE: "usage error: a bad option or argument, a DST holding something else or "
               "without the free space for what the conversion will still write (refused "
               "before anything is written), or a name in a manifest or state file that is "
               "not a plain relative path",
        INTERRUPTED: "interrupted (Ctrl-C); 143 terminated (SIGTERM); rerun to resume",
    },
    "stage": {
        OK: "every file staged and verified; manifest.json written last",
        ERROR: "nothing could be staged (space, lock, manifest); the message says why",
        USAGE: "usage error: a bad option, an unsafe name in the manifest, or a SRC that is "
               "an unfinished conversion",
        PARTIAL: "some files failed (named: a source file that changed or vanished, or "
                 "with --verify-only a staged file corrupt or missing); the others are "
                 "staged; rerun to resume",
        INTERRUPTED: "interrupted (Ctrl-C); 143 terminated (SIGTERM): files already "
                     "verified stay; rerun to resume",
    },
    "analyze": {
        OK: "analysed (whatever the verdict)",
        ERROR: "the --json file could not be written (its folder is checked before the log "
               "is read: a disk that filled up since)",
        USAGE: "usage error: a bad option, an unknown format, a log, --metrics or --probe "
               "file that is missing or cannot be read, or no step timing in the log (for "
               "a monitored job that failed, the message says first how it ended and what "
               "may have caused it, /dev/shm, the open-files or the memory limit, with the fix)",
    },
    "monitor": {
        USAGE: "usage error: no command, a command that cannot be started, a bad option, or "
               "--delayacct where the switch cannot be set (not root, a read-only /proc/sys, a "
               "kernel before 5.14): the command is not started",
    },
}

# Said before a command's codes.
NOTES: dict[str, str] = {
    "monitor": "the command's own exit status (128+N when a signal N killed it); Ctrl-C and "
               "SIGTERM are forwarded to the command and the monitor waits for it to finish",
}


def _flat(text: str) -> str:
    return text.replace("`", "")


def help_block(command: str | None = None) -> str:
    """The "exit status:" block of `autotune --help` (command None) or of one command."""
    lines = ["exit status:"]
    if command in NOTES:
        lines += textwrap.wrap(_flat(NOTES[command]), 88, initial_indent="  ",
                               subsequent_indent="  ")
    rows = ([(e.code, e.meaning) for e in EXITS] if command is None
            else sorted(BY_COMMAND[command].items()))
    for code, meaning in rows:
        lines += textwrap.wrap(_flat(meaning), 88, initial_indent=f"  {code:<4} ",
                               subsequent_indent=" " * 7)
    return "\n".join(lines) + "\n"


def markdown_table(command: str | None = None) -> str:
    """The same table as the docs pages write it (docs/reference/exit-status.md for every
    command's, and each command's page for its own)."""
    if command is None:
        rows = [f"| {e.code} | {e.name} | {e.meaning} |" for e in EXITS]
        return "| code | name | meaning |\n|---|---|---|\n" + "\n".join(rows) + "\n"
    rows = [f"| {code} | {meaning} |" for code, meaning in sorted(BY_COMMAND[command].items())]
    note = NOTES.get(command, "")
    note = f"{note[:1].upper()}{note[1:]}.\n\n" if note else ""
    return note + "| code | meaning |\n|---|---|\n" + "\n".join(rows) + "\n"


__all__ = ["BY_COMMAND", "ERROR", "EXITS", "Exit", "GATE_FAILED", "GATE_UNMEASURED",
           "INTERRUPTED", "OK",
           "PARTIAL", "TERMINATED", "USAGE", "help_block", "markdown_table"]
