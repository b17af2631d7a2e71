"""The verdict rules on figures made up to sit on each side of each rule: time budgets
(where each loading process's time went) for each cause, the ceilings measured apart, and
the worker bound and latency rule other modules call."""

from __future__ import annotations

import pytest

from autotune.monitor.figures import SystemFigures
from autotune.monitor.timebudget import STATES, ClassBudget, TimeBudget
from autotune.thresholds import AU_HEALTHY
from autotune.verdict import latency_verdict, worker_bound
from autotune.verdict.rules import RuleInputs, decide


def _s(v: float) -> dict[str, float]:
    return {"median": v, "p95": v, "max": v, "mean": v, "n": 10}


def klass(n: int, wall: float = 20.0, threads: int | None = None, **shares: float) -> ClassBudget:
    """n processes alive the whole window, each spending `shares` of it in each state
    (asleep: the rest of one thread's time)."""
    secs = {s: shares.get(s, 0.0) * n * wall for s in STATES}
    if "asleep" not in shares:
        secs["asleep"] = max(0.0, 1.0 - sum(shares.values())) * n * wall
    return ClassBudget(processes=n, threads=threads or n, process_seconds=n * wall, seconds=secs)


def budget(*, workers: ClassBudget | None = None, main: ClassBudget | None = None,
           wall: float = 20.0, psi: dict | None = None, notes=()) -> dict:
    classes = {k: v for k, v in (("workers", workers), ("main", main)) if v is not None}
    return TimeBudget(wall_s=wall, classes=classes, io_source="delayacct", samples=1000,
                      hz=50.0, psi_io=psi, notes=list(notes)).to_dict()


def system(*, cores=8, total=30.0, util=5.0, rps=50.0, disk=True, gpu=None,
           budget_d: dict | None = None) -> SystemFigures:
    s = SystemFigures(source="m.jsonl", joined_by="time", samples=20, samples_total=20,
                      cores=cores, cpu_total_pct=_s(total), cpu_iowait_pct=_s(0.0),
                      busiest_core_pct=_s(total), other_cores_pct=_s(total), budget=budget_d)
    if disk:
        s.disk_device = "loop0"
        s.disk_util_pct, s.disk_r_await_ms = _s(util), _s(0.5)
        s.disk_reads_per_s, s.disk_read_mib_s = _s(rps), _s(rps / 10)
    else:
        s.unavailable["disk"] = "fuse filesystem: no block device"
    if gpu is not None:
        s.gpu_util_pct = _s(gpu)
    return s


def inputs(au: float, s: SystemFigures | None = None, workers: int | None = None,
           **kw) -> RuleInputs:
    loader = {"num_workers": workers} if workers is not None else None
    return RuleInputs(au=au, data_share=1 - au, step_time_s=0.1, images_per_s=kw.pop("ips", 500.0),
                      batch_size=256, steps=200, loader=loader, system=s,
                      dataset="/data/train", **kw)


def probe_levels(*pts: tuple[int, float]) -> dict:
    levels = [{"concurrency": c, "files_per_s": r} for c, r in pts]
    best = max(pts, key=lambda p: p[1])
    return {"replay": {"by_concurrency": levels, "steady": []},
            "verdict": {"storage_files_per_s": best[1], "best_concurrency": best[0]}}


IDLE_MAIN = klass(1, on_cpu=0.2, threads=6)


# -- compute, and what a missing budget says ----------------------------------------------

def test_compute_at_and_above_the_line():
    v = decide(inputs(AU_HEALTHY, system()))
    assert v.bottleneck == "compute"
    assert v.next_command == "autotune search /data/train --compute-ms 50 --batch-size 256"


def test_a_dataset_too_small_for_a_cold_search_gets_a_warm_next_search():
    # analyze says why (autotune.analyze.analysis.warm_because); the command follows it.
    for why, tail in (("too few batches", " --warm"), (None, "")):
        inp = inputs(AU_HEALTHY, system())
        inp.warm_because = why
        assert decide(inp).next_command == ("autotune search /data/train --compute-ms 50 "
                                            f"--batch-size 256{tail}")


def test_compute_with_an_idle_gpu_says_so():
    v = decide(inputs(0.97, system(gpu=25.0)))
    assert v.bottleneck == "compute"
    assert any("GPU busy 25 %" in e and "starved" in e for e in v.evidence)
    assert "leaves the GPU idle" in v.advice[0]


