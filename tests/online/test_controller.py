"""The controller's decisions from given windows (in addition to the real runs in
test_tuning.py), and its settings cache."""

from __future__ import annotations

import json
import logging

from autotune.online import cache
from autotune.online.config import Config
from autotune.online.controller import Controller, MemoryFigures
from autotune.online.measure import (NOISE_TARGET, Meter, WindowStats, beyond_noise,
                                     window_batches)


def _w(share, noise=0.01, n=20, wall=1.0):
    return WindowStats(n, share * wall, (1 - share) * wall, noise)


def _ctl(bound=16, budget=10**12, per_worker=1, per_batch=0, **kw):
    return Controller(fixed=kw.pop("fixed", {}), cuda=False, budget=budget,
                      memory=lambda: MemoryFigures(per_worker, per_batch, True), bound=bound,
                      **kw)


def test_window_size_and_noise():
    assert window_batches(0, None) == 10
    assert window_batches(4, 4) == 32
    m = Meter(10)
    steady = [m.add(0.01, 0.03) for i in range(10)]
    assert steady[:9] == [None] * 9 and steady[9].batches == 10
    # Every batch alike: no spread, no noise.
    assert steady[9].noise < 1e-12 and abs(steady[9].wait_share - 0.75) < 1e-9
    # The noise is the per-batch spread's: alternating waits of 0.01 and 0.03 (step 0.01)
    # give a standard error of sqrt(10 * (1/300)**2 / 90) / 0.03 = 1/27.
    alt = [m.add(0.01, 0.01 if i % 2 else 0.03) for i in range(10)][-1]
    assert abs(alt.noise - 1 / 27) < 1e-9 and abs(alt.wait_share - 0.2 / 0.3) < 1e-9
    ramp = [m.add(0.01, 0.002 * i) for i in range(10)][-1]
    assert ramp.noise > 0.05
    assert not beyond_noise(_w(0.30, 0.02), _w(0.27, 0.02))
    assert beyond_noise(_w(0.30, 0.02), _w(0.20, 0.02))


def test_a_slow_window_closes_on_time_once_its_noise_is_low():
    """Behind a slow disk (3 s a batch) a window of 10 batches would take 30 s: it closes
    after 5 batches spanning 15 s, its wait share's noise from the batches' own spread
    being small; erratic batches keep it open to the full 10."""
    m = Meter(10)
    got = [m.add(0.25, 2.75 + 0.05 * (i % 2)) for i in range(5)]
    assert got[:4] == [None] * 4 and got[4] is not None and got[4].batches == 5
    assert got[4].noise <= NOISE_TARGET
    m.reset()
    erratic = [m.add(0.25, w) for w in (0.1, 0.1, 0.1, 6, 6, 6, 0.1, 0.1, 6, 6)]
    assert erratic[:9] == [None] * 9 and erratic[9].batches == 10
    # Two workers sharing the disk: their batches come in pairs, a long wait then none.
    # Per batch that is spread; per round of the two workers it is steady: closed after
    # three rounds.
    pairs = [m.add(0.25, 0.0 if i % 2 else 2.0) for i in range(10)]
    assert pairs[:9] == [None] * 9
    m.reset(group=2)
    pairs = [m.add(0.25, 0.0 if i % 2 else 2.0) for i in range(6)]
    assert pairs[:5] == [None] * 5 and pairs[5].batches == 6 and pairs[5].noise < 1e-12
    # Fast batches (a 250 ms step, no wait): the window is full at 10 batches in 2.5 s,
    # before any time rule could close it.
    m.reset(group=1)
    fast = [m.add(0.25, 0.001) for _ in range(10)]
    assert fast[:9] == [None] * 9 and fast[9].batches == 10
    # Under DDP (early=False) only the size closes it.
    d = Meter(10, early=False)
    assert all(d.add(0.25, 2.75) is None for _ in range(9))


