"""A conversion read through its format's reader: its storage ceiling in samples/s, the
first line of the evidence."""

from __future__ import annotations

from autotune.verdict.storage._case import StorageCase, StorageRule


class SamplesCeiling(StorageRule):
    name = "samples through the reader"

    def applies(self, case: StorageCase) -> bool:
        return case.samples is not None and bool(case.samples.by_concurrency)

    def conclude(self, case: StorageCase) -> None:
        samples = case.samples
        assert samples is not None
        b = samples.best
        case.extra["storage_samples_per_s"] = round(b.samples_per_s, 1)
        case.extra["samples_best_concurrency"] = b.concurrency
        case.evidence.append(f"{samples.format} conversion read through its reader "
                             f"(bytes only, {samples.cold_method}): best "
                             f"{b.samples_per_s:,.0f} samples/s with {b.concurrency} "
                             "reader(s): its storage ceiling in samples, not files")
