"""At a CPU quota: the job's cgroup CPU quota (a container's `--cpus`, Kubernetes
resources.limits.cpu, a systemd unit's CPUQuota=; v1 `cpu.cfs_quota_us`, v2 `cpu.max`) ran
out in most of its periods (cgroup `cpu.stat`: nr_throttled of nr_periods) while the job's
processes waited for a CPU: the quota, not the loader or the machine, holds the job back.
The quota is a limit set by configuration, not a figure measured from the job. Read before
the budget's rules: behind a quota the kernel stops every task of the cgroup to the end of
each period, and schedstat counts that stop as run-queue wait, so the main process reads
"runnable 145 %" with the machine's cores idle and the budget's rules blamed the main
process (one run: 0.5 CPU for 2 decoding workers, its quota throttled in most periods)."""

from __future__ import annotations

import math

from autotune.thresholds import QUOTA_THROTTLED
from autotune.verdict._types import Verdict
from autotune.verdict.rules._case import Case, JobRule
from autotune.verdict.rules._inputs import pct

WAITING = 0.10    # the job's tasks runnable this share of a CPU: they waited on the quota


class AtCpuQuota(JobRule):
    name = "at a CPU quota"
    from_budget = True      # the stage budget and the ceilings are said beside it

    def applies(self, case: Case) -> bool:
        case.load           # reads the ceilings (the quota among them) on first use
        if not case.at.get("quota"):
            return False
        waited = _waiting(case)
        return waited is None or waited >= WAITING

    def conclude(self, case: Case) -> Verdict:
        q, inp, ev = case.at["quota"], case.inp, case.evidence
        cores = float(q["cores"])
        who, wanted = _who_waited(case)
        v = Verdict("decode", f"decode-bound (a CPU quota): the job's cgroup allows {cores:g} "
                    f"CPU ({q.get('quota_file')}) and was throttled in "
                    f"{pct(q['throttled_share'])} of periods (stopped {q['throttled_s']:,.1f} s); "
                    f"{who} while the step waits {pct(inp.data_share)} of the time",
                    ev, case.cmd["search"], _advice(cores, wanted, inp.loader))
        ev.append(f"the quota ran out in at least {QUOTA_THROTTLED:.0%} of its periods: "
                  "every task of the cgroup waits for the next period, whatever the "
                  "machine's cores do")
        return v


def _waiting(case: Case) -> float | None:
    """The job's tasks' run-queue wait in CPUs (the time budget's, else the monitor's
    schedstat figure); None when neither was measured."""
    b = case.budget
    if b is not None and b.wall_s > 0 and b.classes:
        return b.cpus("runnable")
    s = case.inp.system
    med = None if s is None or s.sched_run_wait_pct is None else s.sched_run_wait_pct["median"]
    return None if med is None else med / 100.0


def _who_waited(case: Case) -> tuple[str, float | None]:
    """Which processes waited for a CPU and how long ("the 2 workers runnable 60 % of
    their time, the main process 145 %"), and the CPUs the job wanted (on a CPU +
    runnable; None without a budget)."""
    b = case.budget
    if b is None or b.wall_s <= 0:
        return "the job's tasks waited for a CPU (run-queue wait)", None
    parts = []
    w, m = b.cls("workers"), b.cls("main")
    if w is not None:
        n = w.at_once(b.wall_s)
        parts.append(f"the {n} worker{'s' if n != 1 else ''} runnable {pct(w.share('runnable'))} "
                     f"of {'their' if n != 1 else 'its'} time")
    if m is not None:
        parts.append(f"the main process {pct(m.share('runnable'))} of its time")
    wanted = b.cpus("on_cpu", "runnable")
    return (f"waiting for a CPU: {', '.join(parts)} (the job wanted {wanted:.1f} CPU)"
            if parts else "its tasks waited for a CPU"), wanted


def _advice(cores: float, wanted: float | None, loader: dict | None) -> list[str]:
    more = f"--cpus {math.ceil(wanted)}" if wanted and wanted > cores else "--cpus N"
    workers = (loader or {}).get("num_workers")
    fit = max(1, math.floor(cores + 1e-6))
    fewer = (f"or fewer workers: {workers} worker(s) and the main process take turns in "
             f"{cores:g} CPU" if isinstance(workers, int) and workers > fit else
             "or fewer workers")
    return [f"the quota is the container's or cgroup's setting: raise it where it is set "
            f"(`docker run {more}`, Kubernetes resources.limits.cpu, a systemd unit's "
            "CPUQuota=, cgroup v2 cpu.max, v1 cpu.cfs_quota_us)",
            f"{fewer}; about {fit} fit(s) the quota, and `autotune search` finds the knee "
            "under it",
            "a lighter pipeline gets more from the same quota (smaller stored images: "
            "`autotune convert --max-side`; the preset `resnet50-fast`)"]


__all__ = ["AtCpuQuota"]
