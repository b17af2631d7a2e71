"""The rules of the verdict: what holds a job back, with the figures that show it.

One engine for a training log (`analyze`), for the search's recommended configuration
(`search`) and for the in-loop tuner. It decides from where the loading processes' time
went (the time budget: autotune.monitor.timebudget, in SystemFigures.budget), comparing
the states with each other rather than one share with a fixed line, so that a worker busy
27 % instead of 25 % cannot flip the answer:

1. AU (time in the step / wall time) >= 0.90: compute-bound, the input keeps up.
2. Otherwise the job is input-bound. The loading class is the workers (the main process
   when num_workers=0, its step's time taken out). Its dominant state among blocked on
   storage (io + storage_wait), on a CPU or runnable, and idle (asleep, not on storage):
   - blocked: storage, (throughput) unless more reads in flight raise the rate (the
     probe's by-concurrency figures, or the storage ceiling's concurrency): then the
     latency rule (bounds.latency_verdict): loader (latency) when the reads in flight it
     takes fit the worker bound, storage (latency) when they do not;
   - on a CPU: num_workers=0: loader (too few workers: 0); the usable cores full with
     the job's own demand (as many loaders as cores, or the job's tasks want >= 85 % of
     the cores): decode; else loader (too few workers: a neighbour's load does not make
     the cores full, the scheduler shares them per task, so more workers get more);
   - idle workers while the step waits: asleep in a timer for most of it (nanosleep:
     time.sleep in the Dataset, a client's backoff, a rate limiter), the wait is inside
     their own work, which more workers overlap: loader (waits inside the dataset); else
     the wait is in the main process (collate, pin_memory, IPC, a lock): loader (main
     process).
   The ceilings measured apart (the probe's or the search's storage ceiling, the decode
   ceiling) confirm or contradict it in the evidence.
3. Without a budget: a ceiling measured apart that is reached still decides (storage,
   decode); else unknown, naming the missing figure and the command that gives it.
The GPU rule (utilization under 40 %) says input-bound when the log gives no data time.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from autotune.monitor.figures import SystemFigures
from autotune.monitor.timebudget import ClassBudget, TimeBudget
from autotune.thresholds import AT_CEILING, AU_HEALTHY, CPU_SATURATED
from autotune.verdict._types import Verdict
from autotune.verdict.bounds import latency_verdict, worker_bound

GPU_STARVED_PCT = 40.0    # practitioners' rule: a GPU under 40 % busy is starved
LATENCY_GAIN = 1.25       # more reads in flight "raise the rate": by at least this factor
NEAR_BEST = 0.90          # the reads in flight that reach this share of the best rate


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
    system: SystemFigures | None = None       # its .budget: the time budget
    probe: dict[str, Any] | None = None
    dataset: str | None = None
    # Ceilings measured apart from these figures (the search's); None: the probe's, if any.
    storage_ceiling: float | None = None
    storage_overtaken: bool = False           # the probe's figure was beaten: not a ceiling
    storage_unit: str = "files/s"             # "samples/s" through a conversion's reader
    storage_concurrency: int | None = None    # reads in flight at the storage ceiling
    decode_ceiling: float | None = None
    worker_bound: int | None = None           # the most workers; None: bounds.worker_bound
    # autotune's own pipeline: where its time went by stage (autotune.data.stages), None
    # for a user's dataset (the time budget is its budget).
    stages: dict[str, Any] | None = None
    # What else names the job in a next `search` command: "--dataset-factory F.py:fn",
    # "--step M:fn", "--preset P" (a user's Dataset searched as a folder of images would
    # be another job). With --step, no --compute-ms is added.
    job_args: str = ""


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
    job = f" {inp.job_args.strip()}" if inp.job_args.strip() else ""
    if " --step " in f" {job} ":
        step = half = ""          # the user's own step, measured as it is
    return {
        "search": f"autotune search {ds}{job}{step}{bs}",
        "search_half": f"autotune search {ds}{job}{half}{bs}",
        "convert": (f"autotune convert {ds} {shlex.quote(inp.dataset.rstrip('/') + '-wds')} "
                    "--format wds" if inp.dataset else "autotune convert DATASET DATASET-wds --format wds"),
        "monitor": f"autotune monitor --data {ds} -- YOUR TRAINING COMMAND",
        "probe": f"autotune probe {ds} --json probe.json",
    }


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
    probe's (none when a trial overtook it: a wrong measurement)."""
    files, iops, best_c = _probe_ceiling(inp.probe)
    if inp.storage_overtaken:
        files = None
    if inp.storage_ceiling:
        return inp.storage_ceiling, iops, inp.storage_concurrency or best_c, inp.storage_unit
    unit = "samples/s" if (inp.probe or {}).get("verdict", {}).get("storage_samples_per_s") \
        else "files/s"
    return files, iops, best_c, unit