def test_no_budget_is_unknown_naming_it():
    v = decide(inputs(0.3, system(), workers=4))
    assert v.bottleneck == "unknown"
    assert "time budget is missing" in v.summary and "SystemFigures.budget" in v.summary
    assert "autotune monitor" in v.summary and "schedstat" in v.summary
    v = decide(inputs(0.3, None, workers=0))
    assert v.bottleneck == "unknown" and "no system metrics" in v.summary
    assert "num_workers=0" in v.advice[0]
    s = system(budget_d={"available": False, "reason": "no /proc/1/task/1/schedstat"})
    v = decide(inputs(0.3, s, workers=4))
    assert v.bottleneck == "unknown" and "no /proc/1/task/1/schedstat" in v.summary


def test_a_budget_without_the_loading_class_is_unknown_naming_it():
    s = system(budget_d=budget(main=IDLE_MAIN))
    v = decide(inputs(0.3, s, workers=4))
    assert v.bottleneck == "unknown" and "no DataLoader worker, yet num_workers=4" in v.summary


# -- storage --------------------------------------------------------------------------------

def test_iops_cap_workers_in_io_is_storage_throughput():
    # 4 workers behind a 100-IOPS cap: blocked in D 85 % of their time; the disk itself
    # shows nothing (%util 4, the cap holds bios before they are accounted).
    s = system(util=4, rps=100, budget_d=budget(workers=klass(4, io=0.85, on_cpu=0.06,
                                                              runnable=0.01), main=IDLE_MAIN,
                                                psi={"scope": "machine", "some_pct": 61.0,
                                                     "full_pct": 40.0}))
    v = decide(inputs(0.3, s, workers=4, probe=probe_levels((1, 95.0), (4, 100.0), (16, 101.0))))
    assert v.bottleneck == "storage", v
    assert "(throughput)" in v.summary and "blocked on storage 85%" in v.summary
    ev = " | ".join(v.evidence)
    assert "workers (4 procs, 4 threads): I/O 85% of their time" in ev
    assert "delay accounting, 1,000 samples at 50 Hz" in ev
    assert "PSI io: some 61 %, full 40 % (the machine's: /proc/pressure/io)" in ev
    assert "do not raise the rate (throughput)" in ev
    assert v.next_command.startswith("autotune convert /data/train")


def test_storage_without_probe_says_which_is_unmeasured():
    s = system(budget_d=budget(workers=klass(4, io=0.85, on_cpu=0.06), main=IDLE_MAIN))
    v = decide(inputs(0.3, s, workers=4))
    assert v.bottleneck == "storage" and "throughput or latency: not measured" in v.summary
    assert any("autotune probe /data/train" in e for e in v.evidence)


@pytest.mark.parametrize("busy", [0.24, 0.28])
def test_near_the_old_threshold_the_answer_holds(busy):
    # The old rule called loaders idle at <= 25 % busy: 24 % said storage, 27 % unknown.
    # Compared with each other, blocked 70 % dominates either way.
    s = system(util=4, rps=100, budget_d=budget(workers=klass(4, io=0.7, on_cpu=busy - 0.02,
                                                              runnable=0.02), main=IDLE_MAIN))
    v = decide(inputs(0.3, s, workers=4))
    assert v.bottleneck == "storage", v


def test_fuse_latency_within_the_bound_is_loader_latency():
    # 2 workers asleep in FUSE requests; the probe: 40 files/s at 2 in flight, 160 at 8.
    s = system(cores=8, disk=False, budget_d=budget(workers=klass(2, storage_wait=0.8,
                                                                  on_cpu=0.1), main=IDLE_MAIN))
    probe = probe_levels((1, 20.0), (2, 40.0), (4, 80.0), (8, 155.0), (16, 160.0))
    v = decide(inputs(0.3, s, workers=2, probe=probe, ips=40.0))
    assert v.bottleneck == "loader", v
    assert "(latency)" in v.summary and "within the" in v.summary
    assert "num_workers=8" in v.advice[0]          # 155 >= 90 % of 160 at 8 in flight
    assert any("storage wait 80%" in e for e in v.evidence)


def test_fuse_latency_beyond_the_bound_is_storage_latency():
    # The same wait, but the storage needs 64 reads in flight and the job may use 8.
    s = system(cores=8, disk=False, budget_d=budget(workers=klass(2, storage_wait=0.8,
                                                                  on_cpu=0.1), main=IDLE_MAIN))
    probe = probe_levels((2, 40.0), (8, 150.0), (64, 1200.0))
    v = decide(inputs(0.3, s, workers=2, probe=probe, ips=40.0, worker_bound=8))
    assert v.bottleneck == "storage", v
    assert "(latency)" in v.summary and "above the 8-worker bound" in v.summary
    # The search's ceiling concurrency says the same without by-concurrency levels.
    v = decide(inputs(0.3, s, workers=2, ips=40.0, storage_ceiling=1200.0,
                      storage_concurrency=64, worker_bound=8))
    assert v.bottleneck == "storage" and "64 reads in flight" in v.summary


