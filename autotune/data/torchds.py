"""The torch Dataset over a SampleSource: read bytes, run the sample pipeline."""

from __future__ import annotations

import time
from typing import Any

import torch.utils.data

from autotune.data.stages import StageClock
from autotune.data.transforms import SampleTransform
from autotune_converters.source import SampleError, SampleSource


class ImageDataset(torch.utils.data.Dataset):
    """Map-style dataset: index -> (transform output, e.g. float32 [3, crop, crop]; label).

    A sample that cannot be decoded raises SampleError naming its file (PIL's own message
    names only an in-memory buffer), so a failed bench says which file to fix.
    """

    def __init__(self, source: SampleSource, transform: SampleTransform,
                 stage_clock: StageClock | None = None) -> None:
        self.source = source
        self.transform = transform
        # Where each sample's time goes (read, decode, transform): autotune.data.stages.
        self.stage_clock = stage_clock

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        t0 = time.perf_counter()
        data, label = self.source.read(index)
        t1 = time.perf_counter()
        try:
            out, decode_s = self.transform.run(data)
        except Exception as e:  # noqa: BLE001  (any decoder error: name the file)
            raise SampleError(f"{self.source.describe(index)}: cannot decode "
                              f"({type(e).__name__}: {e}); fix or remove the file") from None
        if self.stage_clock is not None:
            self.stage_clock.add(read=t1 - t0, decode=decode_s,
                                 transform=time.perf_counter() - t1 - decode_s, samples=1)
        return out, label