def _levels(probe: dict[str, Any] | None) -> tuple[list[tuple[int, float]], str]:
    """The probe's (concurrency, rate) levels: a conversion's reader's, else the replay's
    steady-state pass, else its cold pass."""
    p = probe or {}
    for sec, key, unit in (("samples", "samples_per_s", "samples/s"),
                           ("replay", "files_per_s", "files/s")):
        d = p.get(sec) or {}
        for levels in (d.get("steady"), d.get("by_concurrency")):
            pts = [(int(lv["concurrency"]), float(lv[key])) for lv in levels or []
                   if lv.get("concurrency") and lv.get(key) is not None]
            if pts:
                return sorted(pts), unit
    return [], "files/s"


def decide(inp: RuleInputs) -> Verdict:
    """The verdict, its evidence lines and the next command."""
    cmd = _commands(inp)
    ev = _headline(inp)
    v = _compute(inp, ev, cmd)
    if v is not None:
        return v
    budget, missing = budget_of(inp.system)
    at = _ceilings(inp, ev)
    if budget is None:
        return _without_budget(inp, ev, cmd, missing, at)
    load, missing = _loading(inp, budget, ev)
    if load is None:
        return _without_budget(inp, ev, cmd, missing, at)
    _hidden_read_wait(inp, load, ev)
    state = load.dominant()
    if state == "blocked":
        v = _blocked(inp, load, ev, cmd)
    elif state == "cpu":
        v = _on_cpu(inp, budget, load, ev, cmd)
    elif not load.main_only and load.timer >= 0.5 * load.idle:
        v = _timer_waits(inp, load, ev, cmd)
    else:
        v = _main_process(inp, budget, load, ev, cmd)
    _stages(inp, v, ev)
    _confirm(v, at, ev)
    return v


def _hidden_read_wait(inp: RuleInputs, load: _Load, ev: list[str]) -> None:
    """A wait the kernel cannot name, seen by the pipeline's own clock: workers inside the
    read stage while neither on a CPU nor blocked (a storage client polls its socket with
    a timeout, `poll_schedule_timeout`, as the DataLoader's own pipes do: no wchan tells
    them apart) are waiting on storage. That part of their asleep time is counted as
    storage wait, and said."""
    st = inp.stages
    if load.main_only or not st or st.get("busy") is None:
        return
    busy = min(1.0, st["busy"])
    in_read = busy * st["share"]["read"]
    hidden = min(load.idle, max(0.0, in_read - load.cpu - load.blocked))
    if hidden >= 0.05:
        load.storage_wait += hidden
        load.idle -= hidden
        ev.append(f"the pipeline's clock saw {load.who} inside the read stage {_pct(in_read)} "
                  f"of their time, {_pct(hidden)} of it neither on a CPU nor in a wait the "
                  "kernel names (a storage client polling its socket): counted as storage wait")
    # CPU time that cannot have been spent decoding: the stages after read took at most
    # (busy - in_read) of the loaders' time, so the rest of their CPU (and runnable) time
    # was inside read: the storage client's per-request work (signing, HTTP, TLS), which
    # shards cut as they cut requests. Counted with the read only where the read also waits
    # on storage: a read that is CPU alone (a local shard's parser) stays CPU.
    read_cpu = min(in_read, max(0.0, load.cpu - (busy - in_read)))
    if read_cpu >= 0.05 and load.blocked >= 0.1:
        load.read_cpu = read_cpu
        ev.append(f"of {load.whose} {_pct(load.cpu)} on a CPU or runnable, at least "
                  f"{_pct(read_cpu)} was inside the read stage (the other stages took at most "
                  f"{_pct(busy - in_read)} of their time): the storage client's per-request "
                  "work, counted with the read, not as decode")


