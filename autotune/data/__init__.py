"""Datasets, sample transforms and workload presets for `autotune bench` (and search).

- `open_source(path, format)`: a `SampleSource` (encoded bytes + label per index) for an
  image folder or a conversion; the readers live in the formats layer (`autotune_converters`:
  its registry knows every format), re-exported here for convenience.
- `TransformSpec` / `build_transform`: the sample pipeline (decode, crop, resize, flip,
  jitter, float32 normalised CHW tensor), torchvision's own step for step unless a faster,
  labelled variant is asked for (decoder simplejpeg, JPEG draft, exact: false).
- `ImagenetTrainTransform`: torchvision's ImageNet training transform on encoded images,
  exact or fast (`fast=True`), for a training loop of your own.
- `load_preset(name)`: a workload from configs/presets/*.yaml (batch size, emulated step
  time, transform, default DataLoader settings).

The user's training reads any of them with `autotune.open_dataset` (autotune.data.open:
decoded images or bytes through their transform, the folder's labels in every format).

Importing this package does not import torch; `autotune.data.torchds.ImageDataset` and
`autotune.data.open` do.
"""

from autotune.data.presets import LoaderDefaults, Preset, list_presets, load_preset, presets_dir
from autotune.data.transforms import ImagenetTrainTransform, TransformSpec, build_transform
from autotune_converters.folder import FolderSource
from autotune_converters.registry import open_source
from autotune_converters.source import MemorySource, SampleError, SampleSource

__all__ = [
    "FolderSource", "MemorySource", "SampleError", "SampleSource", "open_source",
    "ImagenetTrainTransform", "TransformSpec", "build_transform",
    "LoaderDefaults", "Preset", "list_presets", "load_preset", "presets_dir",
]
