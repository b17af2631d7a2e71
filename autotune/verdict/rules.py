"""The rules of the verdict: what holds a job back, with the figures that show it.

One engine for a training log (`analyze`) and for the search's recommended configuration
(`search`). It decides from what the job's processes showed while it ran (the monitor's
figures) and from ceilings measured apart from the figures it judges, never from them:

1. AU (time in the step / wall time) >= 0.90: compute-bound, the input keeps up.
2. Otherwise the job is input-bound, and the loader's processes say why (in this order):
   - it reads at >= 85 % of the storage ceiling (the probe's, or the search's samples/s
     through the format's reader): storage; at >= 85 % of the decode ceiling measured
     from memory with the CPUs busy: decode;
   - fewer loader processes than cores, limited by CPU (busy on a CPU: one core near
     100 % while others idle; or the machine is saturated and the dataset's disk reads
     nothing): loader configuration (too few workers: more of them get more CPU);
   - the job's processes use >= 85 % of the cores, or the machine's CPUs are saturated
     and the loaders are busy or the dataset's disk reads nothing (they wait for CPU):
     decode;
   - the loader processes are idle while the step waits: they wait on reads: storage (or,
     when the probe shows far more files/s with more reads in flight, loader: latency;
     but storage (latency) when those reads in flight are more than the workers the
     search may use: settings cannot hide the latency, larger sequential reads can);
     if the watched disk reads nothing meanwhile, unknown (wrong disk, or CPU-starved);
   - the disk is busy (%util >= 80): storage;
   - none of these: unknown, with the figures that leave it open.
The GPU rule (utilization under 40 %) backs an input-bound verdict when a GPU was sampled.
Loader CPU is bounded from both sides because the training step's own CPU is unknown:
the main process may burn at most AU x one core in its step.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from autotune.monitor.figures import SystemFigures
from autotune.thresholds import AT_CEILING, AU_HEALTHY, CPU_SATURATED, DISK_BUSY_PCT
from autotune.verdict._types import Verdict

GPU_STARVED_PCT = 40.0    # practitioners' rule: a GPU under 40 % busy is starved
CORE_PINNED_PCT = 85.0    # "one core near 100 %"
OTHERS_IDLE_PCT = 40.0    # "... while the others idle"
LOADER_BUSY = 0.60        # share of its time a loader process spends on a CPU
LOADER_BUSY_CONTENDED = 0.30   # ... when other work saturates the machine's CPUs
LOADER_IDLE = 0.25
AWAIT_HIGH_MS = 10.0      # r_await of a disk that makes each small read slow
PROBE_HEADROOM = 0.5      # reading < half the probe's ceiling: the storage could give more


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
    job_cores: int | None = None              # CPUs the job may use (own log header)
    system: SystemFigures | None = None
    probe: dict[str, Any] | None = None
    dataset: str | None = None
    # Ceilings measured apart from these figures (the search's); None: the probe's, if any.
    storage_ceiling: float | None = None
    storage_overtaken: bool = False           # the probe's figure was beaten: not a ceiling
    storage_unit: str = "files/s"             # "samples/s" through a conversion's reader
    storage_concurrency: int | None = None    # reads in flight at the storage ceiling
    decode_ceiling: float | None = None
    worker_bound: int | None = None           # the most workers the search may use


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _num(x: float | None, fmt: str = "{:,.0f}") -> str:
    return "-" if x is None else fmt.format(x)


def _commands(inp: RuleInputs) -> dict[str, str]:
    ds = shlex.quote(inp.dataset) if inp.dataset else "DATASET"
    ms = inp.step_time_s * 1000.0 if inp.step_time_s is not None else None
    bs = f" --batch-size {inp.batch_size}" if inp.batch_size else ""
    step = f" --compute-ms {ms:.0f}" if ms is not None and ms >= 1 else (
        f" --compute-ms {ms:.1f}" if ms is not None else " --compute-ms MS")
    half = f" --compute-ms {ms / 2:.0f}" if ms is not None and ms >= 2 else step
    return {
        "search": f"autotune search {ds}{step}{bs}",
        "search_half": f"autotune search {ds}{half}{bs}",
        "convert": (f"autotune convert {ds} {shlex.quote(inp.dataset.rstrip('/') + '-wds')} "
                    "--format wds" if inp.dataset else "autotune convert DATASET DATASET-wds --format wds"),
        "monitor": f"autotune monitor --data {ds} -- YOUR TRAINING COMMAND",
        "probe": f"autotune probe {ds} --json probe.json",
    }


def _loader_procs(inp: RuleInputs) -> tuple[int | None, str]:
    workers = (inp.loader or {}).get("num_workers")
    if isinstance(workers, int):
        return max(1, workers), (f"num_workers={workers} (from the step log)" if workers
                                 else "num_workers=0: the main process loads every batch")
    s = inp.system
    if s is not None and s.proc_processes is not None:
        n = max(1, round(s.proc_processes["median"]) - 1)
        return n, f"{n} loader process(es): {s.proc_processes['median']:.0f} processes in the job's tree"
    return None, "loader processes unknown"


def _probe_ceiling(probe: dict[str, Any] | None) -> tuple[float | None, float | None, int | None]:
    """(files/s ceiling of the replay, fio random-read IOPS, best concurrency) of a probe;
    a conversion's probe gives its samples/s through the format's reader instead."""
    if not probe:
        return None, None, None
    v = probe.get("verdict") or {}
    files = v.get("storage_samples_per_s") or v.get("storage_files_per_s")
    best_c = v.get("samples_best_concurrency") or v.get("best_concurrency")
    fio = probe.get("fio") or {}
    iops = (fio.get("rand_read") or {}).get("iops") if fio.get("plausible", True) else None
    return (float(files) if files else None, float(iops) if iops else None, best_c)


def _storage_ceiling(inp: RuleInputs) -> tuple[float | None, float | None, int | None, str]:
    """(ceiling, fio IOPS, reads in flight at the ceiling, unit): the one given, else the
    probe's."""
    files, iops, best_c = _probe_ceiling(inp.probe)
    if inp.storage_overtaken:   # a wrong measurement: nothing may be "at" it
        files = None
    if inp.storage_ceiling:
        return inp.storage_ceiling, iops, inp.storage_concurrency or best_c, inp.storage_unit
    unit = "samples/s" if (inp.probe or {}).get("verdict", {}).get("storage_samples_per_s") \
        else "files/s"
    return files, iops, best_c, unit


