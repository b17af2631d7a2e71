"""The proof of issue 7: a real training loop (real DataLoader, real worker processes,
generated JPEGs, an emulated step) run under `autotune monitor` as a real subprocess
(`python -m autotune monitor --json FILE -- python train_loop.py ...`), in four
set-ups whose verdicts must come out right every time:

  compute  2 workers (all cores), light transform, 250 ms step: the input keeps up
  loader   0 workers, 5 ms step, warm data: the main process loads, one core busy;
           and 1 worker, the same: one worker process decodes while a core idles
  decode   heavy-augment on all cores, 10 ms step, warm data: the CPUs are saturated;
           and the same beside a validation loader's 2 kept, idle workers, in a plain
           loop and in a Lightning fit with its sanity check (lightning_loop.py)
  storage  8 workers on a loop-device disk capped at 40 read IOPS, files evicted (cold),
           a cheap draft decode (light.yaml)

Each set-up is sized for wide margins on a shared 2-core machine (see the figures in each
assertion) and runs in well under 20 s. With $AUTOTUNE_SETUPS_OUT set, each analysis is
also copied there (scripts/bench_analyze.py runs these tests and tabulates the verdicts).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.monitor.timebudget import TimeBudget

pytestmark = [pytest.mark.alone, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
TRAIN_LOOP = Path(__file__).resolve().parent / "train_loop.py"
LIGHTNING_LOOP = Path(__file__).resolve().parent / "lightning_loop.py"
LIGHT = Path(__file__).resolve().parent / "light.yaml"   # cheap decode: the wait is I/O
CAP_IOPS = 40


CPUS = 2   # every set-up runs on 2 CPUs (train_loop --cpus), whatever the machine has


def _cores() -> int:
    return min(CPUS, len(os.sched_getaffinity(0)))


def _monitor(out: Path, data: Path, loop_args: list[str], *, runner=subprocess.run,
             timeout: float = 120, loop: Path = TRAIN_LOOP) -> dict:
    cmd = [sys.executable, "-m", "autotune", "monitor", "--out", str(out),
           "--data", str(data), "--interval", "0.25", "--no-gpu", "--json", str(out / "analysis.json"),
           "--", sys.executable, str(loop), "--dataset", str(data), "--cpus", str(CPUS),
           *loop_args]
    r = runner(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Verdict:" in r.stdout, r.stdout[-3000:]
    d = json.loads((out / "analysis.json").read_text())
    keep = os.environ.get("AUTOTUNE_SETUPS_OUT")
    if keep:
        name = os.environ.get("PYTEST_CURRENT_TEST", "setup").split("::")[-1].split(" ")[0]
        Path(keep).mkdir(parents=True, exist_ok=True)
        (Path(keep) / f"{name}.json").write_text(json.dumps(d, indent=1))
    d["_stdout"] = r.stdout
    print(r.stdout[r.stdout.find("Verdict:"):])   # shown with -s, and on a failure
    return d


def _same_from_text_log(out: Path, d: dict) -> None:
    """The loop also printed pytorch/examples-style lines: parsed from train.log, timed by
    the monitor's train.log.times and joined with the same metrics, they give the same
    verdict as the step log."""
    from autotune.analyze import analyze

    a = analyze(out / "train.log", metrics=out / "metrics.jsonl", batch_size=8)
    assert a.format == "imagenet" and a.times_from.startswith("the monitor's line times")
    assert a.system.joined_by == "time"
    assert a.verdict.bottleneck == d["verdict"]["bottleneck"], a.verdict


def _needs_budget(d: dict) -> None:
    """The verdict is decided from the monitor's time budget: the monitor must record one
    (a sampler that stops doing so fails here rather than skipping the set-up)."""
    assert (d.get("metrics") or {}).get("budget"), _explain(d)


def _explain(d: dict) -> str:
    v = d["verdict"]
    return f"{v['bottleneck']}: {v['summary']}\n" + "\n".join(v["evidence"])


def test_compute_bound(an_dataset, tmp_path):
    # A 500 ms step: the hand-over of each batch from a worker, 1-2 ms here, took 14-30 ms
    # on a slow CI host, and the step must dwarf it for the job to be compute-bound there
    # too (at 250 ms a loaded run here saw AU 0.92).
    d = _monitor(tmp_path / "run", an_dataset,
                 ["--workers", str(min(2, _cores())), "--step-ms", "500", "--steps", "20",
                  "--batch-size", "8"])
    # The verdict is the set-up's known cause (compute: AU at the healthy line or above,
    # by its rule); how far above is a figure of the machine: scripts/bench_handover.
    assert d["verdict"]["bottleneck"] == "compute", _explain(d)
    assert d["format"] == "own" and d["batch_size"] == 8
    # The step sleeps 500 ms: at least that, in seconds (500 would be milliseconds); no
    # upper bound, which only says how busy the machine was.
    assert 0.49 <= d["step_time_s"]["p50"] < 50
    assert "--compute-ms" in d["verdict"]["next_command"]
    _same_from_text_log(tmp_path / "run", d)


@pytest.mark.parametrize("workers", [0, 1], ids=["zero_workers", "one_worker"])
def test_loader_bound(an_dataset, tmp_path, workers):
    if _cores() < 2:
        pytest.skip("a loader-configuration verdict needs a second core to give workers")
    d = _monitor(tmp_path / "run", an_dataset,
                 ["--workers", str(workers), "--step-ms", "5", "--steps", "45", "--batch-size", "8"])
    assert d["loader"]["num_workers"] == workers
    _needs_budget(d)
    assert d["verdict"]["bottleneck"] == "loader", _explain(d)
    assert d["au"] < 0.5, _explain(d)
    assert d["verdict"]["next_command"].startswith(f"autotune search {an_dataset}")
    _same_from_text_log(tmp_path / "run", d)


def test_decode_bound_heavy_augment(an_dataset, tmp_path):
    d = _monitor(tmp_path / "run", an_dataset,
                 ["--workers", str(_cores()), "--step-ms", "10", "--steps", "50",
                  "--batch-size", "8", "--preset", "heavy-augment"])
    _needs_budget(d)
    assert d["verdict"]["bottleneck"] == "decode", _explain(d)
    assert d["au"] < 0.90, _explain(d)   # input-bound; how far below depends on the machine
    _same_from_text_log(tmp_path / "run", d)


def test_decode_bound_beside_a_validation_loaders_kept_workers(an_dataset, tmp_path):
    # A validation loader with persistent_workers keeps 2 workers asleep through the
    # training epoch. Counted with the training loader's, they read "the 4 workers are
    # idle 50 %" and the main process was blamed (2 of 2 runs before the fix; one of 2
    # more said decode by luck): they are left out, and said. Forked 0.3 s and 2 batches
    # before the training loader's, as Lightning's sanity check does (0.34 s measured).
    d = _monitor(tmp_path / "run", an_dataset,
                 ["--workers", str(_cores()), "--step-ms", "10", "--steps", "50",
                  "--batch-size", "8", "--preset", "heavy-augment", "--val-workers", "2"])
    _needs_budget(d)
    b = d["metrics"]["budget"]
    assert b["parked"] == 2, _explain(d)
    # At once, not the most seen in one sample: on a loaded machine the validation
    # batches may still be decoding in the first window, where its workers are at work and
    # so counted ("2 procs at once, 4 seen" in a CI run beside a second suite).
    w = TimeBudget.from_dict(b)
    assert w.classes["workers"].at_once(w.wall_s) == _cores(), _explain(d)
    assert any("validation loader's kept workers" in e for e in d["verdict"]["evidence"])
    assert d["verdict"]["bottleneck"] == "decode", _explain(d)


# Extended (37-50 s of CI's alone pass): Lightning's sanity-check fork gap, a few tenths
# of a second, is tests/monitor/test_parked.py's (real forks 0.3 s apart), and the
# validation loader's kept workers left out of a decode verdict are the test above.
@pytest.mark.extended
def test_decode_bound_under_lightning_with_a_sanity_check(an_dataset, tmp_path):
    # Lightning's sanity check forks the training loader's workers 0.25-0.36 s after the
    # validation loader's, whose kept workers then sleep through every epoch (2 s here:
    # never the 30 s idle that tells loaders apart without a gap). Read as one loader
    # (the gap under 1 s, and a worker's start read from its newest thread) they gave
    # "the 4 workers are idle 51 %", and the main process was blamed (2 of 2 runs of
    # main, and 2 of 2 with the shorter gap alone).
    pytest.importorskip("lightning.pytorch", reason="Lightning is not installed "
                        "(pip install 'autotune-loader[lightning]'; scripts/setup does)")
    d = _monitor(tmp_path / "run", an_dataset,
                 ["--workers", str(_cores()), "--val-workers", "2", "--epochs", "6"],
                 loop=LIGHTNING_LOOP)
    _needs_budget(d)
    assert d["metrics"]["budget"]["parked"] == 2, _explain(d)
    assert d["verdict"]["bottleneck"] == "decode", _explain(d)


@pytest.mark.root
def test_storage_bound_iops_cap(loop_dataset, tmp_path):
    from autotune.cache import evict_files
    from autotune.emulate import IoThrottle

    files = [p for p in loop_dataset.rglob("*.jpg")]
    # 8 workers keep 8 reads queued at the cap: each waits ~200 ms for the disk, far more
    # than for a CPU even on a saturated machine, so the loaders are seen waiting on I/O.
    with IoThrottle(loop_dataset, read_iops=CAP_IOPS, name="analyze-test") as cap:
        evict_files(files)   # cold: every image comes from the capped disk
        d = _monitor(tmp_path / "run", loop_dataset,
                     ["--workers", "8", "--prefetch", "1", "--step-ms", "20", "--steps", "36",
                      "--batch-size", "8", "--preset", str(LIGHT)], runner=cap.run)
    m = d["metrics"]
    assert m["disk_device"] and m["disk_device"].startswith("loop")
    assert m["disk_reads_per_s"]["median"] <= CAP_IOPS * 1.5   # the cap, seen by the monitor
    _needs_budget(d)
    assert d["verdict"]["bottleneck"] == "storage", _explain(d)
    assert "blocked on storage" in d["verdict"]["summary"], _explain(d)
    assert d["au"] < 0.5, _explain(d)
    assert d["verdict"]["next_command"].startswith("autotune convert")
    _same_from_text_log(tmp_path / "run", d)


@pytest.mark.fuse
def test_storage_bound_behind_fuse_latency(an_dataset, tmp_path):
    """Network-like storage: each open and read waits 30 ms (SlowMount). The disk behind a
    FUSE mount cannot be measured; the loaders' storage waits show the job waits on reads."""
    from autotune.emulate import SlowMount

    with SlowMount(an_dataset, tmp_path / "mnt", delay_ms=30.0) as m:
        d = _monitor(tmp_path / "run", Path(m.mnt),
                     ["--workers", "8", "--prefetch", "1", "--step-ms", "20", "--steps", "36",
                      "--batch-size", "8", "--preset", str(LIGHT)])
    assert "disk" in d["metrics"]["unavailable"]
    _needs_budget(d)
    assert d["verdict"]["bottleneck"] == "storage", _explain(d)
    assert "blocked on storage" in d["verdict"]["summary"], _explain(d)
    assert d["au"] < 0.5, _explain(d)
