"""The case the job's rules judge: its figures, the next commands, the evidence gathered
so far and, read on first use, the time budget of its loading; what several rules
conclude alike (storage-bound, decode advice, the worker bound); and what is said beside
a verdict the time budget gave (the stage budget, the ceilings measured apart)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from autotune.monitor.timebudget import TimeBudget
from autotune.thresholds import AU_HEALTHY
from autotune.verdict._base import Rule
from autotune.verdict._types import Verdict
from autotune.verdict.bounds import worker_bound
from autotune.verdict.rules._ceilings import ceilings, confirm
from autotune.verdict.rules._inputs import (GPU_STARVED_PCT, RuleInputs, commands, gpu_busy,
                                            num, pct, usable_cores)
from autotune.verdict.rules._load import Load, budget_of, hidden_read_wait, loading


@dataclass
class Case:
    """One job's figures as the rules see them. `load` (the loading processes' time
    budget) is read on first use, after the rules that need no budget: its evidence
    lines (the ceilings, the budget) follow the headline's, as a verdict reads them."""

    inp: RuleInputs
    cmd: dict[str, str]
    evidence: list[str]
    gpu: float | None
    budget: TimeBudget | None = None
    missing: str = ""                     # what the budget lacks, when there is none
    at: dict[str, Any] = field(default_factory=dict)   # the ceilings reached
    _load: Load | None = None
    _read: bool = False

    @classmethod
    def of(cls, inp: RuleInputs) -> Case:
        return cls(inp, commands(inp), headline(inp), gpu_busy(inp))

    @property
    def starved_gpu(self) -> bool:
        return self.gpu is not None and self.gpu < GPU_STARVED_PCT

    @property
    def load(self) -> Load | None:
        """The loading class's budget; None (and `missing` says why) without one."""
        if not self._read:
            self._read = True
            self.budget, self.missing = budget_of(self.inp.system)
            self.at = ceilings(self.inp, self.evidence)
            if self.budget is not None:
                self._load, missing = loading(self.inp, self.budget, self.evidence)
                if self._load is None:
                    self.missing = missing
                else:
                    hidden_read_wait(self.inp, self._load, self.evidence)
        return self._load

    @property
    def loaded(self) -> Load:
        """The loading's budget, for the rules that apply only with one."""
        assert self.load is not None, "a rule of the time budget applied without one"
        return self.load

    def state(self) -> str | None:
        """The loading's dominant state (blocked, cpu, idle); None without a budget."""
        return None if self.load is None else self.load.dominant()

    def said_beside(self, v: Verdict) -> None:
        """After a verdict from the time budget: the stage budget, the ceilings apart."""
        stages(self.inp, v, self.evidence)
        confirm(v, self.at, self.evidence)


class JobRule(Rule[Case, Verdict]):
    """A rule of the job's verdict. `from_budget`: decided from the time budget (the
    stage budget and the ceilings measured apart are then said beside it)."""

    from_budget: ClassVar[bool] = False


def failed_in_start_up(failure: dict[str, Any] | None, warmup_only: bool,
                       loader: dict[str, Any] | None) -> bool:
    """Whether a job's failure (RuleInputs' shm_failure, files_failure) is its verdict (the
    run's warnings ask too): every step it logged was within the warm-up, its own log
    names the failure (a limit only seen nearly full may be another process's doing), and
    it had workers (without, no batch is handed over through /dev/shm or a file)."""
    return (warmup_only and bool((failure or {}).get("log_line"))
            and (loader or {}).get("num_workers") != 0)


class FailureRule(JobRule):
    """A failure in the job's start-up as its verdict: `failure` names the RuleInputs
    field that holds it (runinfo's cause: its log line, evidence and fix)."""

    failure: ClassVar[str] = ""

    def applies(self, case: Case) -> bool:
        inp = case.inp
        return failed_in_start_up(getattr(inp, self.failure), inp.warmup_only, inp.loader)

    def seen(self, case: Case, what: str) -> dict[str, Any]:
        """The failure, its evidence line added: "the job failed on `what`: ..."."""
        f = getattr(case.inp, self.failure) or {}
        case.evidence.append(f"the job failed on {what}: {f.get('evidence') or 'its log says so'}")
        return f


class BudgetRule(JobRule):
    """A rule of the time budget: it applies when the loading's dominant state is `state`."""

    from_budget = True
    state: ClassVar[str] = ""

    def applies(self, case: Case) -> bool:
        return case.state() == self.state


