"""The step log of `autotune.instrument`, written by a Lightning `Callback`.

    from autotune.integrations.lightning import InstrumentCallback

    trainer = lightning.Trainer(callbacks=[InstrumentCallback(log="steps.jsonl")])
    trainer.fit(model, datamodule)          # then: autotune analyze steps.jsonl

Lightning owns the training loop, so `autotune.instrument(loader)` cannot wrap the loader
it iterates (Lightning re-creates the DataLoader to add a DistributedSampler). The
callback writes the same JSONL (format `own`, read by `autotune analyze` unchanged): a
header with the loader's settings, the usable cores and the rank, then per step `t`,
`wait_s`, `step_s`, `batch`, `epoch`, `step`, `rank`.

What the figures are:
- `wait_s`: the time Lightning spends in `next()` on the training DataLoader, taken from
  the profiler calls Lightning makes around every fetch (action
  `[_TrainingEpochLoop].train_dataloader_next`, the row the `lightning` log format reads
  from SimpleProfiler). The user's own profiler still gets every call. Where a Lightning
  version makes no such call, the wait is the gap from the previous step's end
  (`on_train_batch_end`, or a validation run's end) to `on_train_batch_start`, which also
  holds Lightning's per-batch bookkeeping and the copy to the device; the header's
  `wait_from` says which (`fetch` or `hooks`). An IterableDataset is fetched one batch
  ahead (Lightning's way to know the last batch): each step's wait is the fetch of the
  batch after it, the last step's is none, and the run's very first fetch, made before
  Lightning times fetches, is not in the log (the analysis leaves warm-up steps out).
- `step_s`: from the batch in hand until the loop asks for the next one: the training
  step and whatever else runs per batch (callbacks, logging, validation, checkpoints), as
  `instrument` counts a plain loop's body.

Rank and world size come from the trainer (`global_rank`, `world_size`), so each DDP rank
writes its own lines; "{rank}" in `log` gives each rank a file, else ranks append to one.
Lightning is an optional dependency: `pip install 'autotune-loader[lightning]'`; the package
`lightning` (`lightning.pytorch`) is used, else the older `pytorch_lightning`.
"""

from __future__ import annotations

import os
import time
from typing import Any

from autotune.instrumentation import (InstrumentSummary, StepTotals, _env_int, _Writer,
                                      batch_len, loader_info, log_path, open_log)

try:
    from lightning.pytorch import Callback
except ImportError:
    try:
        from pytorch_lightning import Callback  # type: ignore[no-redef]
    except ImportError:
        raise ImportError("autotune.integrations.lightning needs Lightning, which is not "
                          "installed: pip install 'autotune-loader[lightning]'") from None

FETCH_ACTION = "train_dataloader_next"   # Lightning's profiler action around each fetch

__all__ = ["FETCH_ACTION", "InstrumentCallback"]


