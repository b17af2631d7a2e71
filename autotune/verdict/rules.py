"""The verdict of a training log: what holds the job back, with the figures that show it.

Same bottleneck names and thresholds (autotune.thresholds) as the search's verdict,
decided from what a running job shows instead of from ceilings:

1. AU (time in the step / wall time) >= 0.90: compute-bound, the input keeps up.
2. Otherwise the job is input-bound, and the loader's processes say why (in this order):
   - a probe is given and the job reads at >= 85 % of the storage ceiling: storage;
   - fewer loader processes than cores, limited by CPU (busy on a CPU: one core near
     100 % while others idle; or the machine is saturated and the dataset's disk reads
     nothing): loader configuration (too few workers: more of them get more CPU);
   - the job's processes use >= 85 % of the cores, or the machine's CPUs are saturated
     and the loaders are busy or the dataset's disk reads nothing (they wait for CPU):
     decode;
   - the loader processes are idle while the step waits: they wait on reads: storage (or,
     when the probe shows far more files/s with more reads in flight, loader: latency);
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

from autotune.analyze.join import SystemFigures
from autotune.thresholds import AT_CEILING, AU_HEALTHY, CPU_SATURATED, DISK_BUSY_PCT
from autotune.verdict import Verdict

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
    """(files/s ceiling of the replay, fio random-read IOPS, best concurrency) of a probe."""
    if not probe:
        return None, None, None
    v = probe.get("verdict") or {}
    files = v.get("storage_files_per_s")
    fio = probe.get("fio") or {}
    iops = (fio.get("rand_read") or {}).get("iops") if fio.get("plausible", True) else None
    return (float(files) if files else None, float(iops) if iops else None,
            v.get("best_concurrency"))


def decide(inp: RuleInputs) -> Verdict:
    """The verdict, its evidence lines and the next command."""
    cmd = _commands(inp)
    ev: list[str] = []
    s = inp.system
    med = SystemFigures.med
    gpu = med(s.gpu_util_pct) if s is not None else None
    step_ms = _num(None if inp.step_time_s is None else inp.step_time_s * 1000, "{:,.3g}")
    ev.append(f"data wait {_pct(inp.data_share)} of the time, AU {_pct(inp.au)} "
              f"(input-bound below {AU_HEALTHY:.0%}); step {step_ms} ms (p50)"
              + (f"; {inp.images_per_s:,.0f} images/s" if inp.images_per_s else "")
              + f" over {inp.steps:,} steps")
    if gpu is not None:
        ev.append(f"GPU busy {gpu:.0f} % (median over {s.samples} samples)"  # type: ignore[union-attr]
                  + (f" < {GPU_STARVED_PCT:.0f} %: starved" if gpu < GPU_STARVED_PCT else ""))

    au = inp.au
    starved_gpu = gpu is not None and gpu < GPU_STARVED_PCT
    if au is None and not starved_gpu:   # a starved GPU alone says input-bound
        return Verdict("unknown", "unknown: the log gives no data time, so AU cannot be "
                       "computed" + ("" if gpu is not None else ", and no GPU was sampled"),
                       ev, cmd["monitor"],
                       ["wrap the loader with autotune.instrument(loader) and run the job "
                        "under `autotune monitor`"])
    if au is not None and au >= AU_HEALTHY:
        adv = ["nothing to fix in the input pipeline; a faster step (GPU, AMP, larger batch) "
               "would raise throughput until the input becomes the limit: the search at half "
               "the step time shows whether the pipeline would keep up"]
        if starved_gpu:
            adv.insert(0, f"the input keeps up but the GPU is busy only {gpu:.0f} %: the step "
                          "itself leaves the GPU idle (CPU work, synchronisation, small batch)")
        return Verdict("compute", f"compute-bound (healthy): AU {au:.0%} >= {AU_HEALTHY:.0%}, "
                       "the training step is the limit and the input pipeline keeps up",
                       ev, cmd["search_half"], adv)

    if s is None:
        files, _, _ = _probe_ceiling(inp.probe)
        if files and inp.images_per_s and inp.images_per_s >= AT_CEILING * files:
            ev.append(f"reads {inp.images_per_s:,.0f} images/s = "
                      f"{inp.images_per_s / files:.0%} of the storage ceiling {files:,.0f} "
                      "files/s (probe)")
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

    # -- system figures ---------------------------------------------------------------------
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
    au_v = au if au is not None else 0.0
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
    pinned_job = s.cores is not None and cores is not None and cores < s.cores
    where = "the job's CPUs" if pinned_job else "machine"
    cpu_line = (f"CPU: {where} {_num(total)} % of {cores or '?'} core(s)"
                + (f" (pinned; the machine has {s.cores})" if pinned_job else "")
                + (f", busiest core {busiest:.0f} %" if busiest is not None else "")
                + (f", the other(s) {others:.0f} %" if others is not None else "")
                + (f"; the job's processes {tree_cores:.2f} cores" if tree_cores is not None else "")
                + f"; {procs_src}")
    ev.append(cpu_line)
    if wanted is not None:
        rw = med(s.sched_run_wait_pct) or 0.0
        rq = med(s.procs_running)
        ev.append(f"the job's tasks wanted {demand:.2f} cores: ran {demand - rw / 100:.2f}, "
                  f"waited {rw / 100:.2f} on a run queue"
                  + (f" (machine run queue {rq:.0f} on {cores} cores)" if rq is not None else ""))
    if busy_lo is not None and busy_hi is not None:
        ev.append(f"loader processes want a CPU {min(busy_lo, 1):.0%}-{min(busy_hi, 1):.0%} of "
                  "the time they should be loading")
    util, await_ms = med(s.disk_util_pct), med(s.disk_r_await_ms)
    rps = med(s.disk_reads_per_s)
    iowait = med(s.cpu_iowait_pct)
    if s.disk_util_pct is not None:
        ev.append(f"disk {s.disk_device or '?'}: %util {util:.0f} (p95 "
                  f"{s.disk_util_pct['p95']:.0f}), r/s {_num(rps)}, r_await "
                  f"{_num(await_ms, '{:.1f}')} ms; iowait {_num(iowait, '{:.0f}')} %")
    elif "disk" in s.unavailable:
        ev.append(f"disk: not measured ({s.unavailable['disk']})")
    ev.append(f"system figures: {s.samples} monitor samples, joined by {s.joined_by}")

    files, iops, best_c = _probe_ceiling(inp.probe)
    at_ceiling = False
    headroom = False
    if files and inp.images_per_s:
        share = inp.images_per_s / files
        ev.append(f"reads {inp.images_per_s:,.0f} images/s = {share:.0%} of the storage "
                  f"ceiling {files:,.0f} files/s (probe, best at {best_c or '?'} reads in flight)")
        at_ceiling = share >= AT_CEILING
        headroom = share < PROBE_HEADROOM
    if iops and rps is not None:
        ev.append(f"disk r/s {rps:,.0f} = {rps / iops:.0%} of fio's {iops:,.0f} random-read IOPS")
        at_ceiling = at_ceiling or rps >= AT_CEILING * iops

    machine_sat = total is not None and total >= CPU_SATURATED * 100
    job_cpu_bound = demand is not None and bool(cores) and demand >= CPU_SATURATED * cores
    # Without run-queue figures a CPU-bound loader on a saturated machine shows only its
    # share of a core: a lower bar then.
    busy = busy_lo is not None and (
        busy_lo >= LOADER_BUSY
        or (wanted is None and machine_sat and busy_lo >= LOADER_BUSY_CONTENDED))
    idle = busy_hi is not None and busy_hi <= LOADER_IDLE
    pinned = (busiest is not None and busiest >= CORE_PINNED_PCT
              and (others is None or others <= OTHERS_IDLE_PCT))

    reads = rps is not None and (rps >= 1.0 or (med(s.disk_read_mib_s) or 0.0) > 0.1)
    no_reads = s.disk_util_pct is not None and not reads
    # Saturated CPUs and no reads from the dataset's disk: the loaders wait for CPU (a
    # guess for metrics without run-queue figures, which say it directly).
    cpu_starved = wanted is None and machine_sat and no_reads

    if at_ceiling and not job_cpu_bound:
        return _storage(inp, ev, cmd, "at the probe's storage ceiling")
    if procs and cores and procs < cores and not job_cpu_bound and (busy or cpu_starved):
        # Fewer loaders than cores, limited by CPU: more workers get the job more CPU
        # (also on a contended machine, where the scheduler shares per process).
        if pinned:
            ev.append(f"one core near 100 % ({busiest:.0f} %) while the other(s) idle "
                      f"({others:.0f} %)")
        if machine_sat and tree_cores is not None:
            ev.append(f"other processes use {max(0.0, total / 100 * cores - tree_cores):.1f} "
                      "core(s) of the machine: free them as well")
        return Verdict("loader", f"loader-configuration-bound: {procs} loader process(es) "
                       f"limited by CPU on {cores} cores while the step waits "
                       f"{_pct(inp.data_share)} of the time: too few workers", ev, cmd["search"],
                       [f"raise num_workers (up to about {cores}), and prefetch_factor if "
                        "batches arrive unevenly; `autotune search` finds the knee"])
    if job_cpu_bound or (machine_sat and (busy or cpu_starved)):
        if machine_sat and tree_cores is not None and cores:
            other = max(0.0, total / 100 * cores - tree_cores)
            if other >= 0.25:
                ev.append(f"other processes use {other:.1f} core(s) of the machine; the job "
                          f"gets {tree_cores:.1f}"
                          + ("; the disk reads nothing: the loaders wait for CPU, not I/O"
                             if cpu_starved else ""))
        return Verdict("decode", f"decode-bound (CPU): the CPUs are saturated "
                       f"({_num(total)} % of {cores} cores; the job wants "
                       f"{_num(demand, '{:.1f}')}) while the step waits "
                       f"{_pct(inp.data_share)} of the time", ev, cmd["search"],
                       ["decode is the limit: more CPU cores (or fewer other processes), a "
                        "lighter pipeline (smaller stored images: `autotune convert "
                        "--max-side`), or decode on the GPU (NVIDIA DALI); storage "
                        "conversion would not help"])
    if idle:
        if no_reads:
            why = ("the loader processes are idle while the step waits, yet the watched disk "
                   f"({s.disk_device}) reads nothing")
            return Verdict("unknown", f"unknown: {why}", ev, cmd["monitor"],
                           ["run the monitor with --data on the dataset's directory (its disk "
                            "is the one to watch); for network storage, probe it "
                            f"(`{cmd['probe']}`) and pass --probe"])
        if headroom:
            return Verdict("loader", "loader-configuration-bound (latency): the loader "
                           "processes wait on reads, yet the storage can deliver "
                           f"{files:,.0f} files/s with {best_c or 'more'} reads in flight",
                           ev, cmd["search"],
                           [f"use at least {min(best_c or 16, 64)} reads in flight (DataLoader "
                            "workers), or convert to shards so each read is large"])
        why = "the loader processes are idle while the step waits: they wait on reads"
        if util is not None and util >= DISK_BUSY_PCT:
            why += f"; disk %util {util:.0f}"
        elif await_ms is not None and await_ms >= AWAIT_HIGH_MS:
            why += f"; each read takes {await_ms:.0f} ms (r_await)"
        elif s.disk_util_pct is not None and s.disk_util_pct["p95"] >= DISK_BUSY_PCT:
            why += (f"; the disk is busy in bursts (%util median {util:.0f}, p95 "
                    f"{s.disk_util_pct['p95']:.0f}): reads come in waves the loaders wait out")
        elif s.disk_util_pct is None:
            why += " (disk figures unavailable: network or FUSE storage)"
        else:
            why += (f"; the disk shows %util {util:.0f} at {_num(rps)} r/s: a cap or a queue "
                    "above the device (cgroup, network) limits it")
        return _storage(inp, ev, cmd, why)
    if util is not None and util >= DISK_BUSY_PCT:
        return _storage(inp, ev, cmd, f"the disk is busy ({util:.0f} %util)")
    return Verdict("unknown", "unknown: input-bound, but neither CPU saturation, busy "
                   "loader processes nor a busy disk explains the wait (loader processes on a "
                   f"CPU {_pct(busy_lo)}-{_pct(busy_hi)} of the time)", ev, cmd["probe"],
                   ["probe the storage (`autotune probe`) and pass --probe probe.json; check "
                    "for locks or sleeps in the dataset's __getitem__"])


def _storage(inp: RuleInputs, ev: list[str], cmd: dict[str, str], why: str) -> Verdict:
    return Verdict("storage", f"storage-bound: {why}; the step waits "
                   f"{_pct(inp.data_share)} of the time", ev, cmd["convert"],
                   ["convert the dataset to shards (`autotune convert`) and stage them on "
                    "local NVMe (`autotune stage`): large sequential reads instead of small "
                    "random ones; more workers help only while the storage has headroom",
                    f"measure the storage's ceiling: `{cmd['probe']}`"])
