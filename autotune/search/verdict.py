"""What holds the job back: storage, decode (CPU), compute (the step: healthy) or the
loader's configuration, with the figures that show it."""

from __future__ import annotations

from autotune.search.ceilings import Ceilings
from autotune.search.records import TrialRecord
from autotune.thresholds import AT_CEILING, AU_HEALTHY, CPU_SATURATED, DISK_BUSY_PCT
from autotune.verdict import Verdict


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def decide(rec: TrialRecord, best: TrialRecord, ceilings: Ceilings) -> Verdict:
    """The verdict for the recommended configuration `rec` (best: the fastest trial)."""
    ev: list[str] = []
    advice: list[str] = []
    ips = best.images_per_s or 0.0
    cores = ceilings.cores
    cpu_share = (rec.cpu_percent or 0.0) / (100.0 * cores) if rec.cpu_percent is not None else None
    util = rec.disk_util_pct
    ev.append(f"recommended {rec.images_per_s:,.0f} images/s, AU {_pct(rec.au)}, data wait "
              f"{_pct(rec.data_wait_fraction)}; best measured {ips:,.0f} images/s")
    ceil = ceilings.finite()
    for name, v in sorted(ceil.items(), key=lambda kv: kv[1]):
        ev.append(f"{name} ceiling {v:,.0f} images/s: best = {ips / v:.0%} of it")
    ev.append(f"CPU {_pct(cpu_share)} of {cores} core(s) (loader process tree)"
              + (f"; disk %util {util:.0f}" if util is not None else "; disk %util unavailable")
              + (f", r_await {rec.disk_r_await_ms:.1f} ms" if rec.disk_r_await_ms is not None else ""))

    if rec.au is not None and rec.au >= AU_HEALTHY:
        return Verdict("compute", f"compute-bound (healthy): AU {rec.au:.0%} >= {AU_HEALTHY:.0%}, "
                       "the training step is the limit, the input pipeline keeps up", ev,
                       advice=["nothing to fix in the input pipeline; a faster step (GPU, AMP, "
                        "larger batch) would raise throughput until a ceiling below is met"])

    io_ceils = {k: v for k, v in ceil.items() if k in ("storage", "decode")}
    lim = min(io_ceils, key=io_ceils.__getitem__) if io_ceils else None
    if lim is not None and ips >= AT_CEILING * io_ceils[lim]:
        return _named(lim, ips, io_ceils[lim], cpu_share, util, ev, advice)
    if cpu_share is not None and cpu_share >= CPU_SATURATED:
        return _named("decode", ips, ceil.get("decode"), cpu_share, util, ev, advice)
    if util is not None and util >= DISK_BUSY_PCT:
        return _named("storage", ips, ceil.get("storage"), cpu_share, util, ev, advice)
    smallest = ceilings.smallest()
    share = f"{ips / smallest[1]:.0%} of the {smallest[0]} ceiling" if smallest else "no ceiling"
    advice.append("try more workers or a deeper prefetch than the space allowed (--space), "
                  "or check for a slow step in the dataset's __getitem__")
    return Verdict("loader", f"loader-configuration-bound: best reaches only {share}, CPU "
                   f"{_pct(cpu_share)} and disk {'-' if util is None else f'{util:.0f} %'} busy: "
                   "the settings, not the hardware, hold it back", ev, advice=advice)


def _named(kind: str, ips: float, ceiling: float | None, cpu_share: float | None,
           util: float | None, ev: list[str], advice: list[str]) -> Verdict:
    c = f"{ceiling:,.0f}" if ceiling else "?"
    share = f" = {ips / ceiling:.0%} of the {kind} ceiling {c} images/s" if ceiling else ""
    if kind == "storage":
        advice.append("convert the dataset to shards (`autotune convert`) and stage them on "
                      "local NVMe (`autotune stage`): large sequential reads instead of small "
                      "random ones")
        summary = (f"storage-bound: best {ips:,.0f} images/s{share}; CPU {_pct(cpu_share)}"
                   + (f"; disk %util {util:.0f}" if util is not None else ""))
    else:
        advice.append("decode is the limit: more CPU cores, a lighter pipeline (smaller "
                      "stored images: `autotune convert --max-side`), or decode on the GPU "
                      "(NVIDIA DALI); storage conversion would not help")
        summary = f"decode-bound (CPU): best {ips:,.0f} images/s{share}; CPU {_pct(cpu_share)}"
    return Verdict(kind, summary, ev, advice=advice)