def test_a_probe_figure_the_trials_overtook_is_no_ceiling():
    # Seen behind a 300-IOPS cap: the probe's 38 files/s overtaken by the baseline's 94.
    probe = {"verdict": {"storage_files_per_s": 38.0, "best_concurrency": 4}}
    s = system(budget_d=budget(workers=klass(3, io=0.8), main=IDLE_MAIN))
    v = decide(inputs(0.5, s, workers=3, probe=probe, ips=94.0, storage_overtaken=True))
    assert v.bottleneck == "storage"
    assert not any("of the storage ceiling" in e for e in v.evidence), v.evidence
    assert any("overtaken" in e for e in v.evidence)
    v = decide(inputs(0.5, system(), workers=3, probe=probe, ips=94.0))
    assert v.bottleneck == "storage" and "probe's storage ceiling" in v.summary


def test_at_the_probe_ceiling_without_a_budget_is_storage():
    probe = {"verdict": {"storage_files_per_s": 520.0, "best_concurrency": 16}, "fio": None}
    v = decide(inputs(0.4, system(), workers=8, probe=probe, ips=480.0))
    assert v.bottleneck == "storage" and "probe's storage ceiling" in v.summary
    assert any("92% of the storage ceiling 520" in e for e in v.evidence)
    assert any("time budget: missing" in e for e in v.evidence)
    assert decide(inputs(0.4, None, probe=probe, ips=480.0)).bottleneck == "storage"
    # Below it, nothing decides without the budget.
    assert decide(inputs(0.4, system(), workers=8, probe=probe, ips=300.0)).bottleneck == "unknown"



def test_a_given_probe_is_not_advised_again():
    # Storage-bound with --probe given: the ceiling is in the evidence; "measure the
    # storage's ceiling: `autotune probe ...`" would send the user to do it twice.
    probe = probe_levels((1, 40.0), (4, 60.0), (16, 62.0))
    s = system(budget_d=budget(workers=klass(4, io=0.85, on_cpu=0.06), main=IDLE_MAIN))
    v = decide(inputs(0.3, s, workers=4, probe=probe, ips=60.0))
    assert v.bottleneck == "storage", v
    assert not any("autotune probe" in x for x in v.advice), v.advice
    assert v.next_command.startswith("autotune convert /data/train")
    # Without one it is still advised.
    v = decide(inputs(0.3, s, workers=4))
    assert v.bottleneck == "storage" and any("measure the storage's ceiling: `autotune probe"
                                             in x for x in v.advice), v.advice
    # Unknown (no time budget) names the probe only when none was given.
    below = decide(inputs(0.4, system(), workers=8, probe=probe, ips=30.0))
    assert below.bottleneck == "unknown" and not any("autotune probe" in x for x in below.advice)
    assert any("autotune probe" in x for x in decide(inputs(0.4, system(), workers=8)).advice)

def test_a_ceiling_measured_apart_confirms_the_budget():
    s = system(budget_d=budget(workers=klass(8, io=0.8), main=IDLE_MAIN))
    v = decide(inputs(0.4, s, workers=8, ips=480.0, storage_ceiling=500.0,
                      storage_unit="samples/s", storage_concurrency=4))
    assert v.bottleneck == "storage" and "(throughput)" in v.summary
    assert any("96% of the storage ceiling 500 samples/s" in e for e in v.evidence)
    assert any("storage ceiling measured apart agrees" in e for e in v.evidence)


# -- decode and too few workers -------------------------------------------------------------

def test_cpu_heavy_workers_with_the_cores_full_is_decode():
    s = system(cores=2, total=98, budget_d=budget(workers=klass(2, on_cpu=0.8, runnable=0.15),
                                                  main=IDLE_MAIN))
    v = decide(inputs(0.2, s, workers=2))
    assert v.bottleneck == "decode", v
    assert "convert --max-side" in v.advice[0]
    assert any("want 2.10 core(s) (on a CPU + runnable) of 2 usable" in e for e in v.evidence)
    # Under a quota of 1.5 cores (a user's walk read "want 1.47 core(s) ... of 1 usable",
    # while every header said 1.5): the quota's figure, not the whole cores it rounds to.
    q = decide(inputs(0.2, s, workers=2, job_cores=1.5))
    assert any("(on a CPU + runnable) of 1.5 usable" in e for e in q.evidence), q.evidence


