"""The search's /dev/shm gate: configurations whose batches cannot fit are not run.

The first batch is measured in the search process before any trial (autotune.bench.
firstbatch); with the per-rank budget (autotune.shmfit.shm_budget) that decides, for each
configuration, whether its live batches fit. A configuration whose batch_size differs from
the measured batch's scales its bytes per sample (a space searching batch_size [128, 256,
512] has batches 2-4 times the base one's). Without a /dev/shm (budget 0) nothing with
workers fits, measured or not. One that does not is skipped with that
reason (never started: in a 64 MiB /dev/shm it would die with "unable to allocate shared
memory" or hang until the DataLoader timeout), counted, and the recommendation comes from
those that fit; `num_workers=0` joins the space when nothing else fits. When configurations
were cut, the result names the /dev/shm size that runs them and what uint8 batches allow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from autotune.params import config_key
from autotune.shmfit import (MARGIN, SLACK_BYTES, BatchBytes, ShmAdvice, ShmBudget, fits,
                             live_batches, max_live_batches, needed_bytes, shm_advice)

REASON_PREFIX = "/dev/shm too small"


def _mib(n: float | None) -> str:
    return "?" if n is None else f"{n / 2**20:,.1f} MiB"


@dataclass
class ShmGate:
    """Which configurations of a search fit in /dev/shm. `batch` None: not measured (no
    figure to refuse on; `note` says why), and every configuration runs."""

    budget: ShmBudget
    batch: BatchBytes | None
    note: str | None = None
    space_size: int = 0
    space_skipped: int = 0
    added_zero: bool = False
    baseline_skipped: dict[str, Any] | None = None
    workers_fit: bool = True          # some configuration with workers fits
    largest_skipped: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    base_batch_size: int | None = None   # the measured batch's size (None: never scaled)
    unsendable: str | None = None   # why the batch does not pickle (autotune.sendable)

    @property
    def active(self) -> bool:
        if self.budget.budget_bytes is None:
            return False
        return self.batch is not None or self.budget.budget_bytes <= 0

    def batch_for(self, params: dict[str, Any]) -> BatchBytes | None:
        """The batch `params` makes: the measured one, its bytes per sample scaled to
        `params["batch_size"]` when that differs from the measured batch's size."""
        b, base = self.batch, self.base_batch_size
        bs = params.get("batch_size")
        if b is None or not base or not bs or bs == base:
            return b
        return BatchBytes(int(math.ceil(b.total * bs / base)),
                          int(math.ceil(b.float32 * bs / base)))

    def why(self, params: dict[str, Any]) -> str | None:
        """The one-line reason `params` is not run, or None when it fits."""
        if not self.active:
            return None
        w, pf = params.get("num_workers") or 0, params.get("prefetch_factor")
        b = self.batch_for(params)
        total = b.total if b is not None else None
        if fits(w, pf, total, self.budget.budget_bytes):
            return None
        if total is None:
            return (f"{REASON_PREFIX}: not run: {w} worker(s) hand batches over through "
                    f"/dev/shm, and this rank may use none of it ({self.budget.source})")
        bs = params.get("batch_size")
        of = f" (batch_size {bs})" if bs and bs != self.base_batch_size else ""
        return (f"{REASON_PREFIX}: not run: {w} worker(s) x prefetch {pf or 2} keep "
                f"{live_batches(w, pf)} batches of {_mib(total)}{of} in /dev/shm, "
                f"{_mib(needed_bytes(w, pf, total))} with margin, over the "
                f"{_mib(self.budget.budget_bytes)} this rank may use ({self.budget.source})")

    @property
    def hint(self) -> str:
        return ("a larger /dev/shm (docker run --shm-size, or a Kubernetes emptyDir with "
                "medium: Memory), fewer workers or a lower prefetch_factor, or uint8 batches "
                "normalised on the accelerator")

    def apply(self, space: Any,
              runnable: Callable[[dict[str, Any]], bool] | None = None) -> None:
        """Count what the space loses to /dev/shm alone (of the configurations `runnable`
        says could run otherwise); add num_workers=0 when nothing else fits."""
        grid = space.grid()
        over = [p for p in grid if self.why(p)]
        out = [p for p in over if runnable is None or runnable(p)]
        self.space_size, self.space_skipped = len(grid), len(out)
        self.workers_fit = any(p.get("num_workers") and not self.why(p) for p in grid)
        if out:
            self.largest_skipped = max(out, key=lambda p: needed_bytes(
                p.get("num_workers") or 0, p.get("prefetch_factor"),
                (self.batch_for(p) or BatchBytes(0)).total))
        if over and len(over) == len(grid) and 0 not in (space.choices.get("num_workers") or []):
            space.choices["num_workers"] = sorted({0, *(space.choices.get("num_workers") or [])})
            self.added_zero = True
            self.space_size = len(space.grid())
            self.notes.append("num_workers=0 added to the space: no configuration with "
                              "workers fits in /dev/shm, and loading in the training process "
                              "needs none")
            space.notes.append(self.notes[-1])

    def summary_line(self) -> str:
        per = (f"{_mib(self.batch.total)}" if self.batch is not None else "any batch")
        if self.batch is not None and self.base_batch_size:
            per += f" per {self.base_batch_size} samples"
        return (f"/dev/shm: {self.space_skipped} of the space's {self.space_size} "
                f"configurations not run: their live batches ((workers x prefetch + 1) x "
                f"{per}, x{MARGIN:g} + {SLACK_BYTES // 2**20} MiB) exceed "
                f"the {_mib(self.budget.budget_bytes)} this rank may use ({self.budget.source})")

    @property
    def bound(self) -> bool:
        """Whether /dev/shm cut configurations the search would have run."""
        return bool(self.space_skipped or self.baseline_skipped)

    def advice(self, target: dict[str, Any] | None) -> ShmAdvice | None:
        b = self.batch_for(target) if target is not None else None
        if not self.active or target is None or b is None:
            return None
        return shm_advice(target.get("num_workers") or 0, target.get("prefetch_factor"),
                          b, self.budget)

    def lines(self, skipped_trials: int = 0) -> list[str]:
        """What the search prints about /dev/shm (nothing when it cut nothing)."""
        if not self.active or not self.bound:
            return []
        out = [self.summary_line() + (f"; {skipped_trials} proposed trial(s) skipped"
                                      if skipped_trials else "")]
        if self.baseline_skipped is not None:
            out.append(f"the rule-of-thumb baseline was not run: {self.baseline_skipped['reason']}")
        target = self.baseline_skipped["params"] if self.baseline_skipped else self.largest_skipped
        adv = self.advice(target)
        if adv is not None:
            out.extend(adv.lines())
        if self.largest_skipped is not None and target is not self.largest_skipped:
            whole = self.advice(self.largest_skipped)
            if whole is not None and (adv is None or whole.docker != adv.docker):
                out.append(f"every configuration of the space runs with {whole.docker}")
        return out

    def to_dict(self, skipped_trials: int = 0) -> dict[str, Any]:
        """search.json's `shm`."""
        target = (self.baseline_skipped or {}).get("params") or self.largest_skipped
        adv = self.advice(target) if self.bound else None
        b = self.batch
        return {
            "batch_bytes": b.total if b else None,
            "batch_tensors": b.tensors if b else None,   # open files a batch in flight
            "batch_size": self.base_batch_size,      # what batch_bytes was measured at
            "float32_bytes": b.float32 if b else None,
            "budget_bytes": self.budget.budget_bytes, "budget": self.budget.to_dict(),
            "max_live_batches": (max_live_batches(b.total, self.budget.budget_bytes)
                                 if b and self.budget.budget_bytes is not None else None),
            "margin": MARGIN, "slack_bytes": SLACK_BYTES,
            "space_configurations": self.space_size, "skipped": self.space_skipped,
            "skipped_trials": skipped_trials,
            "baseline_skipped": self.baseline_skipped is not None,
            "added_num_workers_0": self.added_zero, "workers_fit": self.workers_fit,
            "bound": self.bound,
            "limit": self.summary_line() if self.bound and self.active else None,
            "advice": adv.to_dict() if adv is not None else None,
            "note": self.note, "notes": self.notes,
        }


