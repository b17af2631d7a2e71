"""The verdict rules on figures made up to sit on each side of each rule."""

from __future__ import annotations

import pytest

from autotune.monitor.figures import SystemFigures
from autotune.verdict.rules import RuleInputs, decide
from autotune.thresholds import AU_HEALTHY


def _s(v: float) -> dict[str, float]:
    return {"median": v, "p95": v, "max": v, "mean": v, "n": 10}


def system(*, cores=8, total=30.0, busiest=40.0, others=25.0, tree=None, wanted=None,
           run_wait=0.0, procs=None, util=5.0, r_await=0.5, rps=50.0, mib=4.0, gpu=None,
           disk=True) -> SystemFigures:
    s = SystemFigures(source="m.jsonl", joined_by="time", samples=20, samples_total=20,
                      cores=cores, cpu_total_pct=_s(total), cpu_iowait_pct=_s(0.0),
                      busiest_core_pct=_s(busiest), other_cores_pct=_s(others))
    if tree is not None:
        s.proc_cpu_pct = _s(tree)
    if wanted is not None:
        s.sched_wanted_pct, s.sched_run_wait_pct = _s(wanted), _s(run_wait)
    if procs is not None:
        s.proc_processes = _s(procs)
    if disk:
        s.disk_device = "nvme0n1"
        s.disk_util_pct, s.disk_r_await_ms = _s(util), _s(r_await)
        s.disk_reads_per_s, s.disk_read_mib_s = _s(rps), _s(mib)
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


def test_compute_at_and_above_the_line():
    v = decide(inputs(AU_HEALTHY, system(tree=100)))
    assert v.bottleneck == "compute"
    assert v.next_command == "autotune search /data/train --compute-ms 50 --batch-size 256"
    assert decide(inputs(0.89, None)).bottleneck == "unknown"   # input-bound, no metrics


def test_compute_with_an_idle_gpu_says_so():
    v = decide(inputs(0.97, system(gpu=25.0)))
    assert v.bottleneck == "compute"
    assert any("GPU busy 25 %" in e and "starved" in e for e in v.evidence)
    assert "leaves the GPU idle" in v.advice[0]


def test_loader_one_core_pinned_others_idle():
    # 2 workers on 8 cores, each on a CPU all the time: too few workers.
    v = decide(inputs(0.3, system(tree=200, total=27, busiest=98, others=15), workers=2))
    assert v.bottleneck == "loader", v
    assert any("one core near 100 %" in e for e in v.evidence)
    assert v.next_command.startswith("autotune search /data/train --compute-ms 100")


def test_loader_zero_workers_counts_only_the_loading_time():
    # The main process loads 80 % of the time and is on a CPU then: 0.8 cores is "busy"
    # (even if its step burnt a whole core for the other 20 %: (0.8 - 0.2) / 0.8).
    v = decide(inputs(0.2, system(cores=2, tree=80, total=45), workers=0))
    assert v.bottleneck == "loader"
    # ... but the same 0.8 cores spread over 4 workers is idle loaders: storage.
    assert decide(inputs(0.2, system(cores=16, tree=80, total=10), workers=4)).bottleneck == "storage"


def test_zero_workers_filling_the_cores_with_torch_threads_is_still_loader():
    # Measured in tests/analyze/test_setups.py: num_workers=0 on 2 cores, the main
    # process's tasks wanting 1.77 cores (intra-op threads) while the step waits 82 %.
    s = system(cores=2, tree=164, wanted=177, run_wait=1, total=90, busiest=100, others=80,
               rps=0, mib=0)
    v = decide(inputs(0.18, s, workers=0))
    assert v.bottleneck == "loader", v
    assert any("intra-op" in e for e in v.evidence)
    # A text log says nothing of num_workers: a one-process tree says the same.
    s.proc_processes = {"median": 1.0, "p95": 1.0, "max": 1.0, "mean": 1.0, "n": 10}
    assert decide(inputs(0.18, s)).bottleneck == "loader"
    # The same CPU figures with workers loading are decode: they already overlap the step.
    assert decide(inputs(0.18, s, workers=2)).bottleneck == "decode"


