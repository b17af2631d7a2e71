"""The knee, the baseline and the verdict rules on hand-made trial records (pure logic)."""

from __future__ import annotations

from autotune.search.ceilings import Ceilings
from autotune.search.recommend import (baseline_params, confirm_candidates, confirm_window,
                                       dataloader_snippet, knee, yaml_block)
from autotune.search.records import TrialRecord
from autotune.search.verdict import decide


def rec(n, w, pf, ips, *, au=0.5, rss=500.0, cpu=50.0, util=10.0, state="complete"):
    return TrialRecord(number=n, params={"num_workers": w, "prefetch_factor": pf if w else None,
                                         "persistent_workers": False, "pin_memory": False},
                       state=state, images_per_s=ips, au=au, data_wait_fraction=1 - au,
                       peak_rss_mib=rss, cpu_percent=cpu, disk_util_pct=util)


def test_knee_is_the_cheapest_within_3_percent():
    trials = [rec(0, 8, 4, 400.0), rec(1, 4, 2, 395.0), rec(2, 4, 1, 389.0),
              rec(3, 2, 1, 300.0), rec(4, 6, 1, 399.0)]
    k = knee(trials)
    assert (k.params["num_workers"], k.params["prefetch_factor"]) == (4, 1)  # 389 >= 0.97 * 400


def test_knee_prefers_less_memory_at_equal_cost_and_ignores_failures():
    trials = [rec(0, 4, 2, 400.0, rss=2000), rec(1, 4, 2, 399.0, rss=800),
              rec(2, 1, 1, 900.0, state="failed"), rec(3, 4, 2, 1e9, state="rejected")]
    assert knee(trials).number == 1


def test_knee_of_nothing_is_none():
    assert knee([rec(0, 1, 1, None, state="failed")]) is None


def test_confirmation_takes_the_fastest_and_the_knee_once_each():
    trials = [rec(0, 8, 8, 364.0), rec(1, 3, 4, 311.0), rec(2, 8, 4, 350.0), rec(3, 2, 1, 360.0),
              rec(4, 8, 8, 900.0, state="failed"), rec(5, 0, None, 50.0)]
    assert [t.number for t in confirm_candidates(trials, 3)] == [0, 3, 2]  # 3 is also the knee
    assert [t.number for t in confirm_candidates(trials, 1)] == [0, 3]  # the fastest + the knee
    assert [t.number for t in confirm_candidates(trials[:1], 3)] == [0]
    base = rec(-1, 2, 2, 300.0)
    assert [t.number for t in confirm_candidates(trials, 1, base)] == [0, 3, -1]
    assert [t.number for t in confirm_candidates(trials, 1, rec(-1, 2, 2, None, state="failed"))] == [0, 3]


def test_confirmation_window_outlasts_the_prefetch_queue():
    # 8 workers x 8 batches x 150 ms = 9.6 s of queue: 19.2 s, under 4 x 5 s.
    assert confirm_window({"num_workers": 8, "prefetch_factor": 8}, 5.0, 0.15) == 19.2
    assert confirm_window({"num_workers": 2, "prefetch_factor": 2}, 5.0, 0.15) == 10.0
    assert confirm_window({"num_workers": 8, "prefetch_factor": 8}, 5.0, 1.0) == 20.0  # capped
    assert confirm_window({"num_workers": 0, "prefetch_factor": None}, 5.0, None) == 10.0


def test_baseline_is_the_rule_of_thumb():
    assert baseline_params(2) == {"num_workers": 2, "prefetch_factor": 2,
                                  "persistent_workers": True, "pin_memory": True}
    assert baseline_params(64)["num_workers"] == 8
    # Without a GPU the rule pins nothing: a winning baseline must not recommend it.
    assert baseline_params(2, cuda=False)["pin_memory"] is False


def test_the_snippet_runs_for_a_map_style_and_an_iterable_dataset():
    # Executed, not only compiled: DataLoader refuses shuffle= for an IterableDataset.
    import torch.utils.data

    p = {"num_workers": 0, "prefetch_factor": None, "persistent_workers": False, "pin_memory": False}

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(8))

    for dataset, iterable in ((list(range(8)), False), (Stream(), True)):
        code = dataloader_snippet(p, 4, iterable=iterable)
        ns = {"torch": torch, "dataset": dataset}
        exec(code, ns)
        assert len(list(ns["loader"])) == 2
    assert "shuffle" not in dataloader_snippet(p, 4, iterable=True)


def test_snippets_are_valid_python_and_yaml():
    import yaml

    p = {"num_workers": 3, "prefetch_factor": 4, "persistent_workers": True, "pin_memory": False}
    code = dataloader_snippet(p, 256)
    compile(code, "<snippet>", "exec")
    assert "num_workers=3" in code and "prefetch_factor=4" in code
    assert yaml.safe_load(yaml_block(p, 256))["dataloader"]["num_workers"] == 3
    p0 = {"num_workers": 0, "prefetch_factor": None, "persistent_workers": False, "pin_memory": False}
    assert "prefetch_factor" not in dataloader_snippet(p0, 32)


