"""The exception tree of autotune and its formats, drawn once.

The base and the format errors live here, in the base layer, so that
`autotune_converters` depends on nothing in `autotune`; `autotune.errors` re-exports them and adds the errors
of measurement. The CLI maps the tree to exit codes in one place (`autotune.cli.main`).

    AutotuneError            a failure a user can act on; str(err) is the one-line message  exit 1
    ├── UsageError           an option, argument, input file or dataset is invalid          exit 2
    │   ├── UnsafeName       a manifest, plan or state file names a path outside its tree
    │   ├── DatasetError     a path holds nothing readable, a manifest from a newer autotune,
    │   │                    more readers than shards (also a ValueError)
    │   ├── StoreDenied      an object store refused: no such bucket, access denied (names
    │   │                    the endpoint, the bucket and the server's error code)
    │   ├── NoRoom           a conversion's DST lacks the free space for what it will write
    │   │                    (names DST, both figures and the fix; nothing written)
    │   ├── FactoryError     autotune.bench.factory: a --dataset-factory raised or returned
    │   │                    something else than a Dataset
    │   └── TorchTooOld      autotune.errors: a DataLoader keyword this torch lacks (also a
    │                        TypeError, as torch's own refusal is)
    ├── StoreUnreachable     an object store did not answer, or its retries ran out
    ├── ConvertError         a conversion stopped (names the file and the fix; rerun resumes)
    ├── StageError           staging cannot start or go on (space, lock, manifest)
    ├── SampleError          one sample cannot be read or decoded (names the file); also a
    │                        RuntimeError, so a DataLoader worker re-raises it intact
    ├── GateFailed           autotune.errors: a measured figure is under a threshold        exit 3
    ├── GateUnmeasured       autotune.errors: a gate's figure could not be measured         exit 5
    ├── ToolMissing          autotune.errors: an external program is not installed
    │   └── FioError         autotune.errors: fio is missing or failed
    └── NotPermitted         autotune.errors: needs root, FUSE or cgroups

`setting`: the library speaks of settings by their Python names (`num_workers`,
`metrics`); a caller that spells them otherwise (the CLI's `--workers`, `--metrics`) says
so when it shows the message.
"""

from __future__ import annotations


class AutotuneError(Exception):
    """Base class: a failure a user can act on. `str(err)` is the one-line message.

    setting: the name(s) of the setting the message is about, when there is one.
    """

    exit_code = 1

    def __init__(self, message: str = "", *, setting: str | tuple[str, ...] | None = None) -> None:
        super().__init__(message)
        self.settings: tuple[str, ...] = ((setting,) if isinstance(setting, str)
                                          else tuple(setting or ()))


class UsageError(AutotuneError):
    """An option, an argument or an input is invalid."""

    exit_code = 2


class UnsafeName(UsageError):
    """A manifest, plan or state file names something that is not a plain relative path
    inside its tree (`..`, absolute, NUL, empty, not a string); the message names the file
    and the entry."""


class DatasetError(UsageError, ValueError):
    """A dataset autotune cannot read as asked: a path that holds no format it knows
    (the message names the path and the formats looked for), a manifest written by a
    newer autotune (both versions named), more readers than shards (both numbers). Also a
    ValueError, as a bad argument to a Dataset is elsewhere."""


class StoreDenied(UsageError):
    """An object store refused the dataset: a missing bucket, denied access or bad keys;
    the message names the endpoint, the bucket and the server's error code."""


class NoRoom(UsageError):
    """A conversion refused before writing: DST's filesystem has less free space than
    what the conversion will still write; the message names DST, both figures and the fix
    (free space, or another DST)."""


class StoreUnreachable(AutotuneError):
    """An object store's endpoint did not answer, or kept failing until the retries ran
    out (503 SlowDown, timeouts); the message names the endpoint and the attempts."""


class ConvertError(AutotuneError):
    """A conversion failed; the message names the file, the figure and the fix."""


class StageError(AutotuneError):
    """Staging cannot start or go on (space, lock, manifest)."""


class SampleError(AutotuneError, RuntimeError):
    """A sample that cannot be read or decoded; the message names the file.

    Takes one message argument (and is a RuntimeError), so that a DataLoader worker can
    re-raise it in the main process with its type intact.
    """


__all__ = ["AutotuneError", "ConvertError", "DatasetError", "NoRoom", "SampleError", "StageError",
           "StoreDenied", "StoreUnreachable", "UnsafeName", "UsageError"]