def headline(inp: RuleInputs) -> list[str]:
    """The first evidence lines of every verdict: the data wait, AU, the step, the GPU."""
    s = inp.system
    gpu = gpu_busy(inp)
    step_ms = num(None if inp.step_time_s is None else inp.step_time_s * 1000, "{:,.3g}")
    ev = [f"data wait {pct(inp.data_share)} of the time, AU {pct(inp.au)} "
          f"(input-bound below {AU_HEALTHY:.0%}); step {step_ms} ms (p50)"
          + (f"; {inp.images_per_s:,.0f} images/s" if inp.images_per_s else "")
          + f" over {inp.steps:,} steps"]
    if gpu is not None:
        ev.append(f"GPU busy {gpu:.0f} % (median over {s.samples} samples)"  # type: ignore[union-attr]
                  + (f" < {GPU_STARVED_PCT:.0f} %: starved" if gpu < GPU_STARVED_PCT else ""))
    return ev


def worker_bound_of(inp: RuleInputs, load: Load) -> tuple[int, str]:
    """The most workers (the search's bound, else bounds.worker_bound) and its line."""
    if inp.worker_bound is not None:
        return inp.worker_bound, f"the {inp.worker_bound}-worker bound of the search"
    cores = usable_cores(inp) or 1
    b = worker_bound(cores, blocked_share=min(load.blocked, 1.0))
    return b, (f"worker bound {b}: {cores} usable core(s), raised while the loaders are "
               f"blocked {pct(min(load.blocked, 1.0))} of their time (cores / (1 - blocked))")


def stages(inp: RuleInputs, v: Verdict, ev: list[str]) -> None:
    """The pipeline's own stage budget beside the kernel's: which stage the loaders' time
    went to, and for a CPU-bound pipeline, which part of it to make lighter."""
    from autotune.data.stages import stage_line

    line = stage_line(inp.stages)
    if line is None:
        return
    ev.append(f"pipeline stages (timed in the loading processes): {line}")
    if v.bottleneck != "decode":
        return
    sh = inp.stages["share"]  # type: ignore[index]
    top = max(("decode", "transform", "collate"), key=lambda k: sh[k])
    v.summary += f"; of the pipeline's time, {top} takes {sh[top]:.0%}"
    v.advice = [{
        "decode": "the decode itself is the cost: decoder simplejpeg, `draft: true` for JPEGs "
                  "larger than the crop (the preset's transform: `--preset resnet50-fast`, or "
                  "a YAML of your own; in your code ImagenetTrainTransform(fast=True)), or "
                  "smaller stored images (`autotune convert --max-side`)",
        "transform": "the transform costs more than the decode: `exact: false` (the same crops, "
                     "fewer copies: `--preset resnet50-fast` has it; in your code "
                     "ImagenetTrainTransform(fast=True)), or `output: uint8` and normalise "
                     "on the GPU (in a preset YAML of your own: every preset here is float32)",
        "collate": "collate is the cost: a uint8 output (a quarter of float32's bytes) or "
                   "smaller batches per worker"}[top], *v.advice]


DECODE_ADVICE = ["decode is the limit: more CPU cores (or fewer other processes), a lighter "
                 "pipeline (smaller stored images: `autotune convert --max-side`), or decode "
                 "on the GPU (NVIDIA DALI); storage conversion would not help"]


def storage_verdict(case: Case, why: str) -> Verdict:
    """Storage-bound, `why` naming the figures; its advice and next command. The probe
    is advised only when none was given: its ceiling is then already in the evidence."""
    inp, ev, cmd = case.inp, case.evidence, case.cmd
    probe = [] if inp.probe is not None else [f"measure the storage's ceiling: `{cmd['probe']}`"]
    return Verdict("storage", f"storage-bound {why}; the step waits "
                   f"{pct(inp.data_share)} of the time", ev, cmd["convert"],
                   [LOCAL_ADVICE,
                    f"or let the search convert, stage and measure the gain: "
                    f"`{cmd['search_convert']}`",
                    *probe])


# The storage verdict's advice: its next command's DST is on another disk than SRC.
LOCAL_ADVICE = ("convert the dataset to shards (`autotune convert`) onto a local NVMe or SSD "
                "(LOCAL_DISK: a folder there), or convert and stage them there (`autotune "
                "stage`): large sequential reads from a fast disk instead of small random ones "
                "from the slow one; shards beside SRC are read back from the same storage; "
                "more workers help only while the storage has headroom")


__all__ = ["DECODE_ADVICE", "LOCAL_ADVICE", "BudgetRule", "Case", "JobRule", "storage_verdict", "worker_bound_of"]
