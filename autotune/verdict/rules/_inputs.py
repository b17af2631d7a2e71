"""What the job's verdict is decided from (RuleInputs), the next commands it names, and
the figures' formatting every rule shares."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from autotune.monitor.figures import SystemFigures

GPU_STARVED_PCT = 40.0    # practitioners' rule: a GPU under 40 % busy is starved


@dataclass
class RuleInputs:
    """What the verdict is decided from (figures of the measured window)."""

    au: float | None
    data_share: float | None
    step_time_s: float | None         # p50 of the time in the step
    images_per_s: float | None
    batch_size: int | None
    steps: int
    loader: dict[str, Any] | None = None      # DataLoader settings (own log header)
    job_cores: float | None = None            # CPUs the job may use (own log header:
                                              # fractional under a CPU quota)
    system: SystemFigures | None = None       # its .budget: the time budget
    probe: dict[str, Any] | None = None
    dataset: str | None = None
    # Ceilings measured apart from these figures (the search's); None: the probe's, if any.
    storage_ceiling: float | None = None
    storage_overtaken: bool = False           # the probe's figure was beaten: not a ceiling
    storage_unit: str = "files/s"             # "samples/s" through a conversion's reader
    storage_concurrency: int | None = None    # reads in flight at the storage ceiling
    decode_ceiling: float | None = None
    worker_bound: int | None = None           # the most workers; None: bounds.worker_bound
    # autotune's own pipeline: where its time went by stage (autotune.data.stages), None
    # for a user's dataset (the time budget is its budget).
    stages: dict[str, Any] | None = None
    # What else names the job in a next `search` command: "--dataset-factory F.py:fn",
    # "--step M:fn", "--preset P" (a user's Dataset searched as a folder of images would
    # be another job). With --step, no --compute-ms is added.
    job_args: str = ""
    # The job failed and /dev/shm was the likely cause (autotune.analyze.runinfo.shm_cause).
    shm_failure: dict[str, Any] | None = None
    # The job failed and the open-files limit was the likely cause (runinfo.files_cause).
    files_failure: dict[str, Any] | None = None
    # Every step was within the warm-up: the step time is start-up, not the step's.
    warmup_only: bool = False
    # Why a next search must be --warm: the job's dataset is too small for its cold pass.
    warm_because: str | None = None


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def num(x: float | None, fmt: str = "{:,.0f}") -> str:
    return "-" if x is None else fmt.format(x)


def commands(inp: RuleInputs) -> dict[str, str]:
    """The next commands a verdict may name, for this job."""
    ds = shlex.quote(inp.dataset) if inp.dataset else "DATASET"
    ms = inp.step_time_s * 1000.0 if inp.step_time_s is not None and not inp.warmup_only \
        else None
    bs = f" --batch-size {inp.batch_size}" if inp.batch_size else ""
    step = f" --compute-ms {ms:.0f}" if ms is not None and ms >= 1 else (
        f" --compute-ms {ms:.1f}" if ms is not None else " --compute-ms MS")
    half = f" --compute-ms {ms / 2:.0f}" if ms is not None and ms >= 2 else step
    job = f" {inp.job_args.strip()}" if inp.job_args.strip() else ""
    if " --step " in f" {job} ":
        step = half = ""          # the user's own step, measured as it is
    # A dataset too small for a cold search at the job's batch size: the search would
    # refuse to run cold; the job's own epochs after its first read it warm too.
    if inp.warm_because:
        bs += " --warm"
    return {
        "search": f"autotune search {ds}{job}{step}{bs}",
        "search_half": f"autotune search {ds}{job}{half}{bs}",
        # DST on another disk than SRC's (LOCAL_DISK: a placeholder for a folder on a local
        # NVMe or SSD): shards beside SRC are read back from the same slow or capped disk,
        # and under a bytes/s cap they read the same bytes.
        "convert": f"autotune convert {ds} {shlex.quote('LOCAL_DISK/' + _name(inp) + '-wds')} "
                   "--format wds",
        "search_convert": f"autotune search {ds}{job}{step}{bs} --convert auto --stage-dir "
                          "LOCAL_DISK",
        "monitor": f"autotune monitor --data {ds} -- YOUR TRAINING COMMAND",
        "probe": f"autotune probe {ds} --json probe.json",
    }


def _name(inp: RuleInputs) -> str:
    """The dataset's folder name (its last path or prefix part), DATASET when unnamed."""
    tail = (inp.dataset or "").rstrip("/").rsplit("/", 1)[-1]
    return tail or "DATASET"


def gpu_busy(inp: RuleInputs) -> float | None:
    """The GPU's median busy percentage in the window, when sampled."""
    s = inp.system
    return SystemFigures.med(s.gpu_util_pct) if s is not None else None


def usable_cores(inp: RuleInputs) -> int | None:
    """The job's own CPUs (its affinity or quota, from the step log) when known: a job
    pinned to 2 of 64 cores is limited by those 2. Whole cores, for worker counts: a
    fractional quota rounds down, to at least 1 (autotune.cpus.CpuLimit.whole)."""
    s = inp.system
    job_cpus = SystemFigures.med(s.job_cpus) if s is not None else None
    whole = max(1, int(inp.job_cores + 1e-6)) if inp.job_cores else None
    return whole or (round(job_cpus) if job_cpus else None) or (s.cores if s else None)
