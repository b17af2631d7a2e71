"""The search's send gate: where no worker could send the dataset's batch, no configuration
with workers is run.

A worker pickles each batch onto its queue. A batch that does not pickle (a sample holding a
generator, a lock, a lambda, an open handle) is dropped by the queue's thread, and the trial
waits for the whole batch timeout (120 s by default) and fails; every configuration with
workers fails alike, and a loader setting does not fix it. The search's first batch, made
without workers for the /dev/shm gate (autotune.search.shmgate), is pickled into nothing
first (autotune.sendable). Where that fails every configuration with workers is skipped with
the pickling error, num_workers=0 joins the space, and the search measures what loads in the
training process, where nothing is pickled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from autotune.bench.failures import UNSENDABLE_HINT

REASON_PREFIX = "batch cannot be sent"


@dataclass
class SendGate:
    """Which configurations of a search a worker could send batches of. `unsendable`: why
    the first batch does not pickle (None: it does, or it was not made; every configuration
    runs)."""

    unsendable: str | None = None
    skipped: int = 0
    added_zero: bool = False
    baseline_skipped: dict[str, Any] | None = None

    def why(self, params: dict[str, Any]) -> str | None:
        """The one-line reason `params` is not run, or None when it can."""
        w = params.get("num_workers") or 0
        if not (w and self.unsendable):
            return None
        return (f"{REASON_PREFIX}: not run: {w} worker(s) would pickle each batch to send it, "
                f"and the first batch (made without workers) cannot be pickled "
                f"({self.unsendable})")

    @property
    def hint(self) -> str:
        return UNSENDABLE_HINT

    def apply(self, space: Any, runnable: Callable[[dict[str, Any]], bool] | None = None) -> None:
        """Count what the space loses (of the configurations `runnable` says could run
        otherwise) and add num_workers=0: with this gate shut nothing with workers runs."""
        if not self.unsendable:
            return
        grid = space.grid()
        self.skipped = sum(1 for p in grid if self.why(p) and (runnable is None or runnable(p)))
        space.notes.append(f"the first batch cannot be pickled ({self.unsendable}): "
                           f"{self.skipped} of the space's {len(grid)} configurations, those "
                           f"with workers, not run; to load in workers: {self.hint}")
        if 0 not in (space.choices.get("num_workers") or []):
            space.choices["num_workers"] = sorted({0, *(space.choices.get("num_workers") or [])})
            self.added_zero = True
            space.notes.append("num_workers=0 added to the space: no worker can send this "
                               "dataset's batches, and in the training process "
                               "nothing is pickled")

    def to_dict(self) -> dict[str, Any]:
        """search.json's `sendable`."""
        return {"unsendable": self.unsendable, "skipped": self.skipped,
                "added_num_workers_0": self.added_zero,
                "baseline_skipped": self.baseline_skipped is not None}


__all__ = ["REASON_PREFIX", "SendGate"]