class InstrumentCallback(Callback):
    """Records every training step's data wait and step time to a JSONL step log.

    Args:
        log: the file; "{rank}" in it is replaced by the rank. Default: the
            AUTOTUNE_STEPS_LOG environment variable (set by `autotune monitor`), else
            steps.jsonl in the current directory.
        batch_size: samples per batch, when a batch's first tensor does not say it.
        append: keep what the file holds (default: truncate it, unless ranks share it).

    `summary()` gives the totals (an `InstrumentSummary`). Nothing is printed.
    """

    def __init__(self, log: str | os.PathLike[str] | None = None, *,
                 batch_size: int | None = None, append: bool = False) -> None:
        super().__init__()
        # Not `self.log`: Lightning sets `callback.log` to the module's `log()` on every
        # callback it is given.
        self.log_arg = log
        self.batch_size = batch_size
        self.append = append
        self.path: str | None = None
        self._writer: _Writer | None = None
        self._unhook: Any = None
        self._rank = ""
        self._wall0 = time.time()
        self._pc0 = time.perf_counter()
        self._reset_totals()
        # The step whose end is not known yet: (index, t_req, t_got, wait, batch size).
        self._pending: tuple[int, float, float, float, int | None] | None = None
        self._forget_fetches()
        self._mark = time.perf_counter()

    # -- results -------------------------------------------------------------------------
    def summary(self) -> InstrumentSummary:
        """Steps, wait and step time recorded so far."""
        lost = self._writer.lost if self._writer is not None else self._lost
        return self._totals.summary(lost)

    # -- Lightning hooks (signatures of lightning.pytorch.Callback 2.x) -------------------
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self._hook_profiler(trainer)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self._close_pending(time.perf_counter())
            self._unhook_profiler()
            if self._writer is not None:
                self._writer.close()
                self._lost = self._writer.lost
                self._writer = None

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        # Fetches already timed are kept: before the first epoch Lightning may have
        # fetched a batch ahead (an IterableDataset), the first step's wait.
        self._totals.epochs += 1
        self._epoch = int(getattr(trainer, "current_epoch", self._totals.epochs - 1))
        self._mark = time.perf_counter()

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        now = time.perf_counter()
        if self._writer is None:   # here the loader is set up and the first fetch is known
            self._writer = self._open(trainer)
        if self._fetch_first is not None:      # Lightning's fetch, timed by the profiler
            t_req, t_got, wait = self._fetch_first, self._fetch_last, self._fetch_wait
        else:                                  # no fetch seen: the gap since the last step
            t_req, t_got, wait = self._mark, now, now - self._mark
        self._close_pending(t_req)
        bs = self.batch_size if self.batch_size is not None else batch_len(batch)
        self._pending = (batch_idx, t_req, t_got, wait, bs)
        self._forget_fetches()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._mark = time.perf_counter()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        # Validation inside the epoch belongs to the step before it (a plain loop's body),
        # never to the next step's data wait.
        self._mark = time.perf_counter()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        # The last step ends where the loop asked again (the fetch that found the end).
        self._close_pending(self._fetch_first or time.perf_counter())
        self._forget_fetches()
        if self._writer is not None:
            self._writer.flush()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.teardown(trainer, pl_module, "fit")

    # -- recording -----------------------------------------------------------------------
    def _reset_totals(self) -> None:
        self._totals = StepTotals()
        self._lost = 0
        self._epoch = 0

    def _forget_fetches(self) -> None:
        self._fetch_first: float | None = None   # first fetch since the last batch start
        self._fetch_last = 0.0
        self._fetch_start = 0.0
        self._fetch_wait = 0.0

    def _open(self, trainer: Any) -> _Writer:
        world = int(getattr(trainer, "world_size", 1) or 1)
        rank = int(trainer.global_rank) if world > 1 else _env_int("RANK", "SLURM_PROCID")
        self.path, shared = log_path(self.log_arg, rank)
        self._rank = "" if rank is None else f',"rank":{rank}'
        return open_log(self.path, self.append or shared, rank=rank,
                        world_size=world if world > 1 else _env_int("WORLD_SIZE", "SLURM_NTASKS"),
                        started=self._wall0,
                        loader=loader_info(getattr(trainer, "train_dataloader", None)),
                        batch_size=self.batch_size,
                        extra={"recorder": "lightning",
                               "wait_from": "fetch" if self._fetch_first is not None else "hooks"})

    def _close_pending(self, end: float) -> None:
        if self._pending is None or self._writer is None:
            return
        step, t_req, t_got, wait, bs = self._pending
        self._pending = None
        t = t_req - self._pc0 + self._wall0
        self._writer.add(self._totals.line(t, self._epoch, step, wait, max(0.0, end - t_got),
                                           bs, self._rank), time.monotonic())

    # -- the fetch, timed through the profiler calls Lightning makes around it ------------
    def _hook_profiler(self, trainer: Any) -> None:
        prof = getattr(trainer, "profiler", None)
        if prof is None or self._unhook is not None:
            return
        start, stop = prof.start, prof.stop

        def start_(action_name: str) -> None:
            start(action_name)
            if action_name.endswith(FETCH_ACTION):
                self._fetch_start = time.perf_counter()   # after the user's profiler

        def stop_(action_name: str) -> None:
            if action_name.endswith(FETCH_ACTION) and self._fetch_start:
                now = time.perf_counter()
                if self._fetch_first is None:
                    self._fetch_first = self._fetch_start
                self._fetch_wait += now - self._fetch_start
                self._fetch_last = now
                self._fetch_start = 0.0
            stop(action_name)

        try:
            prof.start, prof.stop = start_, stop_   # instance attributes shadow the methods
        except AttributeError:                      # a profiler with __slots__: hooks only
            return

        def unhook() -> None:
            for name in ("start", "stop"):
                try:
                    delattr(prof, name)
                except AttributeError:
                    pass
        self._unhook = unhook

    def _unhook_profiler(self) -> None:
        if self._unhook is not None:
            self._unhook()
            self._unhook = None

    def __getstate__(self) -> dict[str, Any]:
        # ddp_spawn pickles callbacks: an open file and a closure do not travel.
        d = self.__dict__.copy()
        d["_writer"] = None
        d["_unhook"] = None
        return d