def decide(inp: RuleInputs) -> Verdict:
    """The verdict, its evidence lines and the next command."""
    cmd = _commands(inp)
    ev = _headline(inp)
    v = _compute(inp, ev, cmd)
    if v is not None:
        return v
    if inp.system is None:
        return _without_metrics(inp, ev, cmd)
    f = _signals(inp, ev)
    for rule in (_at_ceiling, _too_few_loaders, _cpu_bound, _waiting_on_reads):
        v = rule(inp, f, ev, cmd)
        if v is not None:
            return v
    if f.util is not None and f.util >= DISK_BUSY_PCT:
        return _storage(inp, ev, cmd, f"the disk is busy ({f.util:.0f} %util)")
    return Verdict("unknown", "unknown: input-bound, but neither CPU saturation, busy "
                   "loader processes nor a busy disk explains the wait (loader processes on a "
                   f"CPU {_pct(f.busy_lo)}-{_pct(f.busy_hi)} of the time)", ev, cmd["probe"],
                   ["probe the storage (`autotune probe`) and pass --probe probe.json; check "
                    "for locks or sleeps in the dataset's __getitem__"])


def _headline(inp: RuleInputs) -> list[str]:
    s = inp.system
    gpu = SystemFigures.med(s.gpu_util_pct) if s is not None else None
    step_ms = _num(None if inp.step_time_s is None else inp.step_time_s * 1000, "{:,.3g}")
    ev = [f"data wait {_pct(inp.data_share)} of the time, AU {_pct(inp.au)} "
          f"(input-bound below {AU_HEALTHY:.0%}); step {step_ms} ms (p50)"
          + (f"; {inp.images_per_s:,.0f} images/s" if inp.images_per_s else "")
          + f" over {inp.steps:,} steps"]
    if gpu is not None:
        ev.append(f"GPU busy {gpu:.0f} % (median over {s.samples} samples)"  # type: ignore[union-attr]
                  + (f" < {GPU_STARVED_PCT:.0f} %: starved" if gpu < GPU_STARVED_PCT else ""))
    return ev


