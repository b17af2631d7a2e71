"""bench's up-front refusals: a configuration with workers that cannot run is refused
before any process starts, with the figures and the fix.

A batch no worker can send. A worker pickles each batch onto its queue; where that fails
(a sample holding a generator, a lock, a lambda) its queue thread drops the batch and the
measurement waits for the whole --batch-timeout, then fails (failure_kind "unsendable").
The first batch, made here without workers, is pickled into nothing first
(autotune.sendable): such a configuration is the same failure at once.

Batches that cannot fit in /dev/shm.
In a 64 MiB /dev/shm (Docker's default) a float32 batch of 64 x 3x224x224 is 37 MiB and
even one worker keeps two of them there: the measurement would die ("unable to allocate
shared memory") or hang until the DataLoader timeout. The first batch is measured here,
in the calling process and without workers (autotune.bench.firstbatch), and set against
the per-rank budget (autotune.shmfit); a configuration over it is a failed result naming
the figures and the fix, and no measurement process starts.
"""

from __future__ import annotations

import os
from typing import Any

from autotune.bench.failures import UNSENDABLE_HINT
from autotune.bench.result import BenchResult
from autotune.shmfit import (MARGIN, SLACK_BYTES, fits, live_batches, needed_bytes, shm_advice,
                             shm_budget)


def _mib(n: float | None) -> str:
    return "?" if n is None else f"{n / 2**20:,.1f} MiB"


def refusal(dataset: str | os.PathLike[str], cfg: Any, env: Any = None) -> BenchResult | None:
    """A failed BenchResult when `cfg`'s workers could not send its first batch (failure_kind
    "unsendable") or its live batches do not fit in the /dev/shm budget ("shm"), else None
    (it runs, uses no workers, or a figure is unknown: the measurement then says what
    happens)."""
    cfg = cfg.validate()
    if not cfg.num_workers:
        return None
    if env is None:
        from autotune.environment import read_environment

        env = read_environment(None if "://" in str(dataset) else dataset)
    budget = shm_budget(env, cfg.procs_per_node)
    if budget.budget_bytes is not None and budget.budget_bytes <= 0:
        # No /dev/shm: whatever the batch, workers cannot hand it over.
        return _refused(dataset, cfg, f"not run: {cfg.num_workers} worker(s) hand batches "
                        f"over through /dev/shm, and this rank may use none of it "
                        f"({budget.source})", "--workers 0 (no shared memory), or mount a "
                        "tmpfs at /dev/shm", "shm", {"budget": budget.to_dict()})
    from autotune.bench.firstbatch import first_batch

    try:
        first = first_batch(dataset, cfg)
    except Exception:  # noqa: BLE001 - the measurement reports what is wrong with the data
        return None
    if first.unsendable is not None:
        return _refused(dataset, cfg, f"not run: {cfg.num_workers} worker(s) would pickle "
                        "each batch to send it, and the first batch (made here, without "
                        f"workers) cannot be pickled ({first.unsendable})", UNSENDABLE_HINT,
                        "unsendable", {})
    batch = first.bytes
    if budget.budget_bytes is None:
        return None
    w, pf = cfg.num_workers, cfg.prefetch_factor
    if fits(w, pf, batch.total, budget.budget_bytes):
        return None
    adv = shm_advice(w, pf, batch, budget)
    reason = (f"not run: {w} worker(s) x prefetch {pf or 2} keep {live_batches(w, pf)} batches "
              f"of {_mib(batch.total)} in /dev/shm, {_mib(needed_bytes(w, pf, batch.total))} "
              f"with margin (x{MARGIN:g} + {SLACK_BYTES // 2**20} MiB), over the "
              f"{_mib(budget.budget_bytes)} this rank may use ({budget.source})")
    fixes = [f"docker run {adv.docker} (Kubernetes: an emptyDir with medium: Memory and "
             f"sizeLimit: {adv.k8s_size_limit} at /dev/shm)", "--workers 0 (no shared memory)"]
    if adv.uint8_batch_bytes is not None:
        fixes.append(f"uint8 batches ({_mib(adv.uint8_batch_bytes)}: "
                     + ("this configuration fits" if adv.uint8_fits else
                        f"{adv.uint8_live_batches} live batches fit" if adv.uint8_live_batches
                        else "still too large for workers") + ")")
    return _refused(dataset, cfg, reason, "; or ".join(fixes), "shm",
                    {"batch_bytes": batch.total, "float32_bytes": batch.float32,
                     "budget": budget.to_dict(), "advice": adv.to_dict()})


def _refused(dataset: Any, cfg: Any, reason: str, hint: str, kind: str,
             fit: dict) -> BenchResult:
    res = BenchResult(dataset={"path": str(dataset), "format": cfg.format},
                      config={**cfg.to_dict(), "label": cfg.describe()}, failed=True,
                      reason=reason, hint=hint, failure_kind=kind, cold=cfg.cold)
    if fit:
        res.system = {"shm_fit": fit}
    return res


__all__ = ["refusal"]