def test_skipping_a_new_pools_queue_ends_at_the_first_batch_that_waited():
    m = Meter(5)
    m.reset(skip=8)
    # A queue filled while the old pool drained: batches without a wait, all skipped.
    assert [m.add(0.25, 0.0) for _ in range(8)] == [None] * 8 and m.steps == []
    m.reset(skip=8)
    # Behind a slow disk the queue never fills: after the first batch, one that waited
    # longer than the step is counted, and the skip ends there.
    assert m.add(0.25, 3.0) is None and m.steps == []
    m.add(0.25, 3.0)
    assert m.steps == [0.25] and m.skip == 0


def test_climbs_one_knob_at_a_time_then_settles(decisions):
    c = _ctl()
    start = c.start()
    assert (start.num_workers, start.prefetch_factor) == (8, 2)
    nxt = c.observe(_w(0.50), start)
    assert (nxt.num_workers, nxt.prefetch_factor) == (9, 2)
    nxt2 = c.observe(_w(0.30), nxt)           # kept: 50 % -> 30 %
    assert nxt2.num_workers == 10
    nxt3 = c.observe(_w(0.29, 0.02), nxt2)    # within the noise: next knob, from the best
    assert (nxt3.num_workers, nxt3.prefetch_factor) == (9, 4)
    assert c.observe(_w(0.02), nxt3) is None  # AU 0.98: one more window of it
    assert c.phase == "confirm"
    assert c.observe(_w(0.03), nxt3) is None  # AU 0.97 again: settled where it is
    assert c.phase == "settled" and c.tuned == nxt3
    events = [e for e, _ in decisions()]
    assert events == ["start", "try", "keep", "try", "reject", "try", "keep", "settle"]


def test_rejected_last_knob_goes_back_to_the_best(decisions):
    c = _ctl(bound=2)
    start = c.start()                         # 2 workers: the bound
    pf4 = c.observe(_w(0.5), start)
    assert (pf4.num_workers, pf4.prefetch_factor) == (2, 4)
    back = c.observe(_w(0.49), pf4)
    assert back == start and c.phase == "settled"
    # A knob that made it worse is said to be worse, not "within the noise".
    c2 = _ctl(bound=2)
    pf4 = c2.observe(_w(0.55), c2.start())
    c2.observe(_w(0.75), pf4)
    said = [r.getMessage() for e, r in decisions() if e == "reject"]
    assert said[0].endswith("within the noise; back to " + start.short()), said
    assert "wait 55 % -> 75 %, worse; back to" in said[1], said


def test_tunes_again_only_after_several_high_windows(decisions):
    c = _ctl(bound=2)
    start = c.start()
    assert c.observe(_w(0.03), start) is None and c.phase == "confirm"
    assert c.observe(_w(0.03), start) is None and c.phase == "settled"
    assert c.observe(_w(0.30), start) is None
    assert c.observe(_w(0.02), start) is None      # one high window is not enough
    assert c.observe(_w(0.30), start) is None
    assert c.observe(_w(0.30), start) is None
    again = c.observe(_w(0.30), start)
    assert again is not None and again.prefetch_factor == 4
    assert [e for e, _ in decisions()].count("retune") == 1


def test_memory_budget_refuses_and_names_the_figures(decisions):
    # 8 workers of 100 MiB: a ninth needs 8 + 9 workers alive during the switch.
    mib = 2**20
    c = _ctl(bound=16, budget=1500 * mib, per_worker=100 * mib, per_batch=0)
    start = c.start()
    assert c.observe(_w(0.5), start) is None
    assert c.phase == "settled"
    msgs = [r.getMessage() for e, r in decisions() if e == "bound"]
    assert any("memory budget of 1,500 MiB" in m and "1,700 MiB" in m for m in msgs)


def test_start_is_capped_by_the_budget():
    mib = 2**20
    c = _ctl(bound=8, budget=350 * mib, per_worker=100 * mib)
    assert c.start().num_workers == 3


def test_fixed_settings_are_kept():
    c = _ctl(fixed={"num_workers": 3, "persistent_workers": False})
    start = c.start()
    assert (start.num_workers, start.persistent_workers) == (3, False)
    assert c.knobs == ["prefetch_factor"]
    assert c.observe(_w(0.5), start).num_workers == 3
    assert _ctl(fixed={"num_workers": 0}).knobs == []


