"""The torch Dataset over a SampleSource: read bytes, run the sample pipeline."""

from __future__ import annotations

from typing import Any

import torch.utils.data

from autotune.data.transforms import SampleTransform
from converters.source import SampleError, SampleSource


class ImageDataset(torch.utils.data.Dataset):
    """Map-style dataset: index -> (transform output, e.g. float32 [3, crop, crop]; label).

    A sample that cannot be decoded raises SampleError naming its file (PIL's own message
    names only an in-memory buffer), so a failed bench says which file to fix.
    """

    def __init__(self, source: SampleSource, transform: SampleTransform) -> None:
        self.source = source
        self.transform = transform

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        data, label = self.source.read(index)
        try:
            return self.transform(data), label
        except Exception as e:  # noqa: BLE001  (any decoder error: name the file)
            raise SampleError(f"{self.source.describe(index)}: cannot decode "
                              f"({type(e).__name__}: {e}); fix or remove the file") from None
