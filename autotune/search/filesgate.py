"""The search's open-files gate: configurations whose trials would run past the trials'
open-files limit (RLIMIT_NOFILE, `ulimit -n`, or --max-open-files) are not run.

With torch's default sharing strategy every tensor of a batch in flight is an open file in
the worker that made it and in the training process that takes it (autotune.online.
openfiles). A batch of many tensors (a list or dict of them a sample, a detection
target per object) under a container's `ulimit -n 1024` cannot run many workers deep:
such a trial fails ("received 0 items of ancdata"), or its worker drops a batch with
EMFILE and the measurement waits for the DataLoader timeout; the user's own run with that
recommendation would do the same. The count is openfiles' (above what was measured: at
ulimit -n 300 with 48 tensors a batch, 1 worker 4 deep and 2 workers 2 deep ran and are
refused; 2 x 4 and 4 workers failed).
The tensors a batch come from the search's first batch (autotune.search.shmgate), counted
at the search's batch size and not scaled with another: a default collate stacks a field
into one tensor whatever the batch size. The training process's own files are counted as
openfiles.OWN_ALLOWANCE (a trial's measurement process is not this one). When every
configuration with workers is over the limit, num_workers=0 joins the space.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from typing import Any, Callable

from autotune.openfiles import (OWN_ALLOWANCE, fix, forks, limit, main_needs,
                                       worker_needs)

REASON_PREFIX = "open files"


def trial_limit(max_open_files: int | None) -> int | None:
    """The soft open-files limit a trial's measurement runs under: --max-open-files, capped
    at the hard limit as the measurement process caps it, or this process's; None: none."""
    if max_open_files is None:
        return limit()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return max_open_files if hard == resource.RLIM_INFINITY else min(max_open_files, hard)


def needs(params: dict[str, Any], tensors: int) -> int:
    """The most open files either side of `params`' pool holds, `tensors` tensors a batch."""
    w, pf = params.get("num_workers") or 0, params.get("prefetch_factor")
    return max(worker_needs(tensors, pf, OWN_ALLOWANCE if forks() else 0),
               main_needs(tensors, w, w * (pf or 2) - 1, own=OWN_ALLOWANCE))


@dataclass
class FilesGate:
    """Which configurations of a search stay within the trials' open-files limit.
    `tensors` None or 0 (not measured, or a batch of no tensor), `limit` None (no limit)
    or a sharing strategy other than "file_descriptor": every configuration runs."""

    tensors: int | None = None
    limit: int | None = None
    by_fd: bool = True
    skipped: int = 0
    added_zero: bool = False
    baseline_skipped: dict[str, Any] | None = None
    given: bool = False   # the limit is --max-open-files, not this process's

    def why(self, params: dict[str, Any]) -> str | None:
        """The one-line reason `params` is not run, or None when it stays within the limit."""
        w = params.get("num_workers") or 0
        if not (w and self.tensors and self.limit and self.by_fd):
            return None
        n = needs(params, self.tensors)
        if n <= self.limit:
            return None
        return (f"{REASON_PREFIX}: not run: {w} worker(s) x prefetch "
                f"{params.get('prefetch_factor') or 2} with {self.tensors:,} tensors a batch "
                f"hold about {n:,} open files, over the trials' limit of {self.limit:,} "
                "(ulimit -n): run, it would fail (EMFILE) or wait on a batch a worker dropped")

    @property
    def hint(self) -> str:
        return fix(here=not self.given)

    def apply(self, space: Any, runnable: Callable[[dict[str, Any]], bool] | None = None,
              refused: Callable[[dict[str, Any]], Any] | None = None) -> None:
        """Count what the space loses to the limit (of the configurations `runnable` says
        could run otherwise); add num_workers=0 when nothing with workers is left, this gate
        and `refused` (the /dev/shm gate's reason) together (loading in the training process
        opens no such file)."""
        grid = space.grid()
        over = [p for p in grid if self.why(p) and (runnable is None or runnable(p))]
        self.skipped = len(over)
        if not over:
            return
        lim = f"{self.limit:,}"
        space.notes.append(f"open files: {len(over)} of the space's {len(grid)} "
                           f"configurations not run: {self.tensors:,} tensors a batch, each "
                           f"an open file while in flight, over the trials' limit of {lim} "
                           f"(ulimit -n); to run them: {self.hint}")
        if all(self.why(p) or (refused is not None and refused(p)) for p in grid) and \
                0 not in (space.choices.get("num_workers") or []):
            space.choices["num_workers"] = sorted({0, *(space.choices.get("num_workers") or [])})
            self.added_zero = True
            space.notes.append("num_workers=0 added to the space: no configuration with "
                               f"workers stays within {lim} open files and /dev/shm")

    def to_dict(self) -> dict[str, Any]:
        """search.json's `open_files`."""
        return {"limit": self.limit, "batch_tensors": self.tensors,
                "sharing_by_fd": self.by_fd, "skipped": self.skipped,
                "added_num_workers_0": self.added_zero,
                "baseline_skipped": self.baseline_skipped is not None}


def files_gate(shm_gate: Any, max_open_files: int | None) -> FilesGate:
    """The gate from the first batch the /dev/shm gate measured and the trials' limit."""
    from autotune.openfiles import _shares_by_fd

    batch = getattr(shm_gate, "batch", None)
    return FilesGate(batch.tensors if batch is not None else None,
                     trial_limit(max_open_files), _shares_by_fd(),
                     given=max_open_files is not None)


__all__ = ["REASON_PREFIX", "FilesGate", "files_gate", "needs", "trial_limit"]