def test_settled_settings_are_cached_and_used(tmp_path):
    key = cache.dataset_key(object(), "mine", 32, 2)
    c = _ctl(bound=4, cache_key=key)
    start = c.start()
    c.observe(_w(0.01), start)
    c.observe(_w(0.01), start)                # the second healthy window settles it
    stored = json.loads(cache.cache_file().read_text())
    assert stored[key] == {"num_workers": 4, "prefetch_factor": 2}
    cache.store(key, {"num_workers": 3, "prefetch_factor": 4})
    again = _ctl(bound=4, cache_key=key).start()
    assert (again.num_workers, again.prefetch_factor) == (3, 4)
    # No temporary file left; the lock beside it stays (removing it would race a holder).
    assert sorted(p.name for p in cache.cache_file().parent.iterdir()) == [
        "online.json", "online.json.lock"]


def test_a_run_cut_to_its_dev_shm_room_leaves_the_cached_start_point(tmp_path, caplog):
    """A full /dev/shm cut the start point to no workers, and the run settled there: the
    cache held num_workers 0 for the dataset, and the next run, with room, started from it
    (seen in a docs walk-through). Such a run's settled point is its room's, not kept."""
    key = cache.dataset_key(object(), "mine", 32, 2)
    cache.store(key, {"num_workers": 3, "prefetch_factor": 2})
    c = _ctl(bound=4, cache_key=key, per_batch=2**20)
    c.shm = 0                                 # no room for a worker's batch
    start = c.start()
    assert start.num_workers == 0 and c.cut
    with caplog.at_level("INFO", logger="autotune.online"):
        c.observe(_w(0.01), start)
        c.observe(_w(0.01), start)            # settled, at no workers
    assert c.phase == "settled"
    assert json.loads(cache.cache_file().read_text())[key] == {"num_workers": 3,
                                                               "prefetch_factor": 2}
    assert any("not written: this run's start point was cut" in r.getMessage()
               for r in caplog.records)


def test_cache_key_names_the_dataset_root(tmp_path):
    class WithRoot:
        root = str(tmp_path)

        def __len__(self):
            return 7
    assert cache.dataset_key(WithRoot(), None, 4, 2) == f"{tmp_path}|len=7|batch=4|cores=2"
    assert cache.dataset_key([1, 2], None, 4, 2).startswith("builtins.list|len=2")
    # the ranks on the node: each rank's share is another start point; one rank keeps the
    # keys written before
    assert cache.dataset_key(WithRoot(), None, 4, 2, 1) == f"{tmp_path}|len=7|batch=4|cores=2"
    assert cache.dataset_key(WithRoot(), None, 4, 2, 4).endswith("|cores=2|ranks=4")


def test_switch_costs_are_charged_to_the_trial_that_caused_them():
    c = _ctl(bound=2)
    start = c.start()
    pf4 = c.observe(_w(0.5), start)
    c.charge(pf4, 0.25)                        # the switch to the trial
    back = c.observe(_w(0.49), pf4)            # rejected: back to the start
    c.charge(back, 0.5)                        # the way back, caused by the trial too
    costs = {t.config: t.switch_cost_s for t in c.trials}
    assert costs[pf4] == 0.75 and costs.get(start, 0.0) == 0.0
    assert c.switch_cost_s == 0.75


def _budget(workers=None, main=None, wall=3.0):
    from autotune.monitor.timebudget import ClassBudget, TimeBudget

    def klass(procs, **shares):
        secs = {k: v * procs * wall for k, v in shares.items()}
        secs["asleep"] = max(0.0, procs * wall - sum(secs.values()))
        return ClassBudget(procs, procs, procs * wall, secs)
    classes = {}
    if workers:
        classes["workers"] = klass(*workers[:1], **workers[1])
    if main:
        classes["main"] = klass(*main[:1], **main[1])
    return TimeBudget(wall, classes, samples=170, hz=58).to_dict()


