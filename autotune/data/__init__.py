"""Datasets, sample transforms and workload presets for `autotune bench` (and search).

- `open_source(path, format)`: a `SampleSource` (encoded bytes + label per index) for an
  image folder; LMDB and WebDataset readers plug in behind the same interface later.
- `TransformSpec` / `build_transform`: the Pillow + torch sample pipeline (decode, RGB,
  resize, crop, flip, jitter, uint8 CHW tensor).
- `load_preset(name)`: a workload from configs/presets/*.yaml (batch size, emulated step
  time, transform, default DataLoader settings).

Importing this package does not import torch; `autotune.data.torchds.ImageDataset` does.
"""

from autotune.data.presets import LoaderDefaults, Preset, list_presets, load_preset, presets_dir
from autotune.data.sources import (FORMATS, FolderSource, MemorySource, SampleError, SampleSource,
                                   detect_format, open_source, resolve_format)
from autotune.data.transforms import TransformSpec, build_transform

__all__ = [
    "FORMATS", "FolderSource", "MemorySource", "SampleError", "SampleSource", "detect_format", "open_source", "resolve_format",
    "TransformSpec", "build_transform",
    "LoaderDefaults", "Preset", "list_presets", "load_preset", "presets_dir",
]