def _compute(inp: RuleInputs, ev: list[str], cmd: dict[str, str]) -> Verdict | None:
    """Compute-bound (healthy), or unknown when nothing says input-bound."""
    s = inp.system
    gpu = SystemFigures.med(s.gpu_util_pct) if s is not None else None
    starved_gpu = gpu is not None and gpu < GPU_STARVED_PCT
    if inp.au is None and not starved_gpu:   # a starved GPU alone says input-bound
        return Verdict("unknown", "unknown: the log gives no data time, so AU cannot be "
                       "computed" + ("" if gpu is not None else ", and no GPU was sampled"),
                       ev, cmd["monitor"],
                       ["wrap the loader with autotune.instrument(loader) and run the job "
                        "under `autotune monitor`"])
    if inp.au is not None and inp.au >= AU_HEALTHY:
        adv = ["nothing to fix in the input pipeline; a faster step (GPU, AMP, larger batch) "
               "would raise throughput until the input becomes the limit: the search at half "
               "the step time shows whether the pipeline would keep up"]
        if starved_gpu:
            adv.insert(0, f"the input keeps up but the GPU is busy only {gpu:.0f} %: the step "
                          "itself leaves the GPU idle (CPU work, synchronisation, small batch)")
        return Verdict("compute", f"compute-bound (healthy): AU {inp.au:.0%} >= {AU_HEALTHY:.0%}, "
                       "the training step is the limit and the input pipeline keeps up",
                       ev, cmd["search_half"], adv)
    return None


def _without_metrics(inp: RuleInputs, ev: list[str], cmd: dict[str, str]) -> Verdict:
    ceiling, _, _, unit = _storage_ceiling(inp)
    if ceiling and inp.images_per_s and inp.images_per_s >= AT_CEILING * ceiling:
        ev.append(f"reads {inp.images_per_s:,.0f} images/s = "
                  f"{inp.images_per_s / ceiling:.0%} of the storage ceiling {ceiling:,.0f} "
                  f"{unit} (probe)")
        return _storage(inp, ev, cmd, "at the probe's storage ceiling")
    # The log alone shows the wait, not its cause: say so, and what would tell.
    ev.append(f"input-bound: the step waits for its data {_pct(inp.data_share)} of the "
              "time; without system metrics storage, decode and loader settings look the "
              f"same: `{cmd['monitor']}` tells them apart")
    workers = (inp.loader or {}).get("num_workers")
    hint = (["num_workers=0 in the step log: the main process loads every batch; "
             "`autotune search` finds how many workers it needs"] if workers == 0 else [])
    return Verdict("unknown", f"unknown: input-bound (data wait {_pct(inp.data_share)}), "
                   "but without system metrics storage, decode and loader settings cannot "
                   "be told apart", ev, cmd["monitor"],
                   hint + ["run the job under `autotune monitor` (or pass --metrics "
                           "metrics.jsonl), and `autotune probe` for the storage ceiling"])


@dataclass
class _Signals:
    """What the monitor's figures say about the job's processes (see _signals)."""

    cores: int | None
    tree_cores: float | None
    total: float | None
    busiest: float | None
    others: float | None
    procs: int | None
    workers: Any
    main_only: bool   # the main process loads (num_workers=0, or a one-process tree)
    wanted: float | None
    demand: float | None
    busy_lo: float | None
    busy_hi: float | None
    util: float | None
    await_ms: float | None
    rps: float | None
    machine_sat: bool
    job_cpu_bound: bool
    busy: bool
    idle: bool
    pinned: bool
    no_reads: bool
    cpu_starved: bool
    at_ceiling: bool
    headroom: bool
    storage: float | None
    storage_unit: str
    best_c: int | None