def test_a_share_over_100_percent_says_its_threads_ran_at_once():
    """A worker's threads (torch's intra-op pool) can run at once: its on-CPU share per
    process-second passes 100 %, which the verdict said bare ("111% of its time")."""
    s = system(cores=2, total=98, budget_d=budget(workers=klass(1, on_cpu=1.05, runnable=0.06,
                                                                threads=4), main=IDLE_MAIN))
    v = decide(inputs(0.2, s, workers=1))
    assert "111% of its time" in v.summary and "threads together" in v.summary, v.summary
    s = system(cores=2, total=98, budget_d=budget(workers=klass(2, on_cpu=0.8, runnable=0.15),
                                                  main=IDLE_MAIN))
    assert "threads together" not in decide(inputs(0.2, s, workers=2)).summary


def _stages(read: float, decode: float, transform: float, collate: float) -> dict:
    from autotune.data.stages import stage_budget

    after = {"read": read, "decode": decode, "transform": transform, "collate": collate,
             "samples": 1000, "batches": 100}
    return stage_budget({}, after, workers=2, wall_s=20.0)


def test_a_decode_verdict_names_the_pipeline_stage_to_lighten():
    s = system(cores=2, total=98, budget_d=budget(workers=klass(2, on_cpu=0.8, runnable=0.15),
                                                  main=IDLE_MAIN))
    for (r, d, t, c), word in (((1, 30, 6, 1), "decoder simplejpeg"),
                               ((1, 6, 30, 1), "exact: false"),
                               ((1, 6, 6, 30), "uint8 output")):
        v = decide(inputs(0.2, s, workers=2, stages=_stages(r, d, t, c)))
        assert v.bottleneck == "decode", v
        assert word in v.advice[0] and "convert --max-side" in v.advice[1], v.advice
        assert "of the pipeline's time" in v.summary
        assert any(e.startswith("pipeline stages (timed in the loading processes): read")
                   for e in v.evidence), v.evidence
    # The shared advice is not changed by one verdict's insertion.
    assert decide(inputs(0.2, s, workers=2)).advice[0].startswith("decode is the limit")


def test_storage_verdict_shows_the_read_stage_as_evidence_only():
    s = system(cores=8, budget_d=budget(workers=klass(4, io=0.8, on_cpu=0.05), main=IDLE_MAIN))
    v = decide(inputs(0.2, s, workers=4, stages=_stages(30, 2, 1, 0.5)))
    assert v.bottleneck == "storage", v
    assert any("pipeline stages" in e and "read 90%" in e for e in v.evidence), v.evidence
    assert "pipeline's time" not in v.summary


def test_workers_asleep_inside_the_read_stage_are_waiting_on_storage():
    # An object store's client polls its socket with a timeout (poll_schedule_timeout):
    # the kernel's budget reads asleep, the pipeline's clock reads "in read".
    s = system(cores=2, disk=False, budget_d=budget(workers=klass(4, on_cpu=0.07,
                                                                  runnable=0.07),
                                                    main=IDLE_MAIN))
    slow_reads = _stages(93, 4, 2, 1)
    slow_reads["busy"] = 1.0                     # the workers were in the pipeline throughout
    v = decide(inputs(0.13, s, workers=4, stages=slow_reads))
    assert v.bottleneck == "storage" and "blocked on storage 79%" in v.summary, v
    assert any("inside the read stage 93%" in e and "counted as storage wait" in e
               for e in v.evidence), v.evidence
    # Without the stage budget the same kernel figures are the main process's wait.
    assert decide(inputs(0.13, s, workers=4)).bottleneck == "loader"
    # A decode-heavy pipeline asleep between batches is not a storage wait.
    busy_decode = _stages(2, 60, 30, 8)
    busy_decode["busy"] = 0.3
    v = decide(inputs(0.13, s, workers=4, stages=busy_decode))
    assert not any("counted as storage wait" in e for e in v.evidence)


def test_one_worker_on_a_cpu_with_a_free_core_is_loader():
    s = system(cores=2, total=55, budget_d=budget(workers=klass(1, on_cpu=0.9, runnable=0.02),
                                                  main=IDLE_MAIN))
    v = decide(inputs(0.3, s, workers=1))
    assert v.bottleneck == "loader", v
    assert "too few workers" in v.summary and "the job wants 1.1 of 2 core(s)" in v.summary
    assert v.next_command.startswith("autotune search /data/train --compute-ms 100")


def capped(rate: float, **cap) -> SystemFigures:
    """One worker on a CPU 67 %, blocked 21 %, `rate` reads/s charged by a cgroup cap."""
    s = system(cores=2, total=40, budget_d=budget(workers=klass(1, on_cpu=0.67, io=0.21),
                                                  main=IDLE_MAIN))
    s.disk_read_cap = {"iops": None, "mib_s": None, **cap}
    s.disk_cap_reads_per_s, s.disk_cap_read_mib_s = _s(rate), _s(rate * 0.07)
    return s


