"""The controller at work in a real loop: decisions logged, tuned_kwargs, the first epoch's
summary, the memory budget against the workers' real PSS, no thread of its own."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

import autotune
from autotune.cpus import usable_cores
from autotune.online import cache, controller
from autotune.online.config import TUNED
from autotune.online.memory import footprint
from online_datasets import Burn, Slow


def test_decisions_tuned_kwargs_and_summary(decisions):
    # Threads this test did not start (a fixture of another test file in the same CI
    # worker process, say) are not the loader's.
    others = set(threading.enumerate())
    loader = autotune.DataLoader(Slow(240, 0.002), batch_size=4, shuffle=True,
                                 persistent_workers=True, key="tuning-test")
    epochs, deadline = 0, time.perf_counter() + 90
    # At least 3 epochs, and until it settled (at the worker bound it first waits a few
    # seconds for its workers' time budget, sampled by a process of its own).
    while epochs < 3 or ("settle" not in [e for e, _ in decisions()]
                         and time.perf_counter() < deadline):
        for _ in loader:
            time.sleep(0.004)
            names = {t.name for t in threading.enumerate() if t not in others}
            # torch's own queue feeders only: the loader runs no thread of its own.
            assert names <= {"QueueFeederThread"}
        epochs += 1
    loader.close()
    recs = decisions()
    events = [e for e, _ in recs]
    assert all(e is not None for e in events)  # one record per decision, each labelled
    assert events[0] == "start" and "settle" in events and events.count("summary") == 1
    summary = next(r for e, r in recs if e == "summary").getMessage()
    assert summary.startswith("first epoch: ") and " wait " in summary and "x" in summary
    assert loader.summary in summary
    kw = loader.tuned_kwargs
    assert "persistent_workers" not in kw and set(kw) <= set(TUNED)
    settled = [r for e, r in recs if e == "settle"][-1].autotune["config"]
    assert kw == {k: v for k, v in settled.items() if k in kw}
    assert kw["num_workers"] >= 1


def test_given_settings_are_not_tuned(decisions):
    loader = autotune.DataLoader(Slow(40, 0.0), batch_size=4, num_workers=0)
    assert [len(b) for b in loader] == [4] * 10
    # pin_memory is tuned only where CUDA is present.
    cuda = torch.cuda.is_available()
    assert loader.num_workers == 0
    assert loader.tuned_kwargs == ({"pin_memory": True} if cuda else {})
    assert not [e for e, _ in decisions() if e in ("try", "switched")]


@pytest.mark.slow
def test_memory_budget_too_small_for_a_second_worker_keeps_one(monkeypatch, decisions):
    monkeypatch.setattr(controller, "_worker_bound", lambda: 4)
    ds = Slow(400, 0.002)
    key = cache.dataset_key(ds, "budget-test", 4, usable_cores())
    cache.store(key, {"num_workers": 1, "prefetch_factor": 2})
    loader = autotune.DataLoader(ds, batch_size=4, prefetch_factor=2, key="budget-test")
    it = iter(loader)
    # The first batch is made in this process (measured for /dev/shm); then the worker pool.
    while loader._switch is not None or loader._pools[-1].config.num_workers == 0:
        next(it)
    mem = loader._memory()
    assert mem.measured and mem.per_worker > 0  # read from the worker's smaps_rollup
    one = footprint(1, 2, mem.per_worker, mem.per_batch)
    # Room for one worker twice over; a second needs three alive during the switch.
    loader.memory_budget = 2 * one
    workers = set()
    for _ in it:
        workers.add(loader.num_workers)
    for _ in range(2):
        for _ in loader:
            workers.add(loader.num_workers)
    loader.close()
    assert workers == {1}
    refusals = [r.getMessage() for e, r in decisions() if e == "bound"]
    assert any("over the memory budget" in m and "num_workers=2" in m for m in refusals)
    assert "settle" in [e for e, _ in decisions()]


def test_step_lines_through_instrument(tmp_path):
    """`autotune.instrument` wraps it like any loader: the step lines `analyze` reads."""
    log = tmp_path / "steps.jsonl"
    loader = autotune.DataLoader(Slow(40, 0.0), batch_size=4, _controller=False)
    for _ in autotune.instrument(loader, log=str(log)):
        pass
    loader.close()
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    steps = [x for x in lines if "wait_s" in x]
    assert len(steps) == 10
    assert "num_workers" in json.dumps(lines[0])


def _until_verdict(loader, seconds=90.0):
    deadline = time.perf_counter() + seconds
    while loader.verdict is None and time.perf_counter() < deadline:
        for _ in loader:
            pass
    for _ in loader:  # one more epoch: a second verdict would be said here
        pass
    loader.close()


@pytest.mark.slow
@pytest.mark.alone
def test_idle_workers_after_tuning_verdict_once_from_the_engine(decisions):
    """Workers that sleep in __getitem__ and a loop with no step: no setting reaches AU
    0.90; the loader says why once, from the verdict engine and a time budget of its own
    workers: asleep in a timer, neither on a CPU nor blocked on storage (a sleep is not a
    read), which is a wait inside the Dataset (it said "main process" before: wrong)."""
    loader = autotune.DataLoader(Slow(200, 0.004), batch_size=4)
    _until_verdict(loader)
    verdicts = [r for e, r in decisions() if e == "verdict"]
    assert len(verdicts) == 1
    # At WARNING: Python prints it with no logging set up (the other decisions are INFO).
    assert verdicts[0].levelname == "WARNING"
    v = verdicts[0].autotune["verdict"]
    assert v["bottleneck"] == "loader" and "(waits inside the dataset)" in v["summary"], v
    assert any(line.startswith("workers (") for line in v["evidence"])  # the budget's line
    assert loader.verdict.bottleneck == "loader"


@pytest.mark.slow
@pytest.mark.alone
def test_busy_workers_on_every_core_after_tuning_say_decode_once(decisions):
    """Workers that burn a CPU per item on as many cores as the process may use: decode."""
    import os

    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(sorted(old)[:2]))
    try:
        n = usable_cores()
        loader = autotune.DataLoader(Burn(400, 0.002), batch_size=4, num_workers=n)
        _until_verdict(loader)
    finally:
        os.sched_setaffinity(0, old)
    verdicts = [r for e, r in decisions() if e == "verdict"]
    assert len(verdicts) == 1, [r.getMessage() for r in verdicts]
    assert verdicts[0].autotune["bottleneck"] == "decode", verdicts[0].getMessage()
    assert "decode" in verdicts[0].getMessage()


@pytest.mark.slow
@pytest.mark.alone
def test_image_dataset_gets_a_stage_clock_and_the_verdict_its_stages(tmp_path, decisions):
    """autotune's own ImageDataset: the loader attaches a StageClock, the verdict's
    evidence carries the stage budget, and close() takes the clock off and removes it."""
    import os

    from autotune.data.presets import load_preset
    from autotune.data.torchds import ImageDataset
    from autotune.data.transforms import build_transform
    from autotune.synth import make_image_folder
    from autotune_converters.registry import open_source

    make_image_folder(tmp_path / "train", 120, 4, seed=1, workers=1)
    ds = ImageDataset(open_source(str(tmp_path / "train"), "auto"),
                      build_transform(load_preset("resnet50").transform))
    loader = autotune.DataLoader(ds, batch_size=4)
    clock = ds.stage_clock
    assert clock is not None and os.path.exists(clock.path)
    _until_verdict(loader)  # no step: AU stays under 0.90
    assert ds.stage_clock is None and not os.path.exists(clock.path)
    verdicts = [r for e, r in decisions() if e == "verdict"]
    assert len(verdicts) == 1
    ev = verdicts[0].autotune["verdict"]["evidence"]
    assert any(line.startswith("pipeline stages (timed in the loading processes): read ")
               for line in ev), ev
    assert verdicts[0].autotune["verdict"]["next_command"].startswith(
        f"autotune search {tmp_path / 'train'}")


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.alone
def test_workers_blocked_on_a_slow_mount_raise_the_worker_bound(tmp_path, decisions):
    """Reads behind a FUSE delay: at the worker bound the workers are seen blocked on
    storage (their time budget, sampled by a process of its own), so the bound rises
    above the usable cores and the climb goes on past them; every sample still served."""
    import os

    from autotune.emulate.slowfs import SlowMount, fuse_unavailable_reason
    from online_datasets import Files

    reason = fuse_unavailable_reason()
    if reason:
        pytest.skip(f"needs FUSE: {reason}")
    src = tmp_path / "src"
    src.mkdir()
    for i in range(160):
        (src / f"f{i:03d}").write_bytes(os.urandom(4096))
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(sorted(old)[:2]))
    try:
        with SlowMount(src, tmp_path / "mnt", delay_ms=5.0):
            cores = usable_cores()
            loader = autotune.DataLoader(Files(str(tmp_path / "mnt")), batch_size=4,
                                         shuffle=True)
            epochs, workers = [], set()

            def epoch():
                got = []
                for b in loader:
                    got.extend(b.flatten().tolist())
                    workers.add(loader.num_workers)
                    time.sleep(0.02)  # a step: fewer waits then show in the wait share
                epochs.append(got)
            deadline = time.perf_counter() + 120
            while time.perf_counter() < deadline and not any(
                    e == "bound-raised" for e, _ in decisions()):
                epoch()
            epoch()
            epoch()
            loader.close()
    finally:
        os.sched_setaffinity(0, old)
    raised = [r for e, r in decisions() if e == "bound-raised"]
    assert len(raised) >= 1, [r.getMessage() for _, r in decisions()]
    assert raised[0].autotune["old"] == cores and raised[0].autotune["bound"] > cores
    assert raised[0].autotune["blocked"] > 0.5
    assert "the 2 workers were blocked" in raised[0].getMessage()  # not the FUSE server
    assert max(workers) > cores
    assert all(sorted(e) == list(range(160)) for e in epochs)  # none lost or repeated


class _SettlesBackToOne(controller.Controller):
    """The real controller's ending behind a slow mount, scripted: it settles at once on a
    configuration other than the running one (a trial rejected, the way back to the best),
    so the verdict's time budget is wanted while a switch is starting."""

    def start(self):
        self._current = self.make(3, 4)
        return self._current

    def observe(self, stats, cfg):
        self._current, self.last = cfg, stats
        if self.phase != "settled":
            self.phase = "settled"
            return self.make(1, 2)
        return None


