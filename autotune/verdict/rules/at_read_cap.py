"""At a read cap: the job's reads reach the read cap its own cgroup puts on the disk (a
container's `--device-read-iops` or `--device-read-bps`, a systemd unit's `IOReadIOPSMax=`,
cgroup v2 `io.max`): storage, whatever the loaders' time budget says. The cap is a limit
set by configuration, not a figure measured from the job. Read before the budget's rules:
behind a cap a worker can spend most of its time decoding while each read it issues waits
its turn (one CI run: the worker on a CPU 67 %, blocked 21 %, 61 reads/s charged of a cap
of 60), and more workers or more prefetch would only queue more reads behind it."""

from __future__ import annotations

from autotune.verdict._types import Verdict
from autotune.verdict.rules._case import Case, JobRule, storage_verdict
from autotune.verdict.rules._inputs import pct


class AtReadCap(JobRule):
    name = "at a read cap"
    from_budget = True      # the stage budget and the ceilings are said beside it

    def applies(self, case: Case) -> bool:
        case.load           # reads the ceilings (the cap among them) on first use
        return bool(case.at.get("cap"))

    def conclude(self, case: Case) -> Verdict:
        load = case.load
        seen = "" if load is None else (
            f"; {load.who} {load.verb} blocked on storage {pct(load.blocked)} of "
            f"{load.whose} time (on a CPU or runnable {pct(load.cpu)}, idle {pct(load.idle)})")
        v = storage_verdict(case, f"(a read cap): the job reads {case.at['cap']}; more "
                            f"workers or prefetch only queue more reads behind it{seen}")
        how = ("under a bytes/s cap, shards read the same bytes: a conversion on the capped "
               "disk does not help; convert or stage them onto a disk the cap does not cover "
               "(LOCAL_DISK)" if case.at.get("cap_bytes") else
               "under a reads/s cap, shards (`autotune convert`) read the same bytes in "
               "fewer, larger reads")
        v.advice.insert(0, "the cap is the container's or cgroup's setting (docker "
                           "--device-read-iops / --device-read-bps, io.max): raise it where it "
                           f"is set; {how}")
        return v
