"""fio's figures failed the plausibility check (page cache, RAM): said, and left out."""

from __future__ import annotations

from autotune.verdict.storage._case import StorageCase, StorageRule


class FioIgnored(StorageRule):
    name = "fio implausible"

    def applies(self, case: StorageCase) -> bool:
        return case.fio is not None and not case.fio.plausible

    def conclude(self, case: StorageCase) -> None:
        assert case.fio is not None
        case.evidence.append("fio figures failed the plausibility check and are ignored: "
                             + "; ".join(case.fio.warnings))
