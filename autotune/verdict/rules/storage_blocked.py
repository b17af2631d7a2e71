"""Storage-bound or loader (latency): the loaders are mostly blocked on storage. Throughput
unless more reads in flight raise the rate (the probe's by-concurrency figures, or the
storage ceiling's concurrency); then the latency rule (bounds.latency_verdict): loader
(latency) when the reads in flight it takes fit the worker bound, storage (latency) when
they do not."""

from __future__ import annotations

from autotune.verdict._types import Verdict
from autotune.verdict.bounds import latency_verdict
from autotune.verdict.rules._case import BudgetRule, Case, storage_verdict, worker_bound_of
from autotune.verdict.rules._ceilings import levels, storage_ceiling
from autotune.verdict.rules._inputs import RuleInputs, commands, num, pct
from autotune.verdict.rules._load import Load

LATENCY_GAIN = 1.25       # more reads in flight "raise the rate": by at least this factor
NEAR_BEST = 0.90          # the reads in flight that reach this share of the best rate


class StorageBlocked(BudgetRule):
    name = "blocked on storage"
    state = "blocked"

    def conclude(self, case: Case) -> Verdict:
        inp, load, ev = case.inp, case.loaded, case.evidence
        kind, need, rate, unit, line = _storage_kind(inp, load)
        ev.append(line)
        head = (f"{load.who} {load.verb} blocked on storage "
                f"{pct(load.blocked)} of {load.whose} time (on a CPU "
                f"or runnable {pct(load.cpu)}, idle {pct(load.idle)})")
        if load.read_cpu:
            head = (f"{load.who} {load.verb} reading {pct(load.blocked + load.read_cpu)} of "
                    f"{load.whose} time (blocked on storage {pct(load.blocked)}, the storage "
                    f"client on a CPU or runnable {pct(load.read_cpu)}; on a CPU or runnable "
                    f"elsewhere {pct(load.cpu - load.read_cpu)}, idle {pct(load.idle)})")
        if kind == "latency" and need:
            bound, why = worker_bound_of(inp, load)
            ev.append(why)
            call = latency_verdict(need, bound, rate=rate, unit=unit, in_flight=load.procs)
            if call.within_bound:
                return Verdict("loader", f"loader-configuration-bound (latency): {head} while the "
                               f"step waits {pct(inp.data_share)} of the time; {call.reason}", ev,
                               case.cmd["search"],
                               [f"use at least {need} reads in flight (num_workers={need}), or "
                                "convert to shards (`autotune convert`) so each read is large"])
            return storage_verdict(case, f"(latency): {head}; {call.reason}"
                                   + _at_bound(inp, bound))
        label = "(throughput)" if kind == "throughput" else "(throughput or latency: not measured)"
        return storage_verdict(case, f"{label}: {head}")


def _storage_kind(inp: RuleInputs, load: Load) -> tuple[str | None, int | None, float | None, str, str]:
    """(throughput | latency | None, reads in flight needed, rate, unit, evidence line):
    latency when more reads in flight than the job has raise the rate."""
    now_c = max(1, load.procs)
    pts, unit = ([], "files/s") if inp.storage_overtaken else levels(inp.probe)
    if len(pts) >= 2:
        best_c, best = max(pts, key=lambda p: p[1])
        at_now = [p for p in pts if p[0] <= now_c]
        c0, r0 = at_now[-1] if at_now else pts[0]
        if best_c > now_c and best >= LATENCY_GAIN * r0:
            need = min((c for c, r in pts if r >= NEAR_BEST * best and c > now_c), default=best_c)
            return "latency", need, best, unit, (
                f"the probe: {r0:,.0f} {unit} at {c0} read(s) in flight, {best:,.0f} at {best_c}: "
                f"more reads in flight raise the rate (latency); {need} reach {NEAR_BEST:.0%} of it")
        return "throughput", None, best, unit, (
            f"the probe: {r0:,.0f} {unit} at {c0} read(s) in flight, at best {best:,.0f} at "
            f"{best_c}: more reads in flight do not raise the rate (throughput)")
    storage, _, conc, unit = storage_ceiling(inp)
    if inp.storage_overtaken and not inp.storage_ceiling:
        conc = None                 # the set-aside probe's concurrency is no figure either
    if conc:
        if conc > now_c:
            return "latency", int(conc), storage, unit, (
                f"the storage ceiling ({num(storage)} {unit}) comes with {conc} reads in "
                f"flight, more than the job's {now_c}: latency")
        return "throughput", None, storage, unit, (
            f"the storage ceiling ({num(storage)} {unit}) comes with {conc} reads in flight, "
            f"no more than the job's {now_c}: throughput")
    why = "the probe's figure was overtaken (set aside)" if inp.storage_overtaken else \
        f"no probe by-concurrency figures: `{commands(inp)['probe']}` and --probe tell"
    return None, None, None, unit, f"throughput or latency: not measured ({why})"


def _at_bound(inp: RuleInputs, bound: int) -> str:
    """What the storage gives at the worker bound, beside the step's demand: the probe's
    rate at its most reads in flight within the bound, scaled up to the bound (while
    latency limits, the rate grows at most in proportion to the reads in flight)."""
    pts, unit = levels(inp.probe)
    within = [p for p in pts if p[0] <= bound]
    if not within:
        return ""
    c, r = within[-1]
    most = r * bound / c
    demand = (inp.batch_size / inp.step_time_s if inp.batch_size and inp.step_time_s
              else None)
    scaled = f", scaled by {bound}/{c}" if c != bound else ""
    vs = (f", {'below' if most < demand else 'not below'} the step's demand of "
          f"{demand:,.0f}" if demand else "")
    return (f"; at the {bound}-worker bound the storage gives at most {most:,.0f} {unit} "
            f"({r:,.0f} at {c} in flight{scaled}){vs}")