def test_a_worker_on_a_cpu_whose_reads_reach_its_cgroups_read_cap_is_storage():
    # The CI run that failed: one worker on a CPU 67 %, blocked 21 %, and 61 reads/s charged
    # by its cgroup's cap of 60: the cap holds it back, not the worker count.
    v = decide(inputs(0.08, capped(61.0, iops=60), workers=1))
    assert v.bottleneck == "storage", v
    assert "read cap" in v.summary and "61 reads/s of the 60 allowed" in v.summary
    assert any("caps reads on loop0 at 60 reads/s" in e for e in v.evidence)
    assert "--device-read-iops" in v.advice[0]
    # Well under the cap the cap is said, and the time budget decides.
    v = decide(inputs(0.08, capped(30.0, iops=60), workers=1))
    assert v.bottleneck == "loader" and any("= 50% of it" in e for e in v.evidence), v
    # A bytes cap reached: the same.
    v = decide(inputs(0.08, capped(100.0, mib_s=7.0), workers=1))
    assert v.bottleneck == "storage" and "7.0 MiB/s of the 7.0 allowed" in v.summary, v


def test_a_read_caps_advice_never_says_converting_on_the_capped_disk_helps_a_bytes_cap():
    # bytes/s: shards read the same bytes; only another disk helps.
    v = decide(inputs(0.08, capped(100.0, mib_s=7.0), workers=1))
    assert "a conversion on the capped disk does not help" in v.advice[0], v.advice
    assert "onto a disk the cap does not cover" in v.advice[0], v.advice
    assert "fewer, larger reads" not in " ".join(v.advice), v.advice
    assert v.next_command == "autotune convert /data/train LOCAL_DISK/train-wds --format wds"
    # reads/s: fewer, larger reads do help, wherever the shards are.
    v = decide(inputs(0.08, capped(61.0, iops=60), workers=1))
    assert "fewer, larger reads" in v.advice[0] and "does not help" not in v.advice[0]


def test_the_storage_verdicts_conversion_is_not_beside_the_slow_source():
    s = system(budget_d=budget(workers=klass(4, io=0.85, on_cpu=0.06), main=IDLE_MAIN))
    v = decide(inputs(0.3, s, workers=4, probe=probe_levels((1, 95.0), (4, 100.0), (16, 101.0))))
    assert v.bottleneck == "storage", v
    assert v.next_command == "autotune convert /data/train LOCAL_DISK/train-wds --format wds"
    assert "/data/train-wds" not in v.next_command + " ".join(v.advice)
    advice = " | ".join(v.advice)
    assert "onto a local NVMe or SSD (LOCAL_DISK: a folder there)" in advice
    assert "shards beside SRC are read back from the same storage" in advice
    assert ("`autotune search /data/train --compute-ms 100 --batch-size 256 --convert auto "
            "--stage-dir LOCAL_DISK`") in advice


def test_as_many_busy_workers_as_cores_is_decode():
    # Another worker would only take turns with these two.
    s = system(cores=2, total=97, budget_d=budget(workers=klass(2, on_cpu=0.7, runnable=0.25),
                                                  main=IDLE_MAIN))
    assert decide(inputs(0.3, s, workers=2)).bottleneck == "decode"


def test_a_neighbour_filling_the_cores_leaves_one_busy_worker_loader_bound():
    # Seen on a shared CI machine: one worker on a CPU and runnable, the machine 100 % busy
    # with other jobs. The scheduler shares the cores per task: more workers get more.
    s = system(cores=2, total=100, budget_d=budget(workers=klass(1, on_cpu=0.8, runnable=0.28),
                                                   main=IDLE_MAIN))
    v = decide(inputs(0.31, s, workers=1))
    assert v.bottleneck == "loader", v
    assert "other processes hold" in v.summary and "too few workers" in v.summary


def test_a_job_pinned_to_two_of_64_cores_is_judged_on_those_two():
    b = budget(workers=klass(2, on_cpu=0.9, runnable=0.05), main=IDLE_MAIN)
    s = system(cores=64, total=4, budget_d=b)
    s.job_cpus, s.job_cpus_busy_pct = _s(2), _s(100)
    assert decide(inputs(0.2, s, workers=2)).bottleneck == "decode"
    s.job_cpus = s.job_cpus_busy_pct = None          # unpinned: 2 busy workers of 64 cores
    assert decide(inputs(0.2, s, workers=2)).bottleneck == "loader"


def test_zero_workers_main_on_a_cpu_is_loader():
    # num_workers=0, AU 0.3 (a sleeping step): the main process decodes 65 % of the time.
    s = system(cores=2, total=50, budget_d=budget(main=klass(1, on_cpu=0.65, threads=4)))
    v = decide(inputs(0.3, s, workers=0))
    assert v.bottleneck == "loader", v
    assert "too few workers: 0" in v.summary
    # A text log says nothing of num_workers: a budget with no workers says the same.
    assert decide(inputs(0.3, s)).bottleneck == "loader"
    # Filling both cores with torch's intra-op threads is still loader: workers overlap.
    s = system(cores=2, total=95, budget_d=budget(main=klass(1, on_cpu=1.6, runnable=0.1,
                                                              threads=8)))
    assert decide(inputs(0.18, s, workers=0)).bottleneck == "loader"


