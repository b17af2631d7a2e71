"""analyze(): figures, trends, the join with metrics, the JSON contract, streaming."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from autotune.analyze import analyze
from autotune.errors import UsageError

REPO = Path(__file__).resolve().parents[2]


def own_log(path: Path, epochs: list[list[tuple[float, float]]], *, t0: float = 1_000_000.0,
            workers: int = 4, batch: int = 32, dataset_type: str | None = None,
            transform: str | None = None, persistent: bool | None = None) -> Path:
    """An instrument() log: per epoch, (wait_s, step_s) per step, back to back from t0."""
    ds = {"root": "/data/train", **({"type": dataset_type} if dataset_type else {}),
          **({"transform": transform} if transform else {})}
    lines = [json.dumps({"autotune": "steps", "version": 1, "cores": 8,
                         "loader": {"num_workers": workers, "prefetch_factor": 2,
                                    "dataset": ds,
                                    **({"persistent_workers": persistent}
                                       if persistent is not None else {})}})]
    t = t0
    for e, steps in enumerate(epochs):
        for i, (w, s) in enumerate(steps):
            lines.append(json.dumps({"t": t, "epoch": e, "step": i, "wait_s": w, "step_s": s,
                                     "batch": batch}))
            t += w + s
    path.write_text("\n".join(lines) + "\n")
    return path


def metrics_log(path: Path, start: float, end: float, *, tree: float, total: float,
                rps: float = 0.0, util: float = 0.0, interval: float = 0.5,
                outside: dict | None = None) -> Path:
    """A monitor metrics.jsonl: samples every `interval` from start to end with the given
    figures, plus samples with `outside` figures 5 s before and after."""
    def rec(t: float, tree: float, total: float, rps: float, util: float) -> str:
        return json.dumps({
            "time": t, "monotonic": t, "interval_s": interval,
            "disk": {"available": True, "device": "sda", "reads_per_s": rps, "read_mib_s": rps / 10,
                     "r_await_ms": 0.5, "util_pct": util},
            "cpu": {"available": True, "total_pct": total, "iowait_pct": 0.0,
                    "busiest_core_pct": total, "per_core_pct": [total] * 4, "cores": 4},
            "proc": {"available": True, "cpu_pct": tree, "processes": 5, "rss_bytes": 1},
            "shm": None, "gpu": {"available": False, "reason": "NVML: no GPU found"}})
    out = []
    o = outside or {"tree": 390.0, "total": 99.0, "rps": 0.0, "util": 0.0}
    for k in range(10):
        out.append(rec(start - 5 + k * interval, **o))
    t = start + interval
    while t <= end:
        out.append(rec(t, tree, total, rps, util))
        t += interval
    for k in range(10):
        out.append(rec(end + 1 + k * interval, **o))
    out.append("{not json")
    path.write_text("\n".join(out) + "\n")
    return path


def test_figures_and_warmup_of_an_own_log(tmp_path):
    steps = [(3.0, 0.1)] + [(0.05, 0.1)] * 99             # a slow first batch (start-up)
    a = analyze(own_log(tmp_path / "s.jsonl", [steps]))
    assert a.warmup_steps == 8                              # max(5, 4 workers x prefetch 2)
    assert a.steps == 92
    assert a.data_time_share == pytest.approx(1 / 3, rel=1e-3)
    assert a.au == pytest.approx(2 / 3, rel=1e-3)
    assert a.step_time_s["p50"] == pytest.approx(0.1, rel=0.01)
    assert a.images_per_s == pytest.approx(32 / 0.15, rel=1e-3)
    assert a.dataset == "/data/train"
    assert a.trend["findings"][0].startswith("the first batch of the run waits 3.00 s")


def test_the_next_search_of_a_jobs_own_dataset_names_a_factory(tmp_path):
    """The step log names the job's own Dataset class: `autotune search DATASET` alone
    would measure autotune's image pipeline, another job (a user's review: 135 images/s
    for a pipeline of 4). An image folder's next search stays as it was."""
    steps = [(0.001, 0.1)] * 60                               # compute: next, a search
    own = analyze(own_log(tmp_path / "a.jsonl", [steps], dataset_type="Files")).verdict
    assert "--dataset-factory YOUR_FILE.py:FUNCTION" in own.next_command, own.next_command
    assert any("Dataset is Files" in e for e in own.evidence), own.evidence
    folder = analyze(own_log(tmp_path / "b.jsonl", [steps], dataset_type="ImageFolder")).verdict
    assert "--dataset-factory" not in folder.next_command, folder.next_command
    assert own.next_command.replace(" --dataset-factory YOUR_FILE.py:FUNCTION", "") \
        == folder.next_command