def _ceil(storage=None, decode=None, demand=None):
    return Ceilings(storage=storage, decode=decode, demand=demand, cores=2)


def _s(v):
    return {"median": v, "p95": v, "max": v, "mean": v, "n": 10}


def _budget(workers: int, **shares: float) -> dict:
    """A time budget of a 10 s window: `workers` processes each spending `shares` of it in
    each state, the main process mostly asleep."""
    from autotune.monitor.timebudget import STATES, ClassBudget, TimeBudget

    def klass(n, sh):
        secs = {k: sh.get(k, 0.0) * n * 10.0 for k in STATES}
        secs["asleep"] = max(0.0, 1.0 - sum(sh.values())) * n * 10.0
        return ClassBudget(processes=n, threads=n, process_seconds=n * 10.0, seconds=secs)

    return TimeBudget(wall_s=10.0, classes={"workers": klass(workers, shares),
                                            "main": klass(1, {"on_cpu": 0.1})},
                      io_source="state-sampling", samples=500, hz=50.0).to_dict()


def _figs(*, total, busiest, others, tree, util=5.0, rps=50.0, disk=True, budget=None):
    """What the monitor saw in a trial's window (SystemFigures.to_dict())."""
    d = {"budget": budget, "source": "bench monitor", "joined_by": "measured window", "samples": 20,
         "samples_total": 20, "cores": 2, "cpu_total_pct": _s(total),
         "cpu_iowait_pct": _s(0.0), "busiest_core_pct": _s(busiest),
         "other_cores_pct": _s(others), "proc_cpu_pct": _s(tree), "unavailable": {}}
    if disk:
        d.update(disk_device="vda", disk_util_pct=_s(util), disk_r_await_ms=_s(1.0),
                 disk_reads_per_s=_s(rps), disk_read_mib_s=_s(rps / 10))
    return d


def _with(r, **figs):
    r.system_figures = _figs(**figs)
    r.batches, r.step_ms = 100, 100.0
    return r


def test_verdicts_come_from_the_window_of_the_recommendation():
    healthy = _with(rec(0, 4, 2, 420.0, au=0.95), total=60, busiest=70, others=50, tree=120)
    assert decide(healthy, healthy, _ceil(5000, 700, 440)).bottleneck == "compute"
    # Loaders blocked on reads: storage, from the monitor's budget, not from a ceiling.
    slow_disk = _with(rec(0, 8, 2, 190.0, au=0.4), total=20, busiest=25, others=15, tree=40,
                      util=99, rps=300, budget=_budget(8, io=0.8, on_cpu=0.05))
    v = decide(slow_disk, slow_disk, _ceil(None, 700, 440), worker_bound=8)
    assert v.bottleneck == "storage" and "blocked on storage 80%" in v.summary and v.advice
    assert any("%util 99" in e for e in v.evidence)
    # Without the budget the same window is unknown, and says what is missing.
    slow_disk.system_figures["budget"] = None
    v = decide(slow_disk, slow_disk, _ceil(None, 700, 440), worker_bound=8)
    assert v.bottleneck == "unknown" and "time budget is missing" in v.summary
    cpu = _with(rec(0, 2, 2, 650.0, au=0.5), total=97, busiest=98, others=96, tree=190,
                budget=_budget(2, on_cpu=0.9, runnable=0.05))
    assert decide(cpu, cpu, _ceil(5000, 700, 1000)).bottleneck == "decode"
    one = _with(rec(0, 1, 1, 150.0, au=0.3), total=50, busiest=97, others=5, tree=95,
                budget=_budget(1, on_cpu=0.9))
    v = decide(one, one, _ceil(5000, 700, 1000))
    assert v.bottleneck == "loader" and "too few workers" in v.summary
    # Evidence carries the figures behind the verdict, the ceilings included.
    assert any("storage ceiling 5,000 images/s" in e for e in v.evidence)


def test_a_trial_above_a_ceiling_never_makes_the_verdict_circular():
    # Before: a storage ceiling of 60 overtaken by trials at 300 and 180 became 300, and
    # the best was "100 % of the storage ceiling 300": storage, by construction.
    c = _ceil(60, 700, 440)
    c.revise(1, 180.0)
    c.revise(0, 300.0)
    assert c.valid("storage") is None and c.to_dict()["storage"] is None
    assert c.lower_bounds["storage"]["measured"] == 60 and c.lower_bounds["storage"]["at_least"] == 300
    best = _with(rec(0, 2, 2, 300.0, au=0.6), total=96, busiest=97, others=95, tree=190,
                 budget=_budget(2, on_cpu=0.9, runnable=0.05))
    v = decide(best, best, c)
    assert v.bottleneck == "decode"                          # the CPUs say so
    assert not any("of the storage ceiling" in e for e in v.evidence)
    assert any("storage ceiling: not used (60 measured, overtaken by 300" in e for e in v.evidence)