def skipped_for_shm(trials: list[Any]) -> int:
    """Distinct configurations the loop skipped for /dev/shm (trial records)."""
    return len({config_key(t.params) for t in trials
                if t.state == "skipped" and (t.reason or "").startswith(REASON_PREFIX)})


def measure_gate(root: Any, base: Any, ranks: int, say: Any, env: Any) -> ShmGate:
    """The gate of a search: the budget of `env` (the search's one Environment) and the
    first batch's bytes; with them, whether that batch pickles (autotune.search.sendgate)."""
    from autotune.bench.firstbatch import first_batch
    from autotune.shmfit import shm_budget

    budget = shm_budget(env, ranks)
    known = budget.budget_bytes is not None
    say(f"measuring one batch of {base.batch_size} (no workers)"
        + (f" against /dev/shm's {_mib(budget.budget_bytes)}" if known else ""))
    try:
        first = first_batch(root, base)
    except Exception as e:  # noqa: BLE001 - the trials will say what is wrong with the data
        return ShmGate(budget, None, note=f"first batch not measured ({type(e).__name__}: "
                                          f"{str(e)[:200]}): no configuration refused for "
                                          "/dev/shm", base_batch_size=base.batch_size)
    # With the budget unknown the batch refuses nothing here (the gate is not active), but
    # its tensors still count against the open-files limit.
    return ShmGate(budget, first.bytes, base_batch_size=base.batch_size,
                   unsendable=first.unsendable,
                   note=None if known else (f"/dev/shm budget unknown ({budget.source}): no "
                                            "configuration refused for it"))


__all__ = ["REASON_PREFIX", "ShmGate", "measure_gate", "skipped_for_shm"]