def test_zero_workers_a_cpu_step_on_a_busy_machine_is_taken_from_both_cpu_states():
    """num_workers=0, a matmul step (AU 0.58) on a machine whose cores are full: the main
    process is on a CPU half its time and runnable half; the step's share comes out of both
    (a review read "on a CPU 0 %, runnable 97 %" of its loading time, taken all from on-CPU)."""
    s = system(cores=2, total=99, budget_d=budget(main=klass(1, on_cpu=0.5, runnable=0.5)))
    v = decide(inputs(0.58, s, workers=0))
    assert v.bottleneck == "loader", v
    [line] = [e for e in v.evidence if "in its loading time it is" in e]
    assert "on a CPU 50%, runnable 50%" in line, line


def test_zero_workers_blocked_on_io_is_storage():
    s = system(budget_d=budget(main=klass(1, io=0.6, on_cpu=0.1)))
    v = decide(inputs(0.3, s, workers=0))
    assert v.bottleneck == "storage", v
    assert "the main process (num_workers=0) is blocked" in v.summary


# -- the main process ---------------------------------------------------------------------

def test_idle_workers_and_an_asleep_main_is_the_main_process():
    s = system(budget_d=budget(workers=klass(4, on_cpu=0.1, io=0.02),
                               main=klass(1, on_cpu=0.15, threads=6)))
    v = decide(inputs(0.4, s, workers=4))
    assert v.bottleneck == "loader", v
    assert "(main process)" in v.summary and "asleep the rest (IPC, a lock)" in v.summary
    assert "py-spy" in v.advice[0]


def test_idle_workers_and_a_busy_main_names_its_cpu():
    s = system(budget_d=budget(workers=klass(4, on_cpu=0.1),
                               main=klass(1, on_cpu=0.9, threads=6)))
    v = decide(inputs(0.4, s, workers=4))
    assert v.bottleneck == "loader" and "(main process)" in v.summary
    assert "collate, pin or unpickling" in v.summary


def test_workers_asleep_in_a_timer_wait_inside_the_dataset_not_for_the_main_process():
    """Workers asleep in nanosleep (time.sleep in __getitem__, a client's backoff) wait
    inside their own work: more workers overlap it. A stranger's script with a sleeping
    Dataset was told "the wait is in the main process" before."""
    w = klass(2, on_cpu=0.03)
    w.timer_s = 0.9 * w.process_seconds
    s = system(cores=2, budget_d=budget(workers=w, main=IDLE_MAIN))
    v = decide(inputs(0.4, s, workers=2))
    assert v.bottleneck == "loader" and "(waits inside the dataset)" in v.summary, v
    assert "asleep in a timer 90%" in v.summary
    assert "raise num_workers (up to about 8:" in v.advice[0]   # 2 / (1 - 0.9), capped
    # Asleep, but mostly not in a timer: a wait for work, so the main process is the cause.
    w.timer_s = 0.2 * w.process_seconds
    v = decide(inputs(0.4, system(cores=2, budget_d=budget(workers=w, main=IDLE_MAIN)),
                      workers=2))
    assert "(main process)" in v.summary, v


def test_no_data_time_but_a_starved_gpu_is_input_bound():
    s = system(disk=False, gpu=20, budget_d=budget(workers=klass(8, storage_wait=0.7),
                                                   main=IDLE_MAIN))
    v = decide(RuleInputs(au=None, data_share=None, step_time_s=None, images_per_s=None,
                          batch_size=None, steps=10, loader={"num_workers": 8}, system=s))
    assert v.bottleneck == "storage"
    assert any("< 40 %: starved" in e for e in v.evidence)
    v2 = decide(RuleInputs(au=None, data_share=None, step_time_s=None, images_per_s=None,
                           batch_size=None, steps=10))
    assert v2.bottleneck == "unknown" and "no data time" in v2.summary


@pytest.mark.parametrize("au", [0.0, 0.3, 0.89, 0.9, 1.0])
@pytest.mark.parametrize("kind", ["io", "on_cpu", "asleep", None])
def test_every_verdict_has_evidence_and_a_next_command(au, kind):
    b = None if kind is None else budget(workers=klass(2, **{kind: 0.8}), main=IDLE_MAIN)
    v = decide(inputs(au, system(budget_d=b), workers=2))
    assert v.bottleneck in ("storage", "decode", "loader", "compute", "unknown")
    assert v.evidence and v.next_command.startswith("autotune ")
    assert v.to_dict()["bottleneck"] == v.bottleneck


