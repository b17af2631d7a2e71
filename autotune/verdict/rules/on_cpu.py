"""On a CPU: the loaders are mostly on a CPU or runnable. num_workers=0: loader (too few
workers: 0). The usable cores full with the job's own demand (as many loaders as cores,
or the job's tasks want CPU_SATURATED of the cores): decode. Else loader (too few
workers): a neighbour's load does not make the cores full, the scheduler shares them per
task, so more workers get more."""

from __future__ import annotations

from autotune.monitor.figures import SystemFigures
from autotune.monitor.timebudget import TimeBudget
from autotune.thresholds import CPU_SATURATED
from autotune.verdict._types import Verdict
from autotune.verdict.rules._case import DECODE_ADVICE, BudgetRule, Case, worker_bound_of
from autotune.verdict.rules._inputs import RuleInputs, num, pct, usable_cores

# In the summary of this rule's loader verdicts, which more workers would help (read by
# autotune.DataLoader, which adds where no more fit its /dev/shm or memory).
TOO_FEW_WORKERS = "too few workers"


class OnCpu(BudgetRule):
    name = "on a CPU"
    state = "cpu"

    def conclude(self, case: Case) -> Verdict:
        inp, load, ev, cmd = case.inp, case.loaded, case.evidence, case.cmd
        cores, wanted, free = _cpu_line(inp, case.budget, ev)  # type: ignore[arg-type]
        head = (f"{load.who} {load.verb} on a CPU or runnable "
                f"{pct(load.cpu)} of {load.whose} time "
                f"(blocked {pct(load.blocked)}, idle {pct(load.idle)}){load.threads_note}")
        bound, _ = worker_bound_of(inp, load)
        if load.main_only:
            return Verdict("loader", f"loader-configuration-bound ({TOO_FEW_WORKERS}: 0): {head} "
                           f"while the step waits {pct(inp.data_share)} of the time; loading and "
                           "the step take turns", ev, cmd["search"],
                           [f"set num_workers (up to about {bound}): workers load while the step "
                            "runs; `autotune search` finds the knee"])
        # Full with the job's own demand: a neighbour that fills the machine does not make
        # them full for the job (the scheduler shares the cores per task: more workers, more
        # CPU), while as many busy loaders as cores, or the job's tasks wanting nearly all of
        # them, do (another worker would only take turns with these).
        full = (cores is None or (load.procs or 0) >= cores
                or wanted >= CPU_SATURATED * cores)
        if full:
            return Verdict("decode", f"decode-bound (CPU): {head} and the usable cores are full "
                           f"({wanted:.1f} wanted of {_shown(inp, cores)}) while the step waits "
                           f"{pct(inp.data_share)} of the time", ev, cmd["search"], DECODE_ADVICE)
        others = (f"; other processes hold {cores - wanted - free:.1f} of the rest, and more "
                  "workers get more of it" if free is not None and cores - wanted - free >= 0.25
                  else "")
        return Verdict("loader", f"loader-configuration-bound: {head}; the job wants {wanted:.1f} "
                       f"of {cores} core(s){others} while the step waits {pct(inp.data_share)} "
                       f"of the time: {TOO_FEW_WORKERS}", ev, cmd["search"],
                       [f"raise num_workers (up to about {min(bound, cores or bound)}), and "
                        "prefetch_factor if batches arrive unevenly; `autotune search` finds the knee"])


def _cpu_line(inp: RuleInputs, b: TimeBudget, ev: list[str]) -> tuple[int | None, float, float | None]:
    """(usable cores, cores the job wants, cores free), with the evidence line."""
    s = inp.system
    cores = usable_cores(inp)
    wanted = b.cpus("on_cpu", "runnable")
    pct = None
    if s is not None:
        pct = SystemFigures.med(s.job_cpus_busy_pct) if s.job_cpus_busy_pct is not None \
            else SystemFigures.med(s.cpu_total_pct)
    used = max(wanted, (pct or 0.0) / 100.0 * cores) if cores else wanted
    free = max(0.0, cores - used) if cores else None
    ev.append(f"CPU: the job's processes want {wanted:.2f} core(s) (on a CPU + runnable) of "
              f"{_shown(inp, cores)} usable; the CPUs are {num(pct)} % busy; "
              f"{num(free, '{:.1f}')} core(s) free")
    return cores, wanted, free


def _shown(inp: RuleInputs, cores: int | None) -> str:
    """The usable cores as the header says them: a quota's fractional figure (1.5), where
    the sums use whole cores."""
    if inp.job_cores and abs(inp.job_cores - (cores or 0)) > 1e-6:
        return f"{inp.job_cores:g}"
    return str(cores or "?")
