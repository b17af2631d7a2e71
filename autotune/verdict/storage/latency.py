"""Latency-bound: the replay's rate at its best concurrency is more than twice its rate
at one read in flight; the advice names the reads in flight the storage needs."""

from __future__ import annotations

from autotune.verdict.storage._case import StorageCase, StorageRule


class LatencyBound(StorageRule):
    name = "latency-bound"

    def applies(self, case: StorageCase) -> bool:
        rp = case.rp
        if rp is None:
            return False
        one = next((lv for lv in rp.by_concurrency if lv.concurrency == 1), None)
        best = rp.best
        return one is not None and best.concurrency > 1 and best.files_per_s > 2 * one.files_per_s

    def conclude(self, case: StorageCase) -> None:
        rp = case.rp
        assert rp is not None
        best = rp.best
        one = next(lv for lv in rp.by_concurrency if lv.concurrency == 1)
        case.evidence.append(f"latency-bound: {one.files_per_s:,.0f} files/s at concurrency 1 "
                             f"grows to {best.files_per_s:,.0f} at {best.concurrency}")
        case.advice.append(f"this storage needs about {best.concurrency} reads in flight: use at "
                           f"least {min(best.concurrency, 16)} DataLoader workers, or convert "
                           "to shards (`autotune convert`) so each read is large")
