"""The rules of the job's verdict: what holds a job back, with the figures that show it.

One engine for a training log (`analyze`), for the search's recommended configuration
(`search`) and for the in-loop tuner. It decides from where the loading processes' time
went (the time budget: autotune.monitor.timebudget, in SystemFigures.budget), comparing
the states with each other rather than one share with a fixed line, so that a worker busy
27 % instead of 25 % cannot flip the answer. One module per rule (autotune.verdict._base:
what a rule is), read in the order of RULES; the first that applies decides:

  failed_on_shm    the job failed in its warm-up, /dev/shm the likely cause: loader
                   (/dev/shm)
  failed_on_files  the job failed in its warm-up, the open-files limit the likely cause:
                   loader (open files)
  no_data_time     no AU and no starved GPU (the GPU rule: busy under 40 % says
                   input-bound when the log gives no data time): unknown
  healthy          AU >= 0.90: compute-bound, the input keeps up
  at_read_cap      the job's reads reach its cgroup's read cap on the disk: storage
  at_cpu_quota     the job's cgroup CPU quota ran out in most periods (cpu.stat) while
                   its tasks waited for a CPU: decode (a CPU quota)
  without_budget   input-bound without the time budget: a ceiling measured apart that is
                   reached decides (storage, decode); else unknown, naming the missing
                   figure and the command that gives it
  then the loading class (the workers; the main process when num_workers=0, its step's
  time taken out) by its dominant state:
  storage_blocked  blocked on storage (io + storage_wait): storage, or loader (latency)
  on_cpu           on a CPU or runnable: decode, or loader (too few workers)
  timer_waits      idle, asleep in a timer: loader (waits inside the dataset)
  main_process     idle otherwise: loader (main process)
After a rule of the time budget, the ceilings measured apart (the probe's or the search's
storage ceiling, the decode ceiling) confirm or contradict it in the evidence (_case).
"""

from __future__ import annotations

from autotune.verdict._base import first
from autotune.verdict._types import Verdict
from autotune.verdict.bounds import latency_verdict, worker_bound
from autotune.verdict.rules._case import Case, JobRule
from autotune.verdict.rules._inputs import RuleInputs
from autotune.verdict.rules._load import budget_of
from autotune.verdict.rules.at_cpu_quota import AtCpuQuota
from autotune.verdict.rules.at_read_cap import AtReadCap
from autotune.verdict.rules.failed_on_files import FailedOnFiles
from autotune.verdict.rules.failed_on_shm import FailedOnShm
from autotune.verdict.rules.healthy import Healthy
from autotune.verdict.rules.main_process import MainProcess
from autotune.verdict.rules.no_data_time import NoDataTime
from autotune.verdict.rules.on_cpu import OnCpu
from autotune.verdict.rules.storage_blocked import StorageBlocked
from autotune.verdict.rules.timer_waits import TimerWaits
from autotune.verdict.rules.without_budget import WithoutBudget

# The order the rules are read in: the first that applies decides.
RULES: tuple[JobRule, ...] = (FailedOnShm(), FailedOnFiles(), NoDataTime(), Healthy(),
                              AtReadCap(), AtCpuQuota(), WithoutBudget(), StorageBlocked(),
                              OnCpu(), TimerWaits(), MainProcess())


def decide(inp: RuleInputs) -> Verdict:
    """The verdict, its evidence lines and the next command."""
    case = Case.of(inp)
    rule, v = first(RULES, case)
    if rule.from_budget:
        case.said_beside(v)
    return v


__all__ = ["RULES", "RuleInputs", "budget_of", "decide", "latency_verdict", "worker_bound"]