def test_why_is_the_verdict_engine_fed_the_loaders_figures():
    from autotune.online.measure import WindowStats
    from autotune.online.why import Figures, explain

    starved = WindowStats(40, 6.0, 4.0, 0.01)          # AU 0.40
    kw = {"num_workers": 2, "prefetch_factor": 4}

    def fig(budget, stats=starved, loader=kw):
        return Figures(stats=stats, loader=loader, batch_size=64, cores=2, budget=budget,
                       dataset="/data/train")
    main = (1, {"on_cpu": 0.05})
    v = explain(fig(_budget(workers=(2, {"on_cpu": 0.9, "runnable": 0.08}), main=main)))
    assert v.bottleneck == "decode"
    v = explain(fig(_budget(workers=(2, {"io": 0.85, "on_cpu": 0.05}), main=main)))
    assert v.bottleneck == "storage" and v.next_command.startswith("autotune convert /data/train")
    v = explain(fig(_budget(workers=(2, {"on_cpu": 0.05}), main=main)))
    assert v.bottleneck == "loader" and "(main process)" in v.summary
    # The loader's own figures are the headline: AU, wait share, step, images/s.
    assert "data wait 60% of the time, AU 40%" in v.evidence[0] and "256 images/s" in v.evidence[0]
    v = explain(fig({"available": False, "reason": "no schedstat"}))
    assert v.bottleneck == "unknown" and "no schedstat" in v.summary
    v = explain(fig(None, stats=WindowStats(40, 0.2, 9.8, 0.01)))
    assert v.bottleneck == "compute"
    # Under DDP the next search measures this node's ranks at once, as the job runs them.
    loader_bound = _budget(workers=(2, {"on_cpu": 0.05}), main=main)
    assert "--procs-per-node" not in explain(fig(loader_bound)).next_command
    ddp = explain(Figures(stats=starved, loader=kw, batch_size=64, cores=2,
                          budget=loader_bound, dataset="/data/train", ranks=4))
    assert ddp.next_command.startswith("autotune search /data/train --procs-per-node 4 "), \
        ddp.next_command
    # Two ranks of one worker each on 2 cores: this rank's worker busy and 1.1 cores wanted
    # is its share of the node full (the other rank's loader has the other core), not "too
    # few workers: raise num_workers (up to about 1)" with 1 running.
    one = {"num_workers": 1, "prefetch_factor": 2}
    busy = _budget(workers=(1, {"on_cpu": 0.97, "runnable": 0.02}), main=(1, {"on_cpu": 0.1}))
    ranks2 = explain(Figures(stats=starved, loader=one, batch_size=64, cores=2, budget=busy,
                             dataset="/data/train", ranks=2, worker_bound=1))
    assert ranks2.bottleneck == "decode", (ranks2.summary, ranks2.advice)
    assert any("this rank's share, 1 of the node's 2" in e for e in ranks2.evidence)


def test_burst_samples_this_process_tree_from_a_process_of_its_own():
    """The real sampler over a real busy child: the budget sees it as a worker, and the
    sampler's own process is not in it."""
    import subprocess
    import sys
    import time
    from autotune.monitor.timebudget import TimeBudget
    from autotune.online.why import Burst

    import psutil

    # A parent of its own holding the busy child: the test process may have other
    # children (a session's S3 server) that are not this tree's workers.
    parent = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys, time\n"
                               "subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
                               "time.sleep(120)\n"])
    try:
        deadline = time.perf_counter() + 30
        while not psutil.Process(parent.pid).children() and time.perf_counter() < deadline:
            time.sleep(0.05)
        b = Burst(parent.pid, seconds=1.5)
        while not b.done() and time.perf_counter() < deadline + 30:
            time.sleep(0.05)
        d = b.result()
    finally:
        for k in psutil.Process(parent.pid).children(recursive=True):
            k.kill()
        parent.kill()
        parent.wait()
    assert d.get("available", True), d
    w = TimeBudget.from_dict(d).cls("workers")
    assert w is not None and w.processes == 1  # the busy child only, not the sampler
    assert w.share("on_cpu") + w.share("runnable") > 0.5