@pytest.mark.slow
def test_the_verdicts_budget_counts_only_the_serving_pools_workers(decisions):
    """A verdict wanted just as the controller switches 3 -> 1 worker: its time budget is
    sampled over the one worker of the pool that serves from then on, not the retired
    pool's three beside it (the old pool and the new one overlap during a switch)."""
    ctl = _SettlesBackToOne(fixed={}, cuda=False, budget=10**12, bound=4,
                            memory=lambda: controller.MemoryFigures(1, 0, True))
    # A step, and a deep queue on the old pool: the overlap lasts a second or more (behind
    # a slow mount, many), longer than the sampler takes to start.
    loader = autotune.DataLoader(Slow(200, 0.1), batch_size=4, _controller=ctl)
    deadline = time.perf_counter() + 120
    while loader.verdict is None and time.perf_counter() < deadline:
        for _ in loader:
            time.sleep(0.1)
            if loader.verdict is not None:   # not the rest of the epoch at 0.4 s a batch
                break
    loader.close()
    switched = [r for e, r in decisions() if e == "switched"]
    assert [r.autotune["config"]["num_workers"] for r in switched] == [1]
    verdicts = [r for e, r in decisions() if e == "verdict"]
    assert len(verdicts) == 1, [r.getMessage() for _, r in decisions()]
    ev = verdicts[0].autotune["verdict"]["evidence"]
    workers = [line for line in ev if line.startswith("workers (")]
    assert workers and workers[0].startswith("workers (1 proc,"), ev
    assert verdicts[0].autotune["verdict"]["summary"].count("3 workers") == 0


