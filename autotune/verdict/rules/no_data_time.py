"""Unknown: the log gives no data time (no AU) and no starved GPU says input-bound."""

from __future__ import annotations

from autotune.verdict._types import Verdict
from autotune.verdict.rules._case import Case, JobRule


class NoDataTime(JobRule):
    name = "no data time"

    def applies(self, case: Case) -> bool:
        return case.inp.au is None and not case.starved_gpu   # a starved GPU alone says input-bound

    def conclude(self, case: Case) -> Verdict:
        return Verdict("unknown", "unknown: the log gives no data time, so AU cannot be "
                       "computed" + ("" if case.gpu is not None else ", and no GPU was sampled"),
                       case.evidence, case.cmd["monitor"],
                       ["wrap the loader with autotune.instrument(loader) and run the job "
                        "under `autotune monitor`"])