def _stages(inp: RuleInputs, v: Verdict, ev: list[str]) -> None:
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
                  "larger than the crop, or smaller stored images (`autotune convert --max-side`)",
        "transform": "the transform costs more than the decode: `exact: false` (the same crops, "
                     "fewer copies), or `output: uint8` and normalise on the GPU",
        "collate": "collate is the cost: a uint8 output (a quarter of float32's bytes) or "
                   "smaller batches per worker"}[top], *v.advice]


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


def budget_of(system: SystemFigures | None) -> tuple[TimeBudget | None, str]:
    """The window's time budget, or None and a line naming what is missing and why."""
    if system is None:
        return None, ("no system metrics: the time budget (where each loading process's "
                      "time goes) is measured by `autotune monitor`")
    d = system.budget
    if not d:
        return None, ("the monitor's samples carry no time budget (SystemFigures.budget): "
                      "run the job under `autotune monitor` (a version that records it), on a "
                      "kernel with /proc/PID/task/TID/schedstat")
    if not d.get("available", True):
        return None, (f"the time budget was not measured: {d.get('reason') or 'no reason given'}"
                      "; run under `autotune monitor` on a kernel with schedstat")
    b = TimeBudget.from_dict(d)
    if not b.classes or b.wall_s <= 0:
        return None, ("the time budget is empty (no process of the job seen in the window): "
                      "check that `autotune monitor` wraps the training command itself")
    return b, ""


@dataclass
class _Load:
    """Where the loading class's time went, as shares of its loading time."""

    name: str           # "workers", or "main" when the main process loads (num_workers=0)
    procs: int          # loading processes (reads they can have in flight)
    on_cpu: float
    runnable: float
    io: float
    storage_wait: float
    idle: float
    read_cpu: float = 0.0   # of `cpu`, the part the pipeline's clock puts inside the read stage
    timer: float = 0.0      # of `idle`, the part asleep in a timer (nanosleep)

    @property
    def cpu(self) -> float:
        return self.on_cpu + self.runnable

    @property
    def blocked(self) -> float:
        return self.io + self.storage_wait

    @property
    def main_only(self) -> bool:
        return self.name == "main"

    @property
    def who(self) -> str:
        return ("the main process (num_workers=0)" if self.main_only
                else f"the {self.procs} worker{'s' if self.procs != 1 else ''}")

    @property
    def whose(self) -> str:
        return "its loading" if self.main_only else "its" if self.procs == 1 else "their"

    @property
    def verb(self) -> str:
        return "is" if self.main_only or self.procs == 1 else "are"

    def dominant(self) -> str:
        """The state that took most of the time: states compared with each other, never
        one share against a fixed line (ties: blocked, then cpu)."""
        states = {"blocked": self.blocked + self.read_cpu, "cpu": self.cpu - self.read_cpu,
                  "idle": self.idle}
        return max(states, key=lambda k: states[k])

    def shares(self) -> str:
        return (f"blocked on storage {_pct(self.blocked)} (I/O {_pct(self.io)}, storage wait "
                f"{_pct(self.storage_wait)}), on a CPU {_pct(self.on_cpu)}, runnable "
                f"{_pct(self.runnable)}, idle {_pct(self.idle)}")


def _class_line(name: str, c: ClassBudget, b: TimeBudget) -> str:
    src = "delay accounting" if b.io_source == "delayacct" else "task-state sampling"
    # As the table and the report show it: asleep is what the other states leave of one
    # thread (idle helper threads would otherwise read as 226 % asleep).
    sh = c.display_shares()
    label = "workers" if name == "workers" else "main process"
    return (f"{label} ({c.processes} proc{'s' if c.processes != 1 else ''}, {c.threads} "
            f"threads): I/O {_pct(sh['io'])} of {'their' if name == 'workers' else 'its'} time, storage wait "
            f"{_pct(sh['storage_wait'])}, on a CPU {_pct(sh['on_cpu'])}, runnable "
            f"{_pct(sh['runnable'])}, asleep {_pct(sh['asleep'])}"
            + (f" (in a timer {_pct(c.timer())})" if c.timer() >= 0.05 else "")
            + f" ({src}, {b.samples:,} "
            f"samples at {b.hz:.0f} Hz over {b.wall_s:.1f} s)")


def _budget_lines(b: TimeBudget, ev: list[str]) -> None:
    for name in ("workers", "main"):
        c = b.cls(name)
        if c is not None:
            ev.append(_class_line(name, c, b))
    psi = b.psi_io
    if psi:
        scope = "the job's cgroup" if psi.get("scope") == "cgroup" else "the machine's: /proc/pressure/io"
        ev.append(f"PSI io: some {_num(psi.get('some_pct'))} %, full {_num(psi.get('full_pct'))} % "
                  f"({scope})")
    ev.extend(f"time budget: {n}" for n in b.notes)


