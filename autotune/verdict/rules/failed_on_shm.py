"""Loader (/dev/shm): the job died in its start-up because its workers' batches did not
fit in /dev/shm.

Only where every step it logged was within the warm-up: those are start-up, not the job
at work, and no rule of the time budget is read from them (nor a step time for the next
search). A job that trained a while before it died keeps the verdict of its steps, with
the failure and its cause said beside it (autotune.analyze.runinfo)."""

from __future__ import annotations

from autotune.verdict._types import Verdict
from autotune.verdict.rules._case import Case, FailureRule


class FailedOnShm(FailureRule):
    name = "failed on /dev/shm"
    failure = "shm_failure"

    def conclude(self, case: Case) -> Verdict:
        self.seen(case, "/dev/shm")
        return Verdict(
            "loader", "loader-configuration-bound (/dev/shm): the job failed because its "
            "DataLoader workers' batches did not fit in /dev/shm (workers x prefetch_factor "
            "+ 1 batches live there at once)", case.evidence, case.cmd["search"],
            ["give /dev/shm room for those batches (docker run --shm-size; in Kubernetes an "
             "emptyDir with medium: Memory and a sizeLimit), or lower num_workers, "
             "prefetch_factor or the batch size; `autotune search` in the same container "
             "measures a batch, runs only what fits and names the size that runs the rest"])
