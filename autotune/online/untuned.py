"""What `autotune.DataLoader` leaves as torch would have it: an IterableDataset's workers,
and a second iterator taken inside a live epoch.

An IterableDataset is iterated whole in every worker: with another worker count it
yields other samples (each worker all of them, or another split of them, other partial
batches), so its num_workers stays the one given (torch's 0 when none is), and
persistent_workers too (a worker kept between epochs does not see what the loop changes
in the dataset, a set_epoch). Left to tune: prefetch_factor when workers are given, and
pin_memory where CUDA is present.

A map-style dataset with a `set_epoch` changes between epochs: a worker kept from the last
epoch (persistent_workers, which the tuner otherwise turns on) holds the dataset as it was,
so persistent_workers stays the user's (torch's False when not given).

`iter(loader)` while the live epoch's iterator is still held is decided at its first
next(): if that iterator is gone by then (`it = iter(loader)` rebound the name that held
it, a loop that took len(loader) batches with next() and never saw StopIteration), it is
the next epoch, tuned, and the old one ends; if it is still held (`next(iter(loader))`
inside the loop), a plain torch iterator with the user's arguments, the serving pool's
worker count and no kept workers, drawing from the same sampler and generator as torch's
second iterator would; the live epoch goes on untouched.
"""

from __future__ import annotations

import logging
import warnings
import weakref
from typing import Any, Iterator

from torch.utils.data import DataLoader as TorchLoader

from autotune.online.controller import emit
from autotune.online.pool import ReadyInit, index_kwargs, share_temp_dir

log = logging.getLogger("autotune.online")


def keep_iterable_workers(fixed: dict[str, Any], multiprocessing_context: Any, *,
                          tuning: bool) -> frozenset[str]:
    """Fix num_workers and persistent_workers of an IterableDataset in `fixed` (the user's
    settings, which tuning never changes); warn of settings torch ignores without workers.
    Returns the knobs held though not given: prefetch_factor where the user keeps the
    workers (persistent_workers=True): a pool for another one would start new workers, and
    they would see what the loop changed in the dataset (a set_epoch) where the kept ones
    do not."""
    src = "as given" if "num_workers" in fixed else "torch's default"
    nw = fixed.setdefault("num_workers", 0)
    fixed.setdefault("persistent_workers", False)
    if not nw:
        unused = [k for k in ("prefetch_factor", "persistent_workers")
                  if fixed.get(k)] + (["multiprocessing_context"]
                                      if multiprocessing_context else [])
        if unused:
            warnings.warn(f"autotune.DataLoader: {', '.join(unused)} not applied: an "
                          f"IterableDataset is loaded with num_workers={nw} ({src}); "
                          "give num_workers to use workers", stacklevel=3)
    kept = bool(nw and fixed["persistent_workers"])
    held = frozenset({"prefetch_factor"} if kept and "prefetch_factor" not in fixed else ())
    tuned = "prefetch_factor" if nw and "prefetch_factor" not in fixed and not held else None
    if tuning:
        emit("iterable", f"an IterableDataset: num_workers={nw} ({src}) and "
             f"persistent_workers="
             f"{fixed['persistent_workers']} are kept, never tuned (every worker "
             "iterates the dataset: the worker count decides what it yields); "
             + (f"{tuned} is tuned, between epochs" if tuned else
                "prefetch_factor is not tuned either: a pool for another one would replace "
                "the workers you keep" if held else "nothing else to tune"),
             num_workers=nw, tuned=[tuned] if tuned else [])
    return held


def keep_fresh_workers(dataset: Any, fixed: dict[str, Any], *, tuning: bool) -> None:
    """persistent_workers of a map-style `dataset` with a set_epoch: the user's, never
    tuned on (see the module doc)."""
    if "persistent_workers" in fixed or not callable(getattr(dataset, "set_epoch", None)):
        return
    fixed["persistent_workers"] = False
    if tuning:
        emit("set-epoch", "the dataset has set_epoch: persistent_workers=False is kept, never "
             "tuned (a worker kept between epochs would not see the new epoch)",
             persistent_workers=False)


class DeferredIter:
    """What iter(loader) returns while the live epoch's iterator is still held: the next
    epoch or a second iterator, decided at the first next() (see the module doc)."""

    def __init__(self, dl: Any) -> None:
        self._dl, self._it = dl, None

    def __iter__(self) -> DeferredIter:
        return self

    def __next__(self) -> Any:
        if self._it is None:
            dl = self._dl
            if dl._epoch.live is None or dl._live() is None:
                self._it = dl._tuned_epoch()
                # The loop holds this iterator, not the epoch's: it is the live one.
                dl._live = weakref.ref(self)
            else:
                first, dl._second_said = not dl._second_said, True
                self._it = second_iterator(dl, first=first)
        it = self._it
        del self  # not in a traceback's frames (see EpochIter.__next__)
        return next(it)

    def __len__(self) -> int:
        return len(self._dl)


def second_iterator(dl: Any, *, first: bool) -> Iterator[Any]:
    """The plain torch iterator of a second iter() inside a live epoch of `dl` (an
    autotune.DataLoader; see the module doc); `first`: the first such iterator of this
    loader (it is logged once). Never tuned."""
    if first:
        log.warning("iter() inside a live epoch: that iterator is a plain torch "
                    "DataLoader's (not tuned); the live epoch goes on",
                    extra={"autotune_event": "second-iterator", "autotune": {}})
    cfg = dl._running
    kw: dict[str, Any] = dict(dl._common, generator=dl.generator,
                              worker_init_fn=dl.worker_init_fn,
                              pin_memory=cfg.pin_memory, num_workers=cfg.num_workers)
    if cfg.num_workers:
        # Its workers' sockets in this process's folder, as a pool's (pool.use_temp_dir).
        kw.update(prefetch_factor=cfg.prefetch_factor,
                  multiprocessing_context=dl.multiprocessing_context,
                  worker_init_fn=ReadyInit(dl.worker_init_fn, None, share_temp_dir()))
    else:
        kw["timeout"] = 0
    kw.update(index_kwargs(dl.batch_sampler if dl._auto else dl.sampler,
                           iterable=dl._iterable, auto_collation=dl._auto))
    return iter(TorchLoader(dl.dataset, **kw))