def _loading(inp: RuleInputs, b: TimeBudget, ev: list[str]) -> tuple[_Load | None, str]:
    """The loading class's budget: the workers', or the main process's loading time when
    num_workers=0 (its step's share, AU, taken from its idle time first: a step waiting on
    the GPU sleeps; then from its CPU time)."""
    _budget_lines(b, ev)
    workers = (inp.loader or {}).get("num_workers")
    wc, mc = b.cls("workers"), b.cls("main")
    if workers == 0 or (workers is None and wc is None):
        if mc is None:
            return None, ("the time budget has no main process (the training process was not "
                          "seen in the window): run the training command itself under "
                          "`autotune monitor`")
        au = inp.au or 0.0
        load_t = max(inp.data_share if inp.data_share is not None else 1.0 - au, 1e-9)
        idle = mc.idle()
        step_idle = min(idle, au)
        cpu_cut = max(0.0, au - step_idle)
        on = max(0.0, mc.share("on_cpu") - cpu_cut)
        run = max(0.0, mc.share("runnable") - max(0.0, cpu_cut - mc.share("on_cpu")))
        load = _Load("main", 1, on / load_t, run / load_t, mc.share("io") / load_t,
                     mc.share("storage_wait") / load_t, (idle - step_idle) / load_t)
        ev.append(f"the main process loads every batch (num_workers={workers if workers is not None else '0: no worker seen'}): "
                  f"its step's {_pct(au)} of the time taken out, in its loading time it is "
                  + load.shares())
        return load, ""
    if wc is None:
        return None, (f"the time budget has no DataLoader worker, yet num_workers={workers}: "
                      "the workers were not seen in the window (run the training command "
                      "itself under `autotune monitor`, not a shell that forks it away)")
    return _Load("workers", wc.processes or int(workers or 1), wc.share("on_cpu"),
                 wc.share("runnable"), wc.share("io"), wc.share("storage_wait"), wc.idle(),
                 timer=wc.timer()), ""


def _usable_cores(inp: RuleInputs) -> int | None:
    """The job's own CPUs (its affinity or quota, from the step log) when known: a job
    pinned to 2 of 64 cores is limited by those 2."""
    s = inp.system
    job_cpus = SystemFigures.med(s.job_cpus) if s is not None else None
    return inp.job_cores or (round(job_cpus) if job_cpus else None) or (s.cores if s else None)


def _bound(inp: RuleInputs, load: _Load) -> tuple[int, str]:
    if inp.worker_bound is not None:
        return inp.worker_bound, f"the {inp.worker_bound}-worker bound of the search"
    cores = _usable_cores(inp) or 1
    b = worker_bound(cores, blocked_share=min(load.blocked, 1.0))
    return b, (f"worker bound {b}: {cores} usable core(s), raised while the loaders are "
               f"blocked {_pct(min(load.blocked, 1.0))} of their time (cores / (1 - blocked))")


def _ceilings(inp: RuleInputs, ev: list[str]) -> dict[str, Any]:
    """The ceilings measured apart from the judged figures, and whether they are reached."""
    s = inp.system
    med = SystemFigures.med
    out: dict[str, Any] = {"storage": "", "decode": False}
    storage, iops, best_c, unit = _storage_ceiling(inp)
    ips = inp.images_per_s
    if storage and ips:
        ev.append(f"reads {ips:,.0f} images/s = {ips / storage:.0%} of the storage ceiling "
                  f"{storage:,.0f} {unit} ({'measured apart' if inp.storage_ceiling else 'probe'}, "
                  f"best at {best_c or '?'} reads in flight)")
        if ips >= AT_CEILING * storage:
            out["storage"] = ("at the probe's storage ceiling" if not inp.storage_ceiling else
                              f"at the storage ceiling ({storage:,.0f} {unit}, measured apart "
                              "from the trials)")
    rps = med(s.disk_reads_per_s) if s is not None else None
    if iops and rps is not None:
        ev.append(f"disk r/s {rps:,.0f} = {rps / iops:.0%} of fio's {iops:,.0f} random-read IOPS")
        if rps >= AT_CEILING * iops and not out["storage"]:
            out["storage"] = f"at fio's random-read IOPS ({iops:,.0f})"
    dc = inp.decode_ceiling
    if dc and ips:
        ev.append(f"reads {ips:,.0f} images/s = {ips / dc:.0%} of the decode ceiling {dc:,.0f} "
                  "images/s (the pipeline from memory x the usable cores, measured apart)")
        out["decode"] = ips >= AT_CEILING * dc
    if s is not None:
        _disk_evidence(s, ev)
    return out


