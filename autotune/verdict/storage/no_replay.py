"""No replay, only fio's figures: the ceiling in files/s is unknown."""

from __future__ import annotations

from autotune.verdict.storage._case import StorageCase, StorageRule


class NoReplay(StorageRule):
    name = "no replay"

    def applies(self, case: StorageCase) -> bool:
        return case.ceiling is None and case.fio_plausible and case.rp is None

    def conclude(self, case: StorageCase) -> None:
        case.evidence.append("no replay: the ceiling in files/s is unknown (only fio's figures)")