def test_run_queue_wait_tells_contention_from_io():
    # One loader getting only 0.3 of a core on a saturated machine, but runnable the rest:
    # it wants CPU -> loader. Without run-queue figures this would be a guess.
    contended = system(cores=2, tree=30, wanted=100, run_wait=70, total=100, rps=0, mib=0)
    assert decide(inputs(0.05, contended, workers=0)).bottleneck == "loader"
    # Eight workers asleep on reads on the same saturated machine -> storage.
    io = system(cores=2, tree=15, wanted=60, run_wait=40, total=100, rps=40, mib=3)
    assert decide(inputs(0.1, io, workers=8)).bottleneck == "storage"


def test_decode_when_the_job_saturates_the_cores():
    v = decide(inputs(0.2, system(cores=4, tree=390, total=98, busiest=100, others=97), workers=8))
    assert v.bottleneck == "decode"
    assert "convert --max-side" in v.advice[0]


def test_storage_idle_loaders_busy_disk():
    v = decide(inputs(0.2, system(tree=60, util=97, r_await=25, rps=900), workers=8))
    assert v.bottleneck == "storage"
    assert "disk %util 97" in v.summary
    assert v.next_command == "autotune convert /data/train /data/train-wds --format wds"


def test_storage_bursty_disk_is_named():
    s = system(tree=40, util=30, r_await=2, rps=400)
    s.disk_util_pct = {"median": 30.0, "p95": 99.0, "max": 100.0, "mean": 45.0, "n": 10}
    v = decide(inputs(0.2, s, workers=8))
    assert v.bottleneck == "storage" and "busy in bursts (%util median 30, p95 99)" in v.summary


def test_storage_on_network_filesystem_without_disk_figures():
    v = decide(inputs(0.2, system(tree=40, disk=False), workers=8))
    assert v.bottleneck == "storage" and "network or FUSE" in v.summary


def test_idle_loaders_but_the_watched_disk_reads_nothing_is_unknown():
    v = decide(inputs(0.2, system(tree=40, rps=0, mib=0), workers=8))
    assert v.bottleneck == "unknown" and "reads nothing" in v.summary
    assert "--data" in v.advice[0]


def test_probe_at_ceiling_is_storage():
    probe = {"verdict": {"storage_files_per_s": 520.0, "best_concurrency": 16}, "fio": None}
    v = decide(inputs(0.4, system(tree=150, util=30), workers=8, probe=probe, ips=480.0))
    assert v.bottleneck == "storage" and "probe's storage ceiling" in v.summary
    assert any("92% of the storage ceiling 520" in e for e in v.evidence)
    # Without metrics the probe still decides it.
    assert decide(inputs(0.4, None, probe=probe, ips=480.0)).bottleneck == "storage"


def test_a_probe_figure_the_trials_overtook_is_no_ceiling():
    # Seen behind a 300-IOPS cap: the probe's 38 files/s overtaken by the baseline's 94,
    # the search said "a wrong measurement", and the verdict still read "storage-bound: at
    # the probe's storage ceiling" (94 = 245 % of it) from the probe it had set aside.
    probe = {"verdict": {"storage_files_per_s": 38.0, "best_concurrency": 4}}
    v = decide(inputs(0.5, system(tree=150, util=30), workers=3, probe=probe, ips=94.0,
                      storage_overtaken=True))
    assert "storage ceiling" not in v.summary
    assert not any("of the storage ceiling" in e for e in v.evidence), v.evidence
    v = decide(inputs(0.5, system(tree=150, util=30), workers=3, probe=probe, ips=94.0))
    assert "probe's storage ceiling" in v.summary


def test_probe_headroom_with_waiting_loaders_is_latency_loader():
    probe = {"verdict": {"storage_files_per_s": 20000.0, "best_concurrency": 64}}
    v = decide(inputs(0.3, system(tree=30, util=10, r_await=8), workers=2, probe=probe, ips=900.0))
    assert v.bottleneck == "loader" and "latency" in v.summary
    assert "64 reads in flight" in v.advice[0]