def test_the_next_search_of_a_conversion_read_with_the_users_transform_names_a_factory(
        tmp_path):
    """open_dataset over a conversion with the user's own transform (the train-on-converted
    guide's to_tensor): the next search read it through the resnet50 preset, 224x224 float
    batches of 18 MiB against the job's 1.5 MiB, and judged another job (a user's walk:
    28 of 33 configurations cut for /dev/shm). With autotune's own transform, or none
    named, it reads the conversion as is."""
    steps = [(0.001, 0.1)] * 60
    own = analyze(own_log(tmp_path / "a.jsonl", [steps], dataset_type="MapDataset",
                          transform="__main__.to_tensor")).verdict
    assert "--dataset-factory YOUR_FILE.py:FUNCTION" in own.next_command, own.next_command
    assert any("runs its own transform (__main__.to_tensor" in e for e in own.evidence)
    for transform in ("autotune.data.transforms.ImagenetTrainTransform", None):
        as_is = analyze(own_log(tmp_path / "b.jsonl", [steps], dataset_type="ShardDataset",
                                transform=transform)).verdict
        assert "--dataset-factory" not in as_is.next_command, as_is.next_command
    # A torchvision ImageFolder's transform is taken for the preset's ImageNet pipeline.
    folder = analyze(own_log(tmp_path / "c.jsonl", [steps], dataset_type="ImageFolder",
                             transform="torchvision.transforms.transforms.Compose")).verdict
    assert "--dataset-factory" not in folder.next_command, folder.next_command


