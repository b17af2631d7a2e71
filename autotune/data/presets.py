"""Workload presets: configs/presets/NAME.yaml.

A preset fixes what a training job asks of the input pipeline: the batch size, the time
the accelerator spends on one batch (the emulated step), the sample transform and the
DataLoader settings a user would start from. Command-line options override them.

    name: resnet50
    description: ...
    batch_size: 256
    compute_ms: 104
    compute_source: where the step time comes from
    transform: {resize: 256, crop: 224, crop_mode: random, flip: true}
    loader: {num_workers: 4, prefetch_factor: 2, pin_memory: true, persistent_workers: false}

`num_workers: auto` means the usable cores of the machine running the bench.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.configfiles import config_dir, load_yaml
from autotune.data.transforms import TransformSpec
from autotune.errors import UsageError

_KEYS = {"name", "description", "batch_size", "compute_ms", "compute_source", "transform",
         "loader"}
_LOADER_KEYS = {"num_workers", "prefetch_factor", "pin_memory", "persistent_workers"}


def presets_dir() -> Path:
    """configs/presets of this checkout ($AUTOTUNE_PRESETS overrides)."""
    env = os.environ.get("AUTOTUNE_PRESETS")
    if env:
        return Path(env)
    return config_dir("presets")


def usable_cores() -> int:
    """Whole cores this process may use: the affinity mask and every cgroup CPU quota of
    its own cgroup and ancestors, rounded down (autotune.cpus), not the machine's total."""
    from autotune.cpus import usable_cores as _usable

    return _usable()


@dataclass(frozen=True)
class LoaderDefaults:
    num_workers: int = 4
    prefetch_factor: int = 2
    pin_memory: bool = False
    persistent_workers: bool = False


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    batch_size: int
    compute_ms: float
    transform: TransformSpec
    loader: LoaderDefaults = field(default_factory=LoaderDefaults)
    compute_source: str = ""
    path: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description,
                "batch_size": self.batch_size, "compute_ms": self.compute_ms,
                "compute_source": self.compute_source, "transform": self.transform.to_dict(),
                "loader": vars(self.loader).copy(), "path": self.path}


def list_presets() -> list[str]:
    """Names of the presets in presets_dir(), sorted."""
    d = presets_dir()
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def load_preset(name_or_path: str | os.PathLike[str]) -> Preset:
    """A preset by name (configs/presets/NAME.yaml) or by the path of a YAML file."""
    s = os.fspath(name_or_path)
    path = Path(s)
    if not (s.endswith((".yaml", ".yml")) or os.sep in s):
        path = presets_dir() / f"{s}.yaml"
        if not path.is_file():
            known = ", ".join(list_presets()) or f"none found in {presets_dir()}"
            raise UsageError(f"unknown preset {s!r}; available: {known} (or pass a YAML file).")
    return _parse(load_yaml(path, "preset"), path)


def _parse(raw: dict[str, Any], path: Path) -> Preset:
    where = f"preset {path}"
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(_KEYS))}.")
    bs = raw.get("batch_size")
    if not isinstance(bs, int) or bs < 1:
        raise UsageError(f"{where}: batch_size must be an integer of at least 1, but got {bs!r}.")
    cms = raw.get("compute_ms", 0)
    if not isinstance(cms, (int, float)) or cms < 0:
        raise UsageError(f"{where}: compute_ms must be a number >= 0, but got {cms!r}.")
    loader_raw = dict(raw.get("loader") or {})
    unknown = sorted(set(loader_raw) - _LOADER_KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown loader key(s) {', '.join(unknown)}; known: "
                         f"{', '.join(sorted(_LOADER_KEYS))}.")
    if loader_raw.get("num_workers") == "auto":
        loader_raw["num_workers"] = usable_cores()
    try:
        transform = TransformSpec.from_dict(raw.get("transform"))
        loader = LoaderDefaults(**loader_raw)
    except (TypeError, ValueError) as e:
        raise UsageError(f"{where}: {e}") from e
    except UsageError as e:
        raise UsageError(f"{where}: {e}") from e
    return Preset(name=str(raw.get("name") or path.stem), description=str(raw.get("description") or ""),
                  batch_size=bs, compute_ms=float(cms), transform=transform, loader=loader,
                  compute_source=str(raw.get("compute_source") or ""), path=str(path))
