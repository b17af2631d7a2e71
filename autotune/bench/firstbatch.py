"""The first batch a measurement would load, made in the calling process before any worker
starts: its bytes decide whether a configuration's batches fit in /dev/shm
(`autotune.shmfit`), and whether a worker could send it at all: it must pickle
(`autotune.sendable`).

The dataset is built as the bench child builds it (the user's factory with its
collate_fn, else autotune's reader and the preset's transform) and one batch of the
configuration's batch size is collated with `num_workers=0`: no shared memory is used,
so this works in the smallest /dev/shm.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from autotune.shmfit import BatchBytes, measure_batch


@dataclass(frozen=True)
class FirstBatch:
    """What the first batch tells before any worker starts: its bytes, and why a worker
    could not send it (the pickling error), None when it could."""

    bytes: BatchBytes
    unsendable: str | None = None


def first_batch(dataset: str | os.PathLike[str], cfg: Any) -> FirstBatch:
    """One batch of `cfg.batch_size` from `dataset` (a BenchConfig's pipeline), measured.

    Raises what reading the dataset raises (a missing file, a sample that cannot be
    decoded): callers treat that as "not measured" and let the measurement say it."""
    from autotune.sendable import why_unsendable

    batch = _make(dataset, cfg)
    return FirstBatch(measure_batch(batch), why_unsendable(batch))


def _make(dataset: str | os.PathLike[str], cfg: Any) -> Any:
    import torch.utils.data

    collate = None
    if cfg.dataset_factory:
        from autotune.bench import factory

        ud = factory.build(cfg.dataset_factory, str(dataset))
        ds, collate = ud.dataset, ud.collate_fn
    else:
        from autotune.data.torchds import ImageDataset
        from autotune.data.transforms import build_transform
        from autotune_converters.registry import open_source

        source = open_source(dataset, cfg.format)
        transform = build_transform(cfg.transform)
        ds = (source.dataset(transform, shuffle=False, seed=cfg.seed, num_workers=0)
              if source.iterable else ImageDataset(source, transform))
    kw = {"collate_fn": collate} if collate is not None else {}
    loader = torch.utils.data.DataLoader(ds, batch_size=cfg.batch_size, num_workers=0,
                                         shuffle=False, **kw)
    it = iter(loader)
    try:
        return next(it)
    finally:
        del it