def _disk_evidence(s: SystemFigures, ev: list[str]) -> None:
    med = SystemFigures.med
    if s.disk_util_pct is not None:
        ev.append(f"disk {s.disk_device or '?'}: %util {med(s.disk_util_pct):.0f} (p95 "
                  f"{s.disk_util_pct['p95']:.0f}), r/s {_num(med(s.disk_reads_per_s))}, r_await "
                  f"{_num(med(s.disk_r_await_ms), '{:.1f}')} ms; iowait "
                  f"{_num(med(s.cpu_iowait_pct), '{:.0f}')} %")
    elif "disk" in s.unavailable:
        ev.append(f"disk: not measured ({s.unavailable['disk']})")
    ev.append(f"system figures: {s.samples} monitor samples, joined by {s.joined_by}")


def _without_budget(inp: RuleInputs, ev: list[str], cmd: dict[str, str], missing: str,
                    at: dict[str, Any]) -> Verdict:
    """No budget: a ceiling measured apart that is reached still decides; else unknown,
    naming what is missing."""
    ev.append(f"input-bound: the step waits for its data {_pct(inp.data_share)} of the time; "
              "without the time budget storage, decode and loader settings look the same: "
              f"`{cmd['monitor']}` tells them apart")
    ev.append(f"time budget: missing ({missing})")
    if at["storage"]:
        return _storage(inp, ev, cmd, ": " + at["storage"])
    if at["decode"]:
        return Verdict("decode", "decode-bound (CPU): at the decode ceiling measured apart "
                       f"while the step waits {_pct(inp.data_share)} of the time", ev,
                       cmd["search"], _DECODE_ADVICE)
    workers = (inp.loader or {}).get("num_workers")
    hint = (["num_workers=0 in the step log: the main process loads every batch; "
             "`autotune search` finds how many workers it needs"] if workers == 0 else [])
    return Verdict("unknown", f"unknown: input-bound (data wait {_pct(inp.data_share)}), but "
                   f"the time budget is missing: {missing}", ev, cmd["monitor"],
                   hint + ["run the job under `autotune monitor` (or pass --metrics "
                           "metrics.jsonl of a monitor that records the time budget), and "
                           "`autotune probe` for the storage ceiling"])


def _storage_kind(inp: RuleInputs, load: _Load) -> tuple[str | None, int | None, float | None, str, str]:
    """(throughput | latency | None, reads in flight needed, rate, unit, evidence line):
    latency when more reads in flight than the job has raise the rate."""
    now_c = max(1, load.procs)
    pts, unit = ([], "files/s") if inp.storage_overtaken else _levels(inp.probe)
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
    storage, _, conc, unit = _storage_ceiling(inp)
    if inp.storage_overtaken and not inp.storage_ceiling:
        conc = None                 # the set-aside probe's concurrency is no figure either
    if conc:
        if conc > now_c:
            return "latency", int(conc), storage, unit, (
                f"the storage ceiling ({_num(storage)} {unit}) comes with {conc} reads in "
                f"flight, more than the job's {now_c}: latency")
        return "throughput", None, storage, unit, (
            f"the storage ceiling ({_num(storage)} {unit}) comes with {conc} reads in flight, "
            f"no more than the job's {now_c}: throughput")
    why = "the probe's figure was overtaken (set aside)" if inp.storage_overtaken else \
        f"no probe by-concurrency figures: `{_commands(inp)['probe']}` and --probe tell"
    return None, None, None, unit, f"throughput or latency: not measured ({why})"