def test_the_sampler_is_a_light_process_without_torch():
    """The loader starts its sampler inside the user's job (a memory limit counts it): the
    exact command the loader runs, its peak RSS from the kernel (the children's ru_maxrss
    of a wrapper that runs only it) and what it imported. Under `autotune.online` it
    imported the loader and torch: about 220 MiB."""
    import json
    import subprocess
    import sys
    from autotune.online.why import sampler_command

    cmd = sampler_command(1, 0.2, [])   # pid 1: always there, never ours
    cmd[1:1] = ["-X", "importtime"]
    wrapper = ("import resource, subprocess, sys\n"
               f"r = subprocess.run({cmd!r}, capture_output=True, text=True)\n"
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.returncode)\n"
               "print(r.stdout.strip())\n"
               "sys.stderr.write(r.stderr)\n")
    r = subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True,
                       timeout=120)
    head, out = r.stdout.splitlines()[:2]
    kib, code = map(int, head.split())
    assert code == 0, r.stderr[-2000:]
    assert json.loads(out).get("wall_s") is not None, out
    imported = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines()
                if line.startswith("import time:")}
    assert not {m for m in imported if m == "torch" or m.startswith("torch.")}, sorted(imported)
    assert "autotune.online.loader" not in imported
    assert kib < 100 * 1024, f"the sampler peaked at {kib // 1024} MiB"


def test_at_the_bound_the_climb_waits_for_the_budget_then_goes_past_it(decisions):
    c = _ctl(bound=2, sample_bound=True)
    start = c.start()                          # 2 workers: the bound
    assert c.observe(_w(0.5), start) is None   # 3 refused: stay, sample the workers first
    assert c.wants_budget and c.phase == "budget"
    assert c.observe(_w(0.5), start) is None   # still waiting: no switch meanwhile
    # 2 / (1 - 0.75) = 8; the window at the bound is measured: the climb goes on at once.
    nxt = c.workers_blocked(0.75, 8, "blocked 75 %")
    assert c.bound == 8 and not c.wants_budget
    assert (nxt.num_workers, nxt.prefetch_factor) == (3, 2)
    nxt = c.observe(_w(0.30), nxt)             # kept; 4 is within the raised bound
    assert nxt.num_workers == 4
    assert [e for e, _ in decisions()][:4] == ["start", "bound", "bound-raised", "try"]
    # Not blocked: the bound stays, and the climb goes on to the next knob.
    c2 = _ctl(bound=2, sample_bound=True)
    s2 = c2.start()
    assert c2.observe(_w(0.5), s2) is None
    nxt = c2.workers_blocked(0.0, 2, "blocked 0 %")
    assert c2.bound == 2 and (nxt.num_workers, nxt.prefetch_factor) == (2, 4)
    assert not c2.wants_budget


def test_a_rejected_configuration_is_not_tried_again_after_the_bound_rose():
    """A budget that arrives while a trial runs (no pause: sample_bound off) re-opens
    num_workers; what a trial rejected is not switched to again: three switches, as behind
    an IOPS cap where neither knob helps."""
    c = _ctl(bound=2)
    start = c.start()
    pf4 = c.observe(_w(0.5), start)
    assert (pf4.num_workers, pf4.prefetch_factor) == (2, 4)
    c.workers_blocked(0.75, 8, "blocked 75 %")
    nxt = c.observe(_w(0.49), pf4)             # the trial rejected; num_workers again
    assert (nxt.num_workers, nxt.prefetch_factor) == (3, 2)
    assert c.observe(_w(0.49), nxt) == start and c.phase == "settled"


def test_a_raised_bound_after_settling_climbs_from_the_settled_config():
    c = _ctl(bound=2)
    start = c.start()
    pf4 = c.observe(_w(0.5), start)
    back = c.observe(_w(0.49), pf4)            # rejected: settled at the start
    assert back == start and c.phase == "settled"
    c.workers_blocked(0.6, 5, "blocked 60 %")
    assert c.phase == "measure"
    nxt = c.observe(_w(0.5), start)            # the settled pool's next window
    assert (nxt.num_workers, nxt.prefetch_factor) == (3, 2)