def _signals(inp: RuleInputs, ev: list[str]) -> _Signals:
    """The derived figures, each with its evidence line."""
    s = inp.system
    assert s is not None
    med = SystemFigures.med
    # The job's own CPUs (its affinity, from the step log) when known: a job pinned to 2 of
    # 64 cores is limited by those 2.
    job_cpus = med(s.job_cpus)
    cores = inp.job_cores or (round(job_cpus) if job_cpus else None) or s.cores
    tree = med(s.proc_cpu_pct)
    tree_cores = tree / 100.0 if tree is not None else None
    # How busy the CPUs the job may use are (all of the machine's unless it is pinned).
    total = med(s.job_cpus_busy_pct) if s.job_cpus_busy_pct is not None else med(s.cpu_total_pct)
    busiest, others = med(s.busiest_core_pct), med(s.other_cores_pct)
    procs, procs_src = _loader_procs(inp)
    workers = (inp.loader or {}).get("num_workers")
    au_v = inp.au if inp.au is not None else 0.0
    data_share = inp.data_share if inp.data_share is not None else 1.0 - au_v
    # The CPU the job wanted: ran + waited on a run queue (autotune.runqueue), when the
    # monitor recorded it; else what it got (CPU %), which contention lowers.
    wanted = med(s.sched_wanted_pct)
    demand = wanted / 100.0 if wanted is not None else tree_cores
    # Busy share of the loader processes, bounded: the main process may spend up to AU of
    # a core in its step (upper bound: it spends none).
    busy_lo = busy_hi = None
    if demand is not None and procs:
        # Without workers the main process loads only while the step waits for data.
        main_loads = workers == 0 or (workers is None and procs == 1)
        load_time = max(data_share, 1e-9) if main_loads else float(procs)
        busy_hi = demand / load_time
        busy_lo = max(0.0, demand - au_v) / load_time
    _cpu_evidence(inp, s, ev, cores, total, busiest, others, tree_cores, procs_src, wanted,
                  demand, busy_lo, busy_hi)
    util, await_ms, rps = med(s.disk_util_pct), med(s.disk_r_await_ms), med(s.disk_reads_per_s)
    _disk_evidence(s, ev, util, await_ms, rps)
    storage, iops, best_c, unit = _storage_ceiling(inp)
    at_ceiling = headroom = False
    if storage and inp.images_per_s:
        share = inp.images_per_s / storage
        ev.append(f"reads {inp.images_per_s:,.0f} images/s = {share:.0%} of the storage "
                  f"ceiling {storage:,.0f} {unit} ({'measured apart' if inp.storage_ceiling else 'probe'}, "
                  f"best at {best_c or '?'} reads in flight)")
        at_ceiling = share >= AT_CEILING
        headroom = share < PROBE_HEADROOM
    if iops and rps is not None:
        ev.append(f"disk r/s {rps:,.0f} = {rps / iops:.0%} of fio's {iops:,.0f} random-read IOPS")
        at_ceiling = at_ceiling or rps >= AT_CEILING * iops
    machine_sat = total is not None and total >= CPU_SATURATED * 100
    job_cpu_bound = demand is not None and bool(cores) and demand >= CPU_SATURATED * cores
    reads = rps is not None and (rps >= 1.0 or (med(s.disk_read_mib_s) or 0.0) > 0.1)
    no_reads = s.disk_util_pct is not None and not reads
    return _Signals(
        cores=cores, tree_cores=tree_cores, total=total, busiest=busiest, others=others,
        procs=procs, workers=workers, main_only=workers == 0 or (
            workers is None and s.proc_processes is not None
            and round(s.proc_processes["median"]) == 1),
        wanted=wanted, demand=demand, busy_lo=busy_lo,
        busy_hi=busy_hi, util=util, await_ms=await_ms, rps=rps, machine_sat=machine_sat,
        job_cpu_bound=job_cpu_bound,
        # Without run-queue figures a CPU-bound loader on a saturated machine shows only
        # its share of a core: a lower bar then.
        busy=busy_lo is not None and (busy_lo >= LOADER_BUSY or (
            wanted is None and machine_sat and busy_lo >= LOADER_BUSY_CONTENDED)),
        idle=busy_hi is not None and busy_hi <= LOADER_IDLE,
        pinned=(busiest is not None and busiest >= CORE_PINNED_PCT
                and (others is None or others <= OTHERS_IDLE_PCT)),
        no_reads=no_reads,
        # Saturated CPUs and no reads from the dataset's disk: the loaders wait for CPU (a
        # guess for metrics without run-queue figures, which say it directly).
        cpu_starved=wanted is None and machine_sat and no_reads,
        at_ceiling=at_ceiling, headroom=headroom, storage=storage, storage_unit=unit,
        best_c=best_c)


def _cpu_evidence(inp: RuleInputs, s: SystemFigures, ev: list[str], cores: int | None,
                  total: float | None, busiest: float | None, others: float | None,
                  tree_cores: float | None, procs_src: str, wanted: float | None,
                  demand: float | None, busy_lo: float | None, busy_hi: float | None) -> None:
    pinned_job = s.cores is not None and cores is not None and cores < s.cores
    where = "the job's CPUs" if pinned_job else "machine"
    ev.append(f"CPU: {where} {_num(total)} % of {cores or '?'} core(s)"
              + (f" (pinned; the machine has {s.cores})" if pinned_job else "")
              + (f", busiest core {busiest:.0f} %" if busiest is not None else "")
              + (f", the other(s) {others:.0f} %" if others is not None else "")
              + (f"; the job's processes {tree_cores:.2f} cores" if tree_cores is not None else "")
              + f"; {procs_src}")
    if wanted is not None and demand is not None:
        rw = SystemFigures.med(s.sched_run_wait_pct) or 0.0
        rq = SystemFigures.med(s.procs_running)
        ev.append(f"the job's tasks wanted {demand:.2f} cores: ran {demand - rw / 100:.2f}, "
                  f"waited {rw / 100:.2f} on a run queue"
                  + (f" (machine run queue {rq:.0f} on {cores} cores)" if rq is not None else ""))
    if busy_lo is not None and busy_hi is not None:
        ev.append(f"loader processes want a CPU {min(busy_lo, 1):.0%}-{min(busy_hi, 1):.0%} of "
                  "the time they should be loading")


