"""Loader (open files): the job died in its start-up because its DataLoader's batches ran
past the open-files limit (`ulimit -n`).

With torch's default sharing strategy each tensor of a batch in flight is an open file, in
the worker that made it and in the training process that takes it: a batch of many
tensors (a target per object, a list a sample) under a container's soft limit of 1024
fails with "received 0 items of ancdata" or "Too many open files". As failed_on_shm: only
where every step logged was within the warm-up, and the job's own log must name it; a job
that trained a while first keeps the verdict of its steps, the cause said beside it
(autotune.analyze.runinfo)."""

from __future__ import annotations

from autotune.verdict._types import Verdict
from autotune.verdict.rules._case import Case, FailureRule


class FailedOnFiles(FailureRule):
    name = "failed on the open-files limit"
    failure = "files_failure"

    def conclude(self, case: Case) -> Verdict:
        files = self.seen(case, "the open-files limit")
        return Verdict(
            "loader", "loader-configuration-bound (open files): the job failed because its "
            "DataLoader's batches in flight ran past the open-files limit (ulimit -n; each "
            "tensor of a batch a worker hands over is an open file)", case.evidence,
            case.cmd["search"],
            [f"{files.get('fix') or _FIX}; autotune.DataLoader keeps the workers it "
             "starts within the limit"])


# Where the cause carries no fix of its own (the job's limits not read).
_FIX = ("raise the job's open-files limit (`ulimit -n 65536` in the shell that starts it, "
        "where its hard limit allows; else docker run --ulimit nofile=65536:65536 or "
        "LimitNOFILE=), or lower num_workers or prefetch_factor, or call "
        "torch.multiprocessing.set_sharing_strategy('file_system') at start-up")