# -- the worker bound and the latency rule --------------------------------------------------

def test_worker_bound():
    assert worker_bound(8) == 8
    assert worker_bound(16, ranks_per_node=4) == 4
    assert worker_bound(2, ranks_per_node=4) == 1
    assert worker_bound(8, blocked_share=0.5) == 16        # cores / (1 - blocked)
    assert worker_bound(8, blocked_share=0.75) == 32
    assert worker_bound(8, blocked_share=0.99) == 32       # at most 4x the cores
    assert worker_bound(32, blocked_share=0.9) == 64       # and 64
    assert worker_bound(8, blocked_share=0.75, memory_bound=12) == 12
    assert worker_bound(2, reads_in_flight=16) == 8
    with pytest.raises(ValueError, match="usable_cores must be at least 1, but got 0"):
        worker_bound(0)


def test_latency_verdict():
    c = latency_verdict(6, 8, rate=160.0, in_flight=2)
    assert c.bottleneck == "loader" and c.within_bound and "raise num_workers to 6" in c.reason
    c = latency_verdict(32, 8)
    assert c.bottleneck == "storage" and c.label == "storage (latency)"
    assert "above the 8-worker bound" in c.reason
    with pytest.raises(ValueError, match="needed_in_flight"):
        latency_verdict(0, 8)


def test_cpu_inside_the_read_stage_is_the_storage_clients_not_decode():
    # Seen behind a 50 ms object store on a busy machine: 4 workers on a CPU 5 %, runnable
    # 39 % (the machine full), asleep 56 %; the pipeline's clock: read 86 % of their time.
    # Decode and the rest took at most 14 %: the CPU was boto3's, per request. Before, the
    # rule said decode ("storage conversion would not help"); shards are the fix.
    s = system(cores=2, total=100, disk=False,
               budget_d=budget(workers=klass(4, on_cpu=0.05, runnable=0.39), main=IDLE_MAIN))
    st = _stages(86, 3, 5, 6)
    st["busy"] = 0.99
    probe = probe_levels((1, 20.0), (8, 150.0), (64, 480.0))
    v = decide(inputs(0.16, s, workers=4, stages=st, probe=probe, ips=41.0, worker_bound=8))
    assert v.bottleneck == "storage", v
    assert "(latency)" in v.summary and "reading 71%" in v.summary, v.summary
    # The figure at the bound beside the demand (256 images/s, batch 256 / 0.1 s here):
    # 150 at 8 in flight, within the search's bound of 8.
    assert ("at the 8-worker bound the storage gives at most 150 files/s (150 at 8 in "
            "flight), below the step's demand of 2,560") in v.summary, v.summary
    assert any("at least 30% was inside the read stage" in e for e in v.evidence), v.evidence
    # Workers as busy, but the pipeline's clock puts their time in decode: decode.
    s = system(cores=2, total=100, disk=False,
               budget_d=budget(workers=klass(4, on_cpu=0.3, runnable=0.5, io=0.1),
                               main=IDLE_MAIN))
    heavy = _stages(12, 60, 23, 5)
    heavy["busy"] = 0.99
    v = decide(inputs(0.16, s, workers=4, stages=heavy, probe=probe, ips=41.0))
    assert v.bottleneck == "decode", v
    assert not any("inside the read stage (the other" in e for e in v.evidence)


def test_the_next_command_names_the_users_dataset_and_step():
    """A search of a user's Dataset (a factory) or step: the verdict's next command carries
    them, else it would search the folder's images with an emulated step, another job."""
    s = system(budget_d=budget(workers=klass(4, on_cpu=0.1), main=IDLE_MAIN))
    v = decide(inputs(0.3, s, workers=4, job_args="--dataset-factory my.py:make"))
    assert v.next_command == ("autotune search /data/train --dataset-factory my.py:make "
                              "--compute-ms 100 --batch-size 256"), v.next_command
    s = system(budget_d=budget(workers=klass(4, on_cpu=0.1), main=IDLE_MAIN))
    v = decide(inputs(0.3, s, workers=4, job_args="--dataset-factory my.py:make --step t:step"))
    assert v.next_command == ("autotune search /data/train --dataset-factory my.py:make "
                              "--step t:step --batch-size 256"), v.next_command