def _blocked(inp: RuleInputs, load: _Load, ev: list[str], cmd: dict[str, str]) -> Verdict:
    kind, need, rate, unit, line = _storage_kind(inp, load)
    ev.append(line)
    head = (f"{load.who} {load.verb} blocked on storage "
            f"{_pct(load.blocked)} of {load.whose} time (on a CPU "
            f"or runnable {_pct(load.cpu)}, idle {_pct(load.idle)})")
    if load.read_cpu:
        head = (f"{load.who} {load.verb} reading {_pct(load.blocked + load.read_cpu)} of "
                f"{load.whose} time (blocked on storage {_pct(load.blocked)}, the storage "
                f"client on a CPU or runnable {_pct(load.read_cpu)}; on a CPU or runnable "
                f"elsewhere {_pct(load.cpu - load.read_cpu)}, idle {_pct(load.idle)})")
    if kind == "latency" and need:
        bound, why = _bound(inp, load)
        ev.append(why)
        call = latency_verdict(need, bound, rate=rate, unit=unit, in_flight=load.procs)
        if call.within_bound:
            return Verdict("loader", f"loader-configuration-bound (latency): {head} while the "
                           f"step waits {_pct(inp.data_share)} of the time; {call.reason}", ev,
                           cmd["search"],
                           [f"use at least {need} reads in flight (num_workers={need}), or "
                            "convert to shards (`autotune convert`) so each read is large"])
        return _storage(inp, ev, cmd, f"(latency): {head}; {call.reason}"
                        + _at_bound(inp, bound))
    label = "(throughput)" if kind == "throughput" else "(throughput or latency: not measured)"
    return _storage(inp, ev, cmd, f"{label}: {head}")


def _at_bound(inp: RuleInputs, bound: int) -> str:
    """What the storage gives at the worker bound, beside the step's demand: the probe's
    rate at its most reads in flight within the bound, scaled up to the bound (while
    latency limits, the rate grows at most in proportion to the reads in flight)."""
    pts, unit = _levels(inp.probe)
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


def _cpu_line(inp: RuleInputs, b: TimeBudget, ev: list[str]) -> tuple[int | None, float, float | None]:
    """(usable cores, cores the job wants, cores free), with the evidence line."""
    s = inp.system
    cores = _usable_cores(inp)
    wanted = sum(c.seconds.get("on_cpu", 0.0) + c.seconds.get("runnable", 0.0)
                 for c in b.classes.values()) / b.wall_s
    pct = None
    if s is not None:
        pct = SystemFigures.med(s.job_cpus_busy_pct) if s.job_cpus_busy_pct is not None \
            else SystemFigures.med(s.cpu_total_pct)
    used = max(wanted, (pct or 0.0) / 100.0 * cores) if cores else wanted
    free = max(0.0, cores - used) if cores else None
    ev.append(f"CPU: the job's processes want {wanted:.2f} core(s) (on a CPU + runnable) of "
              f"{cores or '?'} usable; the CPUs are {_num(pct)} % busy; "
              f"{_num(free, '{:.1f}')} core(s) free")
    return cores, wanted, free


def _on_cpu(inp: RuleInputs, b: TimeBudget, load: _Load, ev: list[str],
            cmd: dict[str, str]) -> Verdict:
    cores, wanted, free = _cpu_line(inp, b, ev)
    head = (f"{load.who} {load.verb} on a CPU or runnable "
            f"{_pct(load.cpu)} of {load.whose} time "
            f"(blocked {_pct(load.blocked)}, idle {_pct(load.idle)})")
    bound, _ = _bound(inp, load)
    if load.main_only:
        return Verdict("loader", f"loader-configuration-bound (too few workers: 0): {head} "
                       f"while the step waits {_pct(inp.data_share)} of the time; loading and "
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
                       f"({wanted:.1f} wanted of {cores or '?'}) while the step waits "
                       f"{_pct(inp.data_share)} of the time", ev, cmd["search"], _DECODE_ADVICE)
    others = (f"; other processes hold {cores - wanted - free:.1f} of the rest, and more "
              "workers get more of it" if free is not None and cores - wanted - free >= 0.25
              else "")
    return Verdict("loader", f"loader-configuration-bound: {head}; the job wants {wanted:.1f} "
                   f"of {cores} core(s){others} while the step waits {_pct(inp.data_share)} "
                   "of the time: too few workers", ev, cmd["search"],
                   [f"raise num_workers (up to about {min(bound, cores or bound)}), and "
                    "prefetch_factor if batches arrive unevenly; `autotune search` finds the knee"])


