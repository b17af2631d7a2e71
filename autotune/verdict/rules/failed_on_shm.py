"""Loader (/dev/shm): the job died in its start-up because its workers' batches did not
fit in /dev/shm.

Only where every step it logged was within the warm-up: those are start-up, not the job
at work, and no rule of the time budget is read from them (nor a step time for the next
search). A job that trained a while before it died keeps the verdict of its steps, with
the failure and its cause said beside it (autotune.analyze.runinfo)."""

from __future__ import annotations

from typing import Any

from autotune.verdict._types import Verdict
from autotune.verdict.rules._case import Case, JobRule


def decides(shm_failure: dict[str, Any] | None, warmup_only: bool,
            loader: dict[str, Any] | None) -> bool:
    """Whether the /dev/shm failure is the verdict (the run's warnings ask too). The job's
    own log must name it: a /dev/shm seen nearly full may be another process's; and
    without workers no batch goes through /dev/shm at all."""
    return (warmup_only and bool((shm_failure or {}).get("log_line"))
            and (loader or {}).get("num_workers") != 0)


class FailedOnShm(JobRule):
    name = "failed on /dev/shm"

    def applies(self, case: Case) -> bool:
        inp = case.inp
        return decides(inp.shm_failure, inp.warmup_only, inp.loader)

    def conclude(self, case: Case) -> Verdict:
        shm = case.inp.shm_failure or {}
        case.evidence.append(f"the job failed on /dev/shm: {shm.get('evidence') or 'its log says so'}")
        return Verdict(
            "loader", "loader-configuration-bound (/dev/shm): the job failed because its "
            "DataLoader workers' batches did not fit in /dev/shm (workers x prefetch_factor "
            "+ 1 batches live there at once)", case.evidence, case.cmd["search"],
            ["give /dev/shm room for those batches (docker run --shm-size; in Kubernetes an "
             "emptyDir with medium: Memory and a sizeLimit), or lower num_workers, "
             "prefetch_factor or the batch size; `autotune search` in the same container "
             "measures a batch, runs only what fits and names the size that runs the rest"])