def test_an_overtaken_ceiling_is_a_wrong_measurement_and_stops_nothing():
    c = Ceilings(storage=15.0, decode=587.0, demand=427.0, cores=2)
    assert c.smallest(firm=True) == ("storage", 15.0)
    assert c.revise(0, 16.0) is None  # within noise of the ceiling: it stands
    note = c.revise(-1, 290.0)
    assert note and "storage ceiling 15 images/s was a wrong measurement: the baseline measured 290" in note
    assert c.storage == 15.0 and c.valid("storage") is None and note in c.evidence
    assert c.smallest() == ("demand", 427.0)  # no early stop on a known wrong measurement
    assert c.revise(3, 300.0) is None and c.lower_bounds["storage"]["at_least"] == 300.0
    assert c.to_dict()["lower_bounds"]["storage"]["reason"] == note
    back = Ceilings.from_dict(c.to_dict())                   # a resumed study keeps it
    assert back.valid("storage") is None and back.storage == 15.0


def test_ordered_choices_are_numbers_to_tpe_and_snap_to_the_list():
    import optuna

    from autotune.search.space import load_space

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space("default", cores=2, cuda=False, best_concurrency=16)
    assert space.num_workers == [0, 1, 2, 3, 4, 6, 8]
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=1))
    seen = set()
    for _ in range(60):
        t = study.ask()
        p = space.suggest(t)
        assert p["num_workers"] in space.num_workers
        assert p["prefetch_factor"] in (space.prefetch_factor if p["num_workers"] else [None])
        seen.add(p["num_workers"])
        study.tell(t, 1.0)
    assert seen == set(space.num_workers)  # every choice reachable
    # Optuna records an index into the ordered choices: the value measured, exactly
    # (before: an int drawn in 0..8 and snapped, so Optuna learnt 5 for a measured 4).
    t0 = study.trials[0]
    dist = t0.distributions["num_workers_index"]
    assert isinstance(dist, optuna.distributions.IntDistribution) and (dist.low, dist.high) == (0, 6)
    assert space.num_workers[t0.params["num_workers_index"]] == space.from_optuna(t0.params)["num_workers"]
    cfg = {"num_workers": 6, "prefetch_factor": 8, "persistent_workers": True, "pin_memory": False}
    study.enqueue_trial(space.optuna_params(cfg))
    p = space.suggest(study.ask())  # a grid enqueues exact values: they come back as given
    assert p == cfg


def test_loop_commands_carry_the_search_options():
    from autotune.search import SearchOptions
    from autotune.search.loop import search_flags

    f = search_flags(SearchOptions(batch_size=64, compute_ms=150.0, space="small", trials=6,
                                   seconds=8.0, probe_fio=False, cold=False))
    assert f == (" --batch-size 64 --compute-ms 150 --space small --trials 6 --seconds 8"
                 " --warm --no-fio")
    assert search_flags(SearchOptions()) == ""  # all defaults: nothing to add


def _probed(klass, iops, files_per_s):
    from types import SimpleNamespace

    probe = {"filesystem": {"class": klass}, "fio": {"rand_read": {"iops": iops}} if iops else None,
             "replay": {"by_concurrency": [{"concurrency": c, "files_per_s": f}
                                           for c, f in zip((1, 4, 16, 64), files_per_s)]}}
    return SimpleNamespace(ceilings=SimpleNamespace(probe=probe))


def test_format_advice_never_sends_slow_storage_to_lmdb():
    from autotune.search.loop import choose_format

    # Figures of the probes in the README: local flash, a 500-IOPS cap, a 5 ms FUSE delay.
    assert choose_format("auto", _probed("ssd", 96_362, [4412, 6669, 6000, 5800]))[0] == "lmdb"
    fmt, why = choose_format("auto", _probed("hdd", 501, [463, 471, 470, 471]))
    assert fmt == "wds" and "501 random IOPS" in why
    fmt, why = choose_format("auto", _probed("network", None, [70, 250, 485, 480]))
    assert fmt == "wds" and "fio not run" in why and "6.9x" in why
    # Fast flash whose files come 3x faster with concurrency: latency-bound, shards.
    assert choose_format("auto", _probed("nvme", 400_000, [1000, 3000, 3100, 3000]))[0] == "wds"
    assert choose_format("lmdb", _probed("hdd", 100, [50, 50, 50, 50])) == ("lmdb", "--convert lmdb")


def test_the_memory_bound_takes_the_tree_s_pss_where_it_was_read():
    """A 2-worker trial in a 512 MiB container: RSS summed 684 MiB (torch's pages in each
    worker), while the cgroup was charged less than its limit (the trial ran there). The
    figure --max-memory bounds is the PSS; RSS only where PSS could not be read."""
    d = {"images_per_s": 356.0, "peak_rss_mib": 684.0, "peak_pss_mib": 300.0,
         "system": {"shm": {"used_mib_max": 18.0}}}
    r = TrialRecord.from_bench(0, {"num_workers": 2}, d)
    assert (r.memory_mib, r.memory_kind) == (318.0, "PSS")
    r = TrialRecord.from_bench(0, {"num_workers": 2}, {**d, "peak_pss_mib": None})
    assert (r.memory_mib, r.memory_kind) == (702.0, "RSS")