def _timer_waits(inp: RuleInputs, load: _Load, ev: list[str], cmd: dict[str, str]) -> Verdict:
    """Workers asleep in a timer while the step waits: a wait inside their own work (a
    worker waiting for work polls its index queue's pipe instead), which overlaps across
    workers as a storage latency does."""
    cores = _usable_cores(inp) or 1
    bound = worker_bound(cores, blocked_share=min(1.0, load.blocked + load.timer))
    ev.append(f"the workers' sleeps are timer sleeps (nanosleep) {_pct(load.timer)} of their "
              f"time: inside their work, not a wait for work; worker bound {bound} "
              f"({cores} usable core(s), raised while they sleep or block: cores / (1 - share))")
    return Verdict("loader", f"loader-configuration-bound (waits inside the dataset): "
                   f"{load.who} {load.verb} asleep in a timer {_pct(load.timer)} of "
                   f"{load.whose} time (time.sleep, a client's backoff or a rate limiter in "
                   f"the Dataset; on a CPU {_pct(load.cpu)}, blocked {_pct(load.blocked)}) while "
                   f"the step waits {_pct(inp.data_share)}: more workers overlap such waits",
                   ev, cmd["search"],
                   [f"raise num_workers (up to about {bound}: a sleeping worker needs no core), "
                    "or remove the wait from __getitem__; a client backing off means the "
                    "service is throttling its requests"])


def _main_process(inp: RuleInputs, b: TimeBudget, load: _Load, ev: list[str],
                  cmd: dict[str, str]) -> Verdict:
    """Idle loaders while the step waits: the wait is in the main process."""
    adv = ["look at the main process between batches: collate_fn, pin_memory (its thread), "
           "the batch's IPC (large tensors through shared memory), a lock or a sleep; "
           "`py-spy dump --pid PID` shows where it waits"]
    if load.main_only:
        return Verdict("loader", f"loader-configuration-bound (main process): the main process "
                       f"(num_workers=0) is idle {_pct(load.idle)} of its loading time, neither "
                       f"on a CPU ({_pct(load.cpu)}) nor on storage ({_pct(load.blocked)}), while "
                       f"the step waits {_pct(inp.data_share)}: it waits on something else "
                       "(a lock, a sleep, a queue)", ev, cmd["search"], adv)
    mc = b.cls("main")
    main = ("" if mc is None else
            f"; the main process is on a CPU {_pct(mc.share('on_cpu'))}, runnable "
            f"{_pct(mc.share('runnable'))}, blocked {_pct(mc.blocked())} of its time"
            + (" (its collate, pin or unpickling)" if mc.share("on_cpu") + mc.share("runnable")
               > mc.idle() else " and asleep the rest (IPC, a lock)"))
    return Verdict("loader", f"loader-configuration-bound (main process): {load.who} are idle "
                   f"{_pct(load.idle)} of their time (asleep, not on storage; on a CPU "
                   f"{_pct(load.cpu)}, blocked {_pct(load.blocked)}) while the step waits "
                   f"{_pct(inp.data_share)}: the wait is in the main process (collate, pin, "
                   f"IPC, a lock){main}", ev, cmd["search"], adv)


def _confirm(v: Verdict, at: dict[str, Any], ev: list[str]) -> None:
    """What the ceilings measured apart say of the budget's verdict."""
    if at["storage"]:
        ev.append(f"the storage ceiling measured apart {'agrees' if v.bottleneck == 'storage' else 'disagrees'}: "
                  f"the job reads {at['storage']}")
    if at["decode"]:
        ev.append(f"the decode ceiling measured apart {'agrees' if v.bottleneck == 'decode' else 'disagrees'}: "
                  "the job reads at it")


_DECODE_ADVICE = ["decode is the limit: more CPU cores (or fewer other processes), a lighter "
                  "pipeline (smaller stored images: `autotune convert --max-side`), or decode "
                  "on the GPU (NVIDIA DALI); storage conversion would not help"]


def _storage(inp: RuleInputs, ev: list[str], cmd: dict[str, str], why: str) -> Verdict:
    return Verdict("storage", f"storage-bound {why}; the step waits "
                   f"{_pct(inp.data_share)} of the time", ev, cmd["convert"],
                   ["convert the dataset to shards (`autotune convert`) and stage them on "
                    "local NVMe (`autotune stage`): large sequential reads instead of small "
                    "random ones; more workers help only while the storage has headroom",
                    f"measure the storage's ceiling: `{cmd['probe']}`"])


__all__ = ["RuleInputs", "budget_of", "decide", "latency_verdict", "worker_bound"]