def test_blocked_on_storage_and_one_more_worker_no_help_settles_storage_bound(decisions):
    """Behind an IOPS cap: at the bound the workers are blocked on storage, the bound rises,
    one worker past the cores does not help; it settles back at the bound at once (no
    prefetch trial: a deeper queue adds no reads in flight) and switches no more: two
    switches in all, and no retune however high the wait stays."""
    c = _ctl(bound=2, sample_bound=True)
    start = c.start()
    assert c.observe(_w(0.90, 0.01, n=5, wall=15.0), start) is None and c.wants_budget
    trial = c.workers_blocked(0.85, 13, "blocked 85 %")
    assert (trial.num_workers, trial.prefetch_factor) == (3, 2)
    back = c.observe(_w(0.89, 0.01, n=5, wall=15.0), trial)
    assert back == start and c.phase == "settled" and c.storage
    settle = [r for e, r in decisions() if e == "settle"][-1]
    assert "blocked on storage" in settle.getMessage()
    for _ in range(6):
        assert c.observe(_w(0.99, 0.001), start) is None
    assert [e for e, _ in decisions()] == ["start", "bound", "bound-raised", "try", "reject",
                                          "settle"]


def test_past_the_cores_a_worker_that_helps_is_kept_and_the_climb_goes_on():
    """Behind a latency (FUSE) more workers than cores do help: kept, the next tried;
    the first that does not settles it there, storage-bound."""
    c = _ctl(bound=2, sample_bound=True)
    start = c.start()
    c.observe(_w(0.6), start)
    three = c.workers_blocked(0.8, 10, "blocked 80 %")
    four = c.observe(_w(0.3), three)
    assert four.num_workers == 4 and not c.storage
    assert c.observe(_w(0.29), four) == three and c.storage and c.tuned == three


def test_a_storage_verdict_stops_the_retunes():
    c = _ctl(bound=2)
    start = c.start()
    assert c.observe(_w(0.5), start).prefetch_factor == 4
    c.observe(_w(0.5), c.make(2, 4))              # rejected: settled at the start
    assert c.phase == "settled"
    c.storage_verdict()
    assert all(c.observe(_w(0.95), start) is None for _ in range(6))


def test_one_healthy_window_is_confirmed_by_the_next_before_settling(decisions):
    """A window at AU >= 0.95 can be a full queue's or a quiet moment's: a decode-bound run
    settled "in 2 s at AU 0.98" whose AU was 0.71. The next window decides: healthy again,
    settled; not, the climb goes on from it."""
    c = _ctl(bound=4)
    start = c.start()
    assert c.observe(_w(0.02), start) is None and c.phase == "confirm"
    nxt = c.observe(_w(0.30), start)          # the queue ran dry: not healthy after all
    assert nxt is not None and c.phase == "trial"
    events = [e for e, _ in decisions()]
    assert "settle" not in events and events[-1] == "try", events


def test_the_first_epochs_summary_names_the_configuration_kept_not_the_last_trial():
    """A soak run read 'first epoch: prefetch 2 -> 4' right after 'settled at
    prefetch_factor=2': the summary named the last window's configuration, a trial the
    tuner did not keep."""
    from types import SimpleNamespace

    from autotune.online.loader import _first_epoch_text

    kept, trial = Config(2, 2, True, False), Config(2, 4, True, False)
    first = SimpleNamespace(config=kept, stats=SimpleNamespace(wait_share=0.94, batches_per_s=10.0))
    last = SimpleNamespace(config=trial, stats=SimpleNamespace(wait_share=0.94, batches_per_s=9.0))
    text = _first_epoch_text(first, last, kept)
    assert text.startswith(f"unchanged at {kept.short()}: wait 94 % in the first window"), text
    assert f"the last measured a trial, {trial.short()}" in text and "0.9x" in text
    assert "\u2192" not in text
    moved = _first_epoch_text(first, SimpleNamespace(config=trial, stats=last.stats), trial)
    assert moved.startswith("prefetch 2 \u2192 4: ") and "trial" not in moved, moved
    # No setting changed: the figures' change is the run's (a user read "kept: wait 84 % ->
    # 73 % (1.5x)" as tuning's gain).
    same = _first_epoch_text(first, SimpleNamespace(config=kept, stats=SimpleNamespace(
        wait_share=0.73, batches_per_s=15.0)), kept)
    assert same.startswith(f"unchanged at {kept.short()}") and "not tuning's" in same, same