_UNDER_A_QUOTA = """
import json, logging, os, sys, time
sys.path.insert(0, sys.argv[1])
import autotune
from online_datasets import Burn

said = []
class Keep(logging.Handler):
    def emit(self, r):
        if getattr(r, "autotune_event", None) == "verdict":
            said.append([r.autotune["bottleneck"], r.getMessage()])
logging.getLogger("autotune.online").addHandler(Keep())
logging.getLogger("autotune.online").setLevel(logging.INFO)
loader = autotune.DataLoader(Burn(400, 0.002), batch_size=4)
deadline = time.perf_counter() + 90
while loader.verdict is None and time.perf_counter() < deadline:
    for _ in loader:
        pass
loader.close()
print(json.dumps(said))
"""


@pytest.mark.slow
@pytest.mark.alone
@pytest.mark.parametrize("cores", [0.5, None])
def test_a_cpu_quota_that_holds_the_loader_back_is_named(cpu_cgroup, cores):
    """Under a container's CPU quota (0.5 CPU here) the workers decode into a quota that
    runs out every period: the loader's verdict named the cores ("decode-bound (CPU) ...
    1.3 wanted of 1"), not the quota; it names the quota and its fix, as analyze does. The
    same loop without a quota names none."""
    import os
    import subprocess
    import sys

    base, make = cpu_cgroup
    cg = make(base, cores)
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run(["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh",
                        sys.executable, "-c", _UNDER_A_QUOTA, here],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    said = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(said) == 1, said
    if cores is None:
        assert "quota" not in said[0][1].lower(), said
        return
    assert said[0][0] == "decode", said
    assert f"a CPU quota): the job's cgroup allows 0.5 CPU ({cg}/cpu.cfs_quota_us)" \
        in said[0][1], said