def _disk_evidence(s: SystemFigures, ev: list[str], util: float | None,
                   await_ms: float | None, rps: float | None) -> None:
    iowait = SystemFigures.med(s.cpu_iowait_pct)
    if s.disk_util_pct is not None:
        ev.append(f"disk {s.disk_device or '?'}: %util {util:.0f} (p95 "
                  f"{s.disk_util_pct['p95']:.0f}), r/s {_num(rps)}, r_await "
                  f"{_num(await_ms, '{:.1f}')} ms; iowait {_num(iowait, '{:.0f}')} %")
    elif "disk" in s.unavailable:
        ev.append(f"disk: not measured ({s.unavailable['disk']})")
    ev.append(f"system figures: {s.samples} monitor samples, joined by {s.joined_by}")


def _at_ceiling(inp: RuleInputs, f: _Signals, ev: list[str],
                cmd: dict[str, str]) -> Verdict | None:
    """At a ceiling measured apart: the storage's, or the decode one with busy CPUs."""
    if f.at_ceiling and not f.job_cpu_bound:
        return _storage(inp, ev, cmd, "at the probe's storage ceiling" if not inp.storage_ceiling
                        else f"at the storage ceiling ({f.storage:,.0f} {f.storage_unit}, "
                             "measured apart from the trials)")
    dc = inp.decode_ceiling
    if dc and inp.images_per_s and inp.images_per_s >= AT_CEILING * dc and not f.idle:
        ev.append(f"reads {inp.images_per_s:,.0f} images/s = {inp.images_per_s / dc:.0%} of the "
                  f"decode ceiling {dc:,.0f} images/s (the pipeline from memory x the usable "
                  "cores, measured apart from the trials)")
        return _decode(inp, f, ev, cmd)
    return None


def _too_few_loaders(inp: RuleInputs, f: _Signals, ev: list[str],
                     cmd: dict[str, str]) -> Verdict | None:
    """Fewer loaders than cores, limited by CPU: more workers get the job more CPU (also on
    a contended machine, where the scheduler shares per process). With num_workers=0 this
    holds even when the main process fills the cores: torch's intra-op threads spread its
    decode over them, but loading and the step still take turns, and workers (one thread
    each) overlap them; the CPU is judged again once they do."""
    main_only = f.main_only
    if not (f.procs and f.cores and f.procs < f.cores and (main_only or not f.job_cpu_bound)
            and (f.busy or f.cpu_starved or (main_only and f.job_cpu_bound))):
        return None
    if main_only and f.job_cpu_bound and f.demand is not None:
        ev.append(f"the main process alone wants {f.demand:.1f} cores (torch's intra-op "
                  "threads), yet loads only while the step waits: workers overlap the two")
    if f.pinned:
        ev.append(f"one core near 100 % ({f.busiest:.0f} %) while the other(s) idle "
                  f"({f.others:.0f} %)")
    if f.machine_sat and f.tree_cores is not None:
        ev.append(f"other processes use {max(0.0, f.total / 100 * f.cores - f.tree_cores):.1f} "  # type: ignore[operator]
                  "core(s) of the machine: free them as well")
    return Verdict("loader", f"loader-configuration-bound: {f.procs} loader process(es) "
                   f"limited by CPU on {f.cores} cores while the step waits "
                   f"{_pct(inp.data_share)} of the time: too few workers", ev, cmd["search"],
                   [f"raise num_workers (up to about {f.cores}), and prefetch_factor if "
                    "batches arrive unevenly; `autotune search` finds the knee"])


def _cpu_bound(inp: RuleInputs, f: _Signals, ev: list[str],
               cmd: dict[str, str]) -> Verdict | None:
    if f.job_cpu_bound or (f.machine_sat and (f.busy or f.cpu_starved)):
        return _decode(inp, f, ev, cmd)
    return None


