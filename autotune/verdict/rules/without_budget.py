"""Input-bound without the time budget: a ceiling measured apart that the job reaches
still decides (storage, then decode); else unknown, naming what is missing."""

from __future__ import annotations

from autotune.verdict._types import Verdict
from autotune.verdict.rules._case import DECODE_ADVICE, Case, JobRule, storage_verdict
from autotune.verdict.rules._inputs import pct


class WithoutBudget(JobRule):
    name = "without the time budget"

    def applies(self, case: Case) -> bool:
        return case.load is None

    def conclude(self, case: Case) -> Verdict:
        inp, ev, cmd, at = case.inp, case.evidence, case.cmd, case.at
        ev.append(f"input-bound: the step waits for its data {pct(inp.data_share)} of the time; "
                  "without the time budget storage, decode and loader settings look the same: "
                  f"`{cmd['monitor']}` tells them apart")
        ev.append(f"time budget: missing ({case.missing})")
        if at["storage"]:
            return storage_verdict(case, ": " + at["storage"])
        if at["decode"]:
            return Verdict("decode", "decode-bound (CPU): at the decode ceiling measured apart "
                           f"while the step waits {pct(inp.data_share)} of the time", ev,
                           cmd["search"], DECODE_ADVICE)
        workers = (inp.loader or {}).get("num_workers")
        hint = (["num_workers=0 in the step log: the main process loads every batch; "
                 "`autotune search` finds how many workers it needs"] if workers == 0 else [])
        return Verdict("unknown", f"unknown: input-bound (data wait {pct(inp.data_share)}), but "
                       f"the time budget is missing: {case.missing}", ev, cmd["monitor"],
                       hint + ["run the job under `autotune monitor` (or pass --metrics "
                               "metrics.jsonl of a monitor that records the time budget)"
                               + ("" if inp.probe is not None else
                                  ", and `autotune probe` for the storage ceiling")])
