"""The user's own dataset in a measurement: `--dataset-factory FILE.py:FUNCTION`.

The factory is called in each measurement process with the DATASET path and returns a
`torch.utils.data.Dataset` or `IterableDataset`, or a dict with `dataset` and optionally
`collate_fn`, `sampler`, `worker_init_fn`. Its samples can be anything the default collate
(or theirs) batches: tuples, dicts, tensors of any dtype. Cold cache, the storage probe
and the monitor apply to the DATASET path, as for autotune's own pipeline.

`check(spec)` runs in the caller before any measurement (a missing file, function or
package is a usage error, exit 2); `build(spec, path)` runs in the measurement process.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

from autotune.errors import UsageError

KEYS = ("dataset", "collate_fn", "sampler", "worker_init_fn")


class FactoryError(UsageError):
    """The factory raised or returned something else; the message says which and the fix.
    A usage error (exit 2, one line): the user's factory is an input, like a path."""


@dataclass
class UserDataset:
    dataset: Any
    collate_fn: Callable[[list[Any]], Any] | None = None
    sampler: Any = None
    worker_init_fn: Callable[[int], None] | None = None

    @property
    def iterable(self) -> bool:
        import torch.utils.data

        return isinstance(self.dataset, torch.utils.data.IterableDataset)

    def info(self, spec: str, path: str) -> dict[str, Any]:
        try:
            n: int | None = len(self.dataset)
        except Exception:  # noqa: BLE001 - an IterableDataset may have no length
            n = None
        return {"path": path, "format": "factory", "factory": spec, "images": n,
                "type": type(self.dataset).__name__, "iterable": self.iterable}


class UserCodeExit(Exception):
    """The user's module called sys.exit() (or raised SystemExit) while it was imported."""


def load_user_code(spec: str) -> Any:
    """'module:attr' or 'path/to/file.py:attr' of the user's (a --step, a --dataset-factory),
    a module beside the user's command found too; the loader's exceptions pass through, but
    a sys.exit() at import is raised as UserCodeExit (it would end autotune silently with
    the user's code)."""
    from autotune_converters.registry import load as load_attr

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return load_attr(spec)
    except SystemExit as e:
        raise UserCodeExit(f"{spec.rpartition(':')[0]} called sys.exit({e.code!r}) while it "
                           "was imported") from None


def _file_of(target: str) -> str | None:
    """The user's file when `target` names an existing .py file, else None."""
    if target.endswith(".py") or os.sep in target:
        return target if os.path.isfile(target) else None
    return None


def load(spec: str) -> Callable[[str], Any]:
    """The factory function; UsageError naming it when the file, module, function or one
    of its imports is missing, or when importing it raised or exited."""
    target, _, name = spec.rpartition(":")
    try:
        fn = load_user_code(spec)
    except FileNotFoundError as e:
        if _file_of(target) is None:
            raise UsageError(f"dataset factory {spec}: {target}: no such file; give "
                             "path/to/file.py:function or module:function.",
                             setting="dataset_factory") from None
        raise _raised_at_import(spec, target, e) from None
    except ModuleNotFoundError as e:
        raise UsageError(f"dataset factory {spec}: importing it needs {e.name!r}, which is not "
                         f"installed ({e}); install it in this environment.",
                         setting="dataset_factory") from None
    except ImportError as e:
        raise UsageError(f"dataset factory {spec}: {e}; give path/to/file.py:function with a "
                         "function of that name.", setting="dataset_factory") from None
    except SyntaxError as e:
        raise UsageError(f"dataset factory {spec}: {e.filename}:{e.lineno}: syntax error "
                         f"({e.msg}).", setting="dataset_factory") from None
    except UserCodeExit as e:
        raise UsageError(f"dataset factory {spec}: {e}; a factory's module must not exit when "
                         "imported (put its script part under `if __name__ == \"__main__\":`).",
                         setting="dataset_factory") from None
    except Exception as e:  # noqa: BLE001 - the user's module raised while it was imported
        raise _raised_at_import(spec, target, e) from None
    if not callable(fn):
        raise UsageError(f"dataset factory {spec}: {name} is a {type(fn).__name__}, not a "
                         "function.", setting="dataset_factory")
    return fn


def _raised_at_import(spec: str, target: str, e: BaseException) -> UsageError:
    msg = " ".join(str(e).split())
    return UsageError(f"dataset factory {spec}: {target} raised {type(e).__name__} while it was "
                      f"imported{': ' + msg if msg else ''}; fix it (`python {target}` shows the "
                      "traceback).",
                      setting="dataset_factory")


def check(spec: str) -> None:
    """Refuse a factory that cannot even be loaded, before anything is measured."""
    load(spec)


def build(spec: str, path: str) -> UserDataset:
    """Call the factory with the dataset path and check what it returned."""
    import torch.utils.data

    fn = load(spec)
    try:
        out = fn(path)
    except Exception as e:  # noqa: BLE001 - the user's code: say whose and what
        raise FactoryError(f"dataset factory {spec} raised {type(e).__name__}: {e}; it is "
                           f"called with the dataset path ({path}) in each measurement "
                           "process: fix it and rerun") from e
    if isinstance(out, dict):
        unknown = sorted(set(out) - set(KEYS))
        if "dataset" not in out or unknown:
            raise FactoryError(f"dataset factory {spec} returned a dict with keys "
                               f"{sorted(out)}; expected 'dataset' and optionally "
                               f"{', '.join(KEYS[1:])}")
        ud = UserDataset(**out)
    else:
        ud = UserDataset(out)
    if not isinstance(ud.dataset, (torch.utils.data.Dataset, torch.utils.data.IterableDataset)):
        raise FactoryError(f"dataset factory {spec} returned {type(ud.dataset).__name__}, not a "
                           "torch.utils.data.Dataset or IterableDataset; return one (or a dict "
                           "with 'dataset')")
    if ud.iterable and ud.sampler is not None:
        raise FactoryError(f"dataset factory {spec} returned a sampler with an IterableDataset; "
                           "an IterableDataset orders and splits its samples itself")
    return ud