def test_fio_iops_ceiling_from_disk_reads():
    probe = {"verdict": {"storage_files_per_s": None}, "fio": {"plausible": True,
                                                               "rand_read": {"iops": 500.0}}}
    v = decide(inputs(0.3, system(tree=100, rps=480, util=20), workers=8, probe=probe))
    assert v.bottleneck == "storage"
    assert any("96% of fio's 500 random-read IOPS" in e for e in v.evidence)


def test_unknown_in_between_says_why():
    v = decide(inputs(0.5, system(tree=320, total=50, util=20), workers=8))   # 40 % busy each
    assert v.bottleneck == "unknown" and "neither" in v.summary
    assert v.next_command.startswith("autotune probe /data/train")


def test_no_data_time_but_a_starved_gpu_is_input_bound():
    s = system(tree=40, disk=False, gpu=20)
    v = decide(RuleInputs(au=None, data_share=None, step_time_s=None, images_per_s=None,
                          batch_size=None, steps=10, loader={"num_workers": 8}, system=s))
    assert v.bottleneck == "storage"
    assert any("< 40 %: starved" in e for e in v.evidence)
    v2 = decide(RuleInputs(au=None, data_share=None, step_time_s=None, images_per_s=None,
                           batch_size=None, steps=10))
    assert v2.bottleneck == "unknown" and "no data time" in v2.summary


@pytest.mark.parametrize("au", [0.0, 0.3, 0.89, 0.9, 1.0])
def test_every_verdict_has_evidence_and_a_next_command(au):
    v = decide(inputs(au, system(tree=100)))
    assert v.bottleneck in ("storage", "decode", "loader", "compute", "unknown")
    assert v.evidence and v.next_command.startswith("autotune ")
    assert v.to_dict()["bottleneck"] == v.bottleneck


def test_a_job_pinned_to_two_of_64_cores_is_judged_on_those_two():
    s = system(cores=64, total=4, tree=200, wanted=200, busiest=100, others=2, rps=0, mib=0)
    s.job_cpus, s.job_cpus_busy_pct = _s(2), _s(100)
    v = decide(inputs(0.2, s, workers=2))
    assert v.bottleneck == "decode", v
    assert any("the job's CPUs 100 % of 2 core(s) (pinned; the machine has 64)" in e
               for e in v.evidence)
    s.job_cpus = s.job_cpus_busy_pct = None          # unpinned: 2 busy workers of 64 cores
    assert decide(inputs(0.2, s, workers=2)).bottleneck == "loader"


def test_latency_beyond_the_worker_bound_is_storage():
    # The NFS-like case: the loaders wait on reads, the storage gives more only with 64
    # reads in flight, and the search may use 8 workers: settings cannot hide it.
    probe = {"verdict": {"storage_files_per_s": 2000.0, "best_concurrency": 64}}
    fuse = system(tree=40, disk=False)
    v = decide(inputs(0.3, fuse, workers=8, probe=probe, ips=300.0, worker_bound=8))
    assert v.bottleneck == "storage" and "latency" in v.summary and "8-worker bound" in v.summary
    assert any("only with 64 reads in flight, more than the 8 workers" in e for e in v.evidence)
    # Within the bound the settings can: loader (latency), as before.
    v = decide(inputs(0.3, fuse, workers=8, probe=probe, ips=300.0, worker_bound=64))
    assert v.bottleneck == "loader" and "latency" in v.summary


def test_a_ceiling_measured_apart_is_used_in_its_own_unit():
    # A conversion's storage ceiling is samples/s through its reader, given by the search.
    v = decide(inputs(0.4, system(tree=150, util=30), workers=8, ips=480.0,
                      storage_ceiling=500.0, storage_unit="samples/s", storage_concurrency=4))
    assert v.bottleneck == "storage" and "measured apart" in v.summary
    assert any("96% of the storage ceiling 500 samples/s" in e for e in v.evidence)


def test_at_the_decode_ceiling_with_busy_cpus_is_decode():
    # Reading at 90 % of what the pipeline decodes from memory on every usable core.
    v = decide(inputs(0.5, system(cores=2, total=70, busiest=75, others=65, tree=140),
                      workers=2, ips=630.0, decode_ceiling=700.0))
    assert v.bottleneck == "decode"
    assert any("90% of the decode ceiling 700" in e for e in v.evidence)