def test_the_meter_counts_every_measured_batch_across_its_resets():
    # A mid-epoch switch or fallback resets the window; the first epoch's summary ("N
    # batches, K of them measured") counted only the batches since the last reset.
    m = Meter(10, skip=1)
    for _ in range(4):
        m.add(0.01, 0.001)          # the first is skipped (the queue), 3 measured
    m.reset(10, skip=2)
    for _ in range(5):
        m.add(0.01, 0.001)          # 2 skipped, 3 measured
    assert len(m.steps) == 3 and m.counted == 6


def test_under_torchrun_a_shared_decision_is_said_once_a_node_and_a_ranks_own_names_it(
        monkeypatch, caplog):
    """8 ranks on a node printed each decision and the /dev/shm fit warning 8 times: the
    node's other ranks now say what they share at DEBUG, and their own findings with
    their rank."""
    from autotune.online import decisions
    from autotune.online.decisions import emit

    monkeypatch.setattr(decisions, "_together", False)   # no RankSync in this process
    caplog.set_level(logging.DEBUG, logger="autotune.online")
    for local, rank in ((0, 8), (3, 11)):
        monkeypatch.setenv("LOCAL_RANK", str(local))
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "16")
        emit("fit", "num_workers=2 holds too much /dev/shm", warn=True)
        emit("verdict", "AU 0.41 after tuning", warn=True)
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [("WARNING", "num_workers=2 holds too much /dev/shm"),
                    ("WARNING", "rank 8: AU 0.41 after tuning"),
                    ("DEBUG", "num_workers=2 holds too much /dev/shm"),
                    ("WARNING", "rank 11: AU 0.41 after tuning")], said
    caplog.clear()
    # Ranks that tune apart (no RankSync in this process): each says its own decisions.
    emit("try", "try num_workers=3")
    monkeypatch.setenv("LOCAL_RANK", "-1")   # a script's "not distributed"
    emit("fit", "num_workers=2 holds too much /dev/shm", warn=True)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "rank 11: try num_workers=3"),
        ("WARNING", "num_workers=2 holds too much /dev/shm")]
    caplog.clear()
    for name in ("LOCAL_RANK", "RANK", "WORLD_SIZE"):  # one process, no launcher: as before
        monkeypatch.delenv(name)
    emit("verdict", "AU 0.41 after tuning", warn=True)
    assert [r.getMessage() for r in caplog.records] == ["AU 0.41 after tuning"]


def test_a_forked_workers_estimate_alone_leaves_one_worker_to_measure(decisions):
    """A user's walk: 2 ranks under a 3 GiB limit ran every epoch with num_workers=0, for
    the estimate of a worker (the training process's 720 MiB PSS) was over each rank's
    budget, and with no worker none was ever measured (a forked one held 17-20 MiB of its
    own). Where only that estimate refuses it, one forked worker, one batch ahead, starts
    to be measured; not where its batches would not fit, nor once a worker was measured."""
    mib = 2**20

    def ctl(per_batch=mib, measured=False, try_one=True, budget=100 * mib):
        return Controller(fixed={}, cuda=False, budget=budget, bound=4,
                          memory=lambda: MemoryFigures(400 * mib, per_batch, measured,
                                                       try_one=try_one))
    start = ctl().start()
    assert (start.num_workers, start.prefetch_factor) == (1, 1), start
    said = [r.getMessage() for e, r in decisions() if e == "start"]
    assert "gave num_workers=4" in said[-1] and "cut to fit the budgets" in said[-1], said
    assert ctl(try_one=False).start().num_workers == 0          # spawned: the estimate holds
    # Said as memory's cut, not /dev/shm's (which had room): the walk's warning named
    # `docker run --shm-size` for it.
    cut = [r.getMessage() for e, r in decisions() if e == "fit"][-1]
    assert "a worker's memory, 400 MiB estimated" in cut and "--shm-size" not in cut, cut
    assert ctl(measured=True).start().num_workers == 0          # a measured worker's figure
    assert ctl(per_batch=60 * mib).start().num_workers == 0     # its batches alone too large