def test_a_read_cap_charged_in_bursts_is_judged_by_the_mean_not_the_median():
    # Seen under `scripts/throttle --read-iops 40` (cgroup v1): blk-throttle charges its
    # queue of throttled bios in bursts, so most half-second samples of a job held at its
    # cap read 0-4 reads/s and a few read several times the cap. The median (2) said "5% of
    # it"; over the window the job was charged the whole cap.
    from autotune.monitor.figures import stat_of

    s = capped(0.0, iops=40)
    s.disk_cap_reads_per_s = stat_of([0, 2, 0, 0, 4, 0, 2, 0, 190, 202])
    s.disk_cap_read_mib_s = None
    v = decide(inputs(0.08, s, workers=1))
    assert v.bottleneck == "storage", v
    assert "40 reads/s of the 40 allowed" in v.summary, v
    assert any("charged the job 40 reads/s = 100% of it" in e for e in v.evidence), v.evidence


def test_workers_started_anew_each_epoch_are_counted_as_many_as_run_at_once():
    # Seen with DataLoader(num_workers=2) over 3 epochs (no persistent_workers): the old
    # workers were still exiting in the sample where the new ones started, 4 processes in
    # one sample, and the verdict said "the 4 workers". 2 ran at a time.
    w = klass(2, io=0.9)
    w.processes, w.threads = 4, 8            # the most seen in one sample
    s = system(cores=2, total=20, budget_d=budget(workers=w, main=IDLE_MAIN))
    v = decide(inputs(0.1, s, workers=2))
    assert v.bottleneck == "storage", v
    assert "the 2 workers are blocked on storage" in v.summary, v.summary
    assert any(e.startswith("workers (2 procs at once, 4 seen, 8 threads)") for e in v.evidence), \
        v.evidence


# -- a CPU quota ----------------------------------------------------------------------------

def quota(share: float, cores: float = 0.5) -> dict:
    return {"cores": cores, "quota_file": "/sys/fs/cgroup/cpu/job/cpu.cfs_quota_us",
            "quota": f"{round(cores * 100000)} (period 100000)",
            "stat_file": "/sys/fs/cgroup/cpu/job/cpu.stat", "periods": 200.0,
            "throttled": 200.0 * share, "throttled_s": 200 * share * 0.05,
            "throttled_share": share}


def _quota_case(q: dict | None) -> SystemFigures:
    """A review's run: 2 workers decoding under 0.5 CPU, the main process 'runnable
    145 %' (the quota's stop, counted by schedstat as run-queue wait)."""
    s = system(cores=2, total=25.0,
               budget_d=budget(workers=klass(2, on_cpu=0.1, runnable=0.2),
                               main=klass(1, on_cpu=0.1, runnable=1.45, threads=6)))
    s.cpu_quota = q
    return s


def test_a_job_throttled_by_its_cpu_quota_is_named_so_not_its_main_process():
    v = decide(inputs(0.3, _quota_case(quota(0.83)), workers=2, job_cores=0.5))
    assert v.bottleneck == "decode", v
    assert v.summary.startswith("decode-bound (a CPU quota): the job's cgroup allows 0.5 CPU "
                                "(/sys/fs/cgroup/cpu/job/cpu.cfs_quota_us)"), v.summary
    assert "throttled in 83% of periods" in v.summary and "main process 145%" in v.summary
    assert "py-spy" not in " ".join(v.advice) and "(main process)" not in v.summary
    assert "docker run --cpus" in v.advice[0] and "resources.limits.cpu" in v.advice[0]
    assert "fewer workers" in v.advice[1]
    assert any(e.startswith("CPU quota: the job's cgroup allows 0.5 CPU") for e in v.evidence)
    # The control: the same budget without a quota is the main process's, as before.
    v = decide(inputs(0.3, _quota_case(None), workers=2, job_cores=2))
    assert "(main process)" in v.summary and "quota" not in v.summary.lower(), v


def test_a_quota_seldom_throttled_leaves_the_verdict_to_the_time_budget():
    v = decide(inputs(0.3, _quota_case(quota(0.1, cores=4.0)), workers=2, job_cores=4))
    assert "(main process)" in v.summary and "quota" not in v.summary.lower(), v
    assert any("throttled in 10 % of 200 periods" in e for e in v.evidence), v.evidence


def test_a_quota_not_seen_is_said_and_a_fractional_core_count_sizes_no_worker_below_one():
    s = _quota_case(None)
    s.unavailable["cpu_quota"] = "the job's cgroup cannot be read: no cgroup cpu hierarchy"
    v = decide(inputs(0.3, s, workers=2, job_cores=0.5))
    assert ("CPU quota: not seen (the job's cgroup cannot be read: no cgroup cpu hierarchy)"
            in v.evidence)
    s = system(cores=2, budget_d=budget(workers=klass(2, on_cpu=0.9), main=IDLE_MAIN))
    v = decide(inputs(0.3, s, workers=2, job_cores=0.5))     # a 0.5-CPU step log header
    assert v.bottleneck == "decode", v
