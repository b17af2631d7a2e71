"""Exceptions raised by the library: the one tree the CLI maps to exit codes.

The base and the format errors live in `autotune_base.errors` (the base layer, which
both autotune and autotune_converters import); they are re-exported here, with the errors
of measurement added:

    AutotuneError            a failure a user can act on; str(err) is the one-line message  exit 1
    ├── UsageError           an option, argument, input file or dataset is invalid          exit 2
    │   ├── UnsafeName       a manifest, plan or state file names a path outside its tree
    │   ├── DatasetError     nothing readable at a path, a newer manifest, readers > shards
    │   ├── StoreDenied      an object store refused: no such bucket, access denied
    │   └── TorchTooOld      a DataLoader keyword this torch lacks (in_order=False before
    │                        2.6); also a TypeError, as torch's own refusal is
    ├── StoreUnreachable     an object store did not answer, or its retries ran out
    ├── ConvertError         a conversion stopped (names the file and the fix; rerun resumes)
    ├── StageError           staging cannot start or go on (space, lock, manifest)
    ├── SampleError          one sample cannot be read or decoded (names the file)
    ├── GateFailed           a measured figure is under a threshold the user enforces       exit 3
    ├── GateUnmeasured       a gate's figure could not be measured (fio missing, buffered)  exit 5
    ├── ToolMissing          an external program (iostat, ...) is not installed
    ├── FioError             fio failed, printed something that is not its JSON, or is missing
    └── NotPermitted         the operation needs root, FUSE or cgroups

Exit codes (autotune/cli/exits.py, the one table of `--help` and the docs): 0 success,
1 error, 2 usage error, 3 gate failed, 4 partial (stage: some files failed, named), 5 gate
not measured, 130 interrupted, 143 terminated.
"""

from __future__ import annotations

from autotune_base.errors import (AutotuneError, ConvertError, DatasetError, NoRoom, SampleError,
                               StageError, StoreDenied, StoreUnreachable, UnsafeName, UsageError)


class GateFailed(AutotuneError):
    """A measured figure is below a threshold the user asked to enforce."""

    exit_code = 3


class GateUnmeasured(AutotuneError):
    """A threshold the user enforces could not be judged: the storage's own figure was not
    measured (fio missing or failed, a buffered run the page cache served, RAM)."""

    exit_code = 5


class ToolMissing(AutotuneError):
    """An external program (fio, iostat, ...) is not installed."""


class FioError(AutotuneError):
    """fio failed, printed something that is not its JSON, or is not installed."""


class TorchTooOld(UsageError, TypeError):
    """autotune.DataLoader was asked for something the installed torch's DataLoader cannot
    do (`in_order=False` before torch 2.6); the message names both versions and the fix.
    Also a TypeError, which torch's own DataLoader raises for a keyword it lacks, so a
    caller's `except TypeError` fallback for an older torch catches it."""


class NotPermitted(AutotuneError):
    """The operation needs privileges (root, FUSE, cgroups) this process does not have."""


__all__ = ["AutotuneError", "ConvertError", "DatasetError", "FioError", "GateFailed",
           "GateUnmeasured", "NoRoom", "NotPermitted",
           "SampleError", "StageError", "StoreDenied", "StoreUnreachable", "ToolMissing",
           "TorchTooOld", "UnsafeName", "UsageError"]
