"""Compute-bound (healthy): AU at or above AU_HEALTHY, the input keeps up."""

from __future__ import annotations

from autotune.thresholds import AU_HEALTHY
from autotune.verdict._types import Verdict
from autotune.verdict.rules._case import Case, JobRule


class Healthy(JobRule):
    name = "healthy"

    def applies(self, case: Case) -> bool:
        return case.inp.au is not None and case.inp.au >= AU_HEALTHY

    def conclude(self, case: Case) -> Verdict:
        au = case.inp.au
        adv = ["nothing to fix in the input pipeline; a faster step (GPU, AMP, larger batch) "
               "would raise throughput until the input becomes the limit: the search at half "
               "the step time shows whether the pipeline would keep up"]
        if case.starved_gpu:
            adv.insert(0, f"the input keeps up but the GPU is busy only {case.gpu:.0f} %: the step "
                          "itself leaves the GPU idle (CPU work, synchronisation, small batch)")
        return Verdict("compute", f"compute-bound (healthy): AU {au:.0%} >= {AU_HEALTHY:.0%}, "
                       "the training step is the limit and the input pipeline keeps up",
                       case.evidence, case.cmd["search_half"], adv)