def _decode(inp: RuleInputs, f: _Signals, ev: list[str], cmd: dict[str, str]) -> Verdict:
    if f.machine_sat and f.tree_cores is not None and f.cores:
        other = max(0.0, f.total / 100 * f.cores - f.tree_cores)  # type: ignore[operator]
        if other >= 0.25:
            ev.append(f"other processes use {other:.1f} core(s) of the machine; the job "
                      f"gets {f.tree_cores:.1f}"
                      + ("; the disk reads nothing: the loaders wait for CPU, not I/O"
                         if f.cpu_starved else ""))
    return Verdict("decode", f"decode-bound (CPU): the CPUs are saturated "
                   f"({_num(f.total)} % of {f.cores} cores; the job wants "
                   f"{_num(f.demand, '{:.1f}')}) while the step waits "
                   f"{_pct(inp.data_share)} of the time", ev, cmd["search"],
                   ["decode is the limit: more CPU cores (or fewer other processes), a "
                    "lighter pipeline (smaller stored images: `autotune convert "
                    "--max-side`), or decode on the GPU (NVIDIA DALI); storage "
                    "conversion would not help"])


def _waiting_on_reads(inp: RuleInputs, f: _Signals, ev: list[str],
                      cmd: dict[str, str]) -> Verdict | None:
    """Idle loaders while the step waits: they wait on reads (or on nothing we watch)."""
    if not f.idle:
        return None
    s = inp.system
    assert s is not None
    if f.no_reads:
        why = ("the loader processes are idle while the step waits, yet the watched disk "
               f"({s.disk_device}) reads nothing")
        return Verdict("unknown", f"unknown: {why}", ev, cmd["monitor"],
                       ["run the monitor with --data on the dataset's directory (its disk "
                        "is the one to watch); for network storage, probe it "
                        f"(`{cmd['probe']}`) and pass --probe"])
    if f.headroom:
        return _latency(inp, f, ev, cmd)
    why = "the loader processes are idle while the step waits: they wait on reads"
    if f.util is not None and f.util >= DISK_BUSY_PCT:
        why += f"; disk %util {f.util:.0f}"
    elif f.await_ms is not None and f.await_ms >= AWAIT_HIGH_MS:
        why += f"; each read takes {f.await_ms:.0f} ms (r_await)"
    elif s.disk_util_pct is not None and s.disk_util_pct["p95"] >= DISK_BUSY_PCT:
        why += (f"; the disk is busy in bursts (%util median {f.util:.0f}, p95 "
                f"{s.disk_util_pct['p95']:.0f}): reads come in waves the loaders wait out")
    elif s.disk_util_pct is None:
        why += " (disk figures unavailable: network or FUSE storage)"
    else:
        why += (f"; the disk shows %util {f.util:.0f} at {_num(f.rps)} r/s: a cap or a queue "
                "above the device (cgroup, network) limits it")
    return _storage(inp, ev, cmd, why)


def _latency(inp: RuleInputs, f: _Signals, ev: list[str], cmd: dict[str, str]) -> Verdict:
    """Waiting on reads with headroom at more reads in flight: settings can hide the
    latency only if the workers that takes are within the bound."""
    need, bound = f.best_c, inp.worker_bound
    if need and bound is not None and need > bound:
        ev.append(f"the storage serves its {f.storage:,.0f} {f.storage_unit} only with {need} "
                  f"reads in flight, more than the {bound} workers the search may use (the "
                  "cores, or their memory): settings cannot hide its latency")
        return _storage(inp, ev, cmd, f"latency: the loaders wait on reads, and hiding the "
                        f"latency takes {need} reads in flight, above the {bound}-worker bound")
    return Verdict("loader", "loader-configuration-bound (latency): the loader "
                   "processes wait on reads, yet the storage can deliver "
                   f"{f.storage:,.0f} {f.storage_unit} with {need or 'more'} reads in flight",
                   ev, cmd["search"],
                   [f"use at least {min(need or 16, 64)} reads in flight (DataLoader "
                    "workers), or convert to shards so each read is large"])


def _storage(inp: RuleInputs, ev: list[str], cmd: dict[str, str], why: str) -> Verdict:
    return Verdict("storage", f"storage-bound: {why}; the step waits "
                   f"{_pct(inp.data_share)} of the time", ev, cmd["convert"],
                   ["convert the dataset to shards (`autotune convert`) and stage them on "
                    "local NVMe (`autotune stage`): large sequential reads instead of small "
                    "random ones; more workers help only while the storage has headroom",
                    f"measure the storage's ceiling: `{cmd['probe']}`"])