def _ranks_log(path: Path, hosts: list[str]) -> Path:
    """An instrument() log of one rank per entry of `hosts`, 60 compute-bound steps each."""
    lines = []
    for rank, host in enumerate(hosts):
        lines.append(json.dumps({"autotune": "steps", "version": 1, "cores": 8, "host": host,
                                 "rank": rank, "world_size": len(hosts),
                                 "loader": {"num_workers": 2, "dataset": {"root": "/d"}}}))
        lines += [json.dumps({"t": 1e6 + i * 0.101, "epoch": 0, "step": i, "wait_s": 0.001,
                              "step_s": 0.1, "batch": 32, "rank": rank}) for i in range(60)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_next_search_of_a_ddp_job_names_its_ranks_on_a_node(tmp_path):
    """Two ranks on a node: each one's workers are bounded by half the cores, and a next
    search without --procs-per-node recommended twice the workers per rank (a user's walk:
    2 workers a rank on 2 cores; 1 with the flag, as the online tuner had settled). Four
    ranks on two hosts: 2 a node. One rank: no flag."""
    for hosts, flag in ((["a", "a"], " --procs-per-node 2"), (["a", "a", "b", "b"],
                                                             " --procs-per-node 2"),
                        (["a"], "")):
        v = analyze(_ranks_log(tmp_path / f"{len(hosts)}.jsonl", hosts)).verdict
        assert v.next_command.startswith("autotune search "), v
        assert (" --procs-per-node " in v.next_command) is bool(flag), v.next_command
        assert flag in v.next_command, v.next_command


def test_epoch_start_spikes_and_first_epoch_falls(tmp_path):
    cold = [(0.2, 0.1)] * 40                                # first epoch from storage
    warm = [(2.0, 0.1)] + [(0.01, 0.1)] * 39                # workers restart each epoch
    a = analyze(own_log(tmp_path / "s.jsonl", [cold, warm, warm, warm]))
    f = " | ".join(a.trend["findings"])
    assert "spikes at epoch starts: in 3 of 3 later epoch(s) the first batch waits 2.00 s" in f
    assert "persistent_workers=True" in f
    assert "data time falls after the first epoch: 67% in epoch 0, 9% (median) later" in f
    assert [e["epoch"] for e in a.trend["by_epoch"]] == [0, 1, 2, 3]
    # The verdict, of the whole run, says which epochs it describes and that the first
    # (cold) one waited far more than the others (DESIGN: a verdict says which epochs).
    ep = [e for e in a.verdict.evidence if e.startswith("this verdict describes epochs")]
    assert ep == [ep[0]] and "epochs 0-3 together: epoch 0 alone waited 67%" in ep[0], \
        a.verdict.evidence
    assert "later ones 9% (median)" in ep[0]
    steady = analyze(own_log(tmp_path / "t.jsonl", [warm, warm, warm])).verdict.evidence
    assert not any(e.startswith("this verdict describes epochs") for e in steady), steady


def test_epoch_start_spikes_of_kept_workers_or_none_do_not_ask_for_persistent_workers(tmp_path):
    """A user's walk: a log whose header says persistent_workers=True was told that "the
    DataLoader starts its workers anew each epoch (persistent_workers=True keeps them)"."""
    warm = [(2.0, 0.1)] + [(0.01, 0.1)] * 39
    kept = " | ".join(analyze(own_log(tmp_path / "k.jsonl", [warm] * 4,
                                      persistent=True)).trend["findings"])
    assert "spikes at epoch starts" in kept and "the workers are kept" in kept, kept
    assert "keeps them" not in kept, kept
    none = " | ".join(analyze(own_log(tmp_path / "n.jsonl", [warm] * 4,
                                      workers=0)).trend["findings"])
    assert "with no workers (num_workers=0)" in none and "keeps them" not in none, none


def test_data_time_growing_over_the_run(tmp_path):
    steps = [(0.01 + 0.004 * i, 0.1) for i in range(100)]
    a = analyze(own_log(tmp_path / "s.jsonl", [steps]))
    assert any("over the run the data-time share grows" in f for f in a.trend["findings"])


def test_join_uses_only_the_samples_of_the_steps_window(tmp_path):
    # The job: 8 workers idle on reads (storage); outside its window the machine was busy
    # with something else (100 % CPU) that must not leak into the verdict.
    log = own_log(tmp_path / "s.jsonl", [[(0.3, 0.1)] * 60], workers=8)
    t0, t1 = 1_000_000.0, 1_000_000.0 + 60 * 0.4
    m = metrics_log(tmp_path / "m.jsonl", t0 + 8 * 0.4, t1, tree=40.0, total=12.0, rps=300, util=40)
    a = analyze(log, metrics=m)
    s = a.system
    assert s.joined_by == "time" and s.bad_lines == 1
    assert s.samples < s.samples_total - 19
    assert s.proc_cpu_pct["max"] == 40.0 and s.cpu_total_pct["max"] == 12.0
    # These samples carry no time budget, which the verdict is decided from: it says so,
    # rather than guess storage from idle-looking CPU shares.
    assert a.verdict.bottleneck == "unknown" and "time budget is missing" in a.verdict.summary


def test_join_where_no_sample_falls_in_the_steps_window_uses_every_sample(tmp_path):
    # The log's clock and the monitor's differ (another host's log): the whole run's
    # samples are the figures then, every one of them (they were held whole, up to
    # 100,000; a day of a monitor's samples is 172,800), and the join says why.
    log = own_log(tmp_path / "s.jsonl", [[(0.3, 0.1)] * 60], workers=8, t0=9_000_000.0)
    m = metrics_log(tmp_path / "m.jsonl", 1_000_000.0, 1_000_010.0, tree=40.0, total=12.0)
    a = analyze(log, metrics=m)
    s = a.system
    assert s.joined_by.startswith("whole run (no sample falls within the steps' times")
    assert s.samples == s.samples_total == 40 and s.bad_lines == 1
    # Inside and outside the monitor's own window alike: 40 % and the 390 % around it.
    assert s.proc_cpu_pct["max"] == 390.0 and s.proc_cpu_pct["n"] == 40
    # Summed as read, not held: 3,000 samples held whole peaked at 9 MiB.
    from autotune.analyze.join import join_metrics

    big = metrics_log(tmp_path / "big.jsonl", 1_000_000.0, 1_001_500.0, tree=40.0, total=12.0)
    tracemalloc.start()
    try:
        figs = join_metrics(big, (9_000_000.0, 9_000_024.0))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert figs.samples == 3020 and figs.proc_cpu_pct["n"] == 3020
    assert peak < 3 * 2**20, f"{peak / 2**20:.1f} MiB"


def test_join_without_log_times_uses_the_whole_run(tmp_path):
    log = tmp_path / "imagenet.log"
    log.write_text("".join(f"Epoch: [0][{i:3d}/100]\tTime  0.400 ( 0.400)\tData  0.300 ( 0.300)\n"
                           for i in range(1, 100, 5)))
    m = metrics_log(tmp_path / "m.jsonl", 0.0, 10.0, tree=40.0, total=12.0, rps=300, util=40)
    a = analyze(log, metrics=m, batch_size=64)
    assert a.window is None and a.system.joined_by.startswith("whole run")
    assert a.system.samples == a.system.samples_total
    assert any("whole run" in w for w in a.warnings)


def test_json_contract(tmp_path):
    a = analyze(own_log(tmp_path / "s.jsonl", [[(0.05, 0.1)] * 30]))
    d = json.loads(json.dumps(a.to_dict()))
    assert d["format"] == "own"
    assert set(d["lines"]) >= {"parsed", "skipped"}
    for key in ("steps", "data_time_share", "images_per_s"):
        assert isinstance(d[key], (int, float)), key
    assert set(d["step_time_s"]) >= {"p50", "p95"}
    assert set(d["verdict"]) >= {"bottleneck", "evidence", "next_command"}
    assert d["verdict"]["bottleneck"] in ("storage", "decode", "loader", "compute", "unknown")


def test_monitor_dir_as_input(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_text("".join(
        f"Epoch: [0][{i:3d}/200]\tTime  0.400 ( 0.400)\tData  0.300 ( 0.300)\n" for i in range(1, 200, 5)))
    # LOG.times: each line's end offset was written 0.4 s apart from t=2000.
    offs, t, lines = [], 2000.0, (run / "train.log").read_bytes().splitlines(keepends=True)
    pos = 0
    for ln in lines:
        pos += len(ln)
        offs.append(f"{pos} {t:.3f}")
        t += 2.0
    (run / "train.log.times").write_text("\n".join(offs) + "\n")
    (run / "run.json").write_text(json.dumps({"data": "/mnt/ds"}))
    (run / "steps.jsonl").write_text("")              # not instrumented: no step in it
    a = analyze(run, batch_size=16)
    assert a.log.endswith("train.log") and a.dataset == "/mnt/ds"
    assert a.window is not None and a.window[0] == pytest.approx(2000.0 + 2.0 - 0.4)
    assert "monitor's line times" in a.times_from
    assert "/mnt/ds" in a.verdict.next_command or a.verdict.bottleneck == "unknown"


def test_errors_name_the_file_and_fix(tmp_path):
    with pytest.raises(UsageError, match="no such file.*autotune monitor --out"):
        analyze(tmp_path / "missing.log")
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"autotune": "steps", "version": 1}\n')
    with pytest.raises(UsageError, match="no step timing found as format 'own' in 1 lines"):
        analyze(empty)
    log = own_log(tmp_path / "s.jsonl", [[(0.05, 0.1)] * 10])
    with pytest.raises(UsageError, match="probe file .*not JSON"):
        (tmp_path / "p.json").write_text("{")
        analyze(log, probe=str(tmp_path / "p.json"))
    with pytest.raises(UsageError, match="metrics file .*no monitor sample"):
        (tmp_path / "m.jsonl").write_text("hello\n")
        analyze(log, metrics=tmp_path / "m.jsonl")


def test_a_large_log_is_streamed_in_constant_memory(tmp_path):
    line = ("Epoch: [{e}][{i:4d}/3000]\tTime  0.{t:03d} ( 0.150)\tData  0.050 ( 0.050)\t"
            "Loss 6.9077e+00 (6.9100e+00)\tAcc@1   0.00 (  0.10)\tAcc@5   0.39 (  0.50)\n")

    def peak_of(epochs: int) -> tuple[int, int, object]:
        log = tmp_path / f"big{epochs}.log"
        with log.open("w") as f:
            for e in range(epochs):
                for i in range(1, 3001):
                    f.write(line.format(e=e, i=i, t=100 + i % 100))
        tracemalloc.start()
        a = analyze(log, batch_size=256)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return peak, log.stat().st_size, a

    small, _, _ = peak_of(2)
    peak, size, a = peak_of(6)
    assert a.steps == 18_000 - 4                 # batches 1-4 of the 1-based log: warm-up
    # 3x the log, the same memory: only the format sniff's head lines are ever held.
    assert peak < 1.3 * small and peak < 8 << 20, (small, peak, size)
    assert a.data_time_share == pytest.approx(0.05 / 0.1495, rel=0.01)


def test_cli_analyze_json_to_stdout_and_one_line_errors(tmp_path):
    log = own_log(tmp_path / "s.jsonl", [[(0.05, 0.1)] * 30])
    r = subprocess.run([sys.executable, "-m", "autotune", "analyze", str(log),
                        "--json", "-"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["steps"] == 22 and "Verdict:" in r.stderr
    r = subprocess.run([sys.executable, "-m", "autotune", "analyze",
                        str(tmp_path / "nope.log")], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert r.stderr.startswith("autotune analyze: error: ") and "nope.log" in r.stderr
