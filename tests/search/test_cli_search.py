"""`autotune search` and `autotune stage` as a user runs them (real processes)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from search_waits import wait_for

TESTS = Path(__file__).parent


def run(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotune", "-q", *args], capture_output=True,
                          text=True, timeout=600, **kw)


def test_help_names_every_option():
    out = run("search", "--help").stdout
    for opt in ("--trials", "--timeout", "--compute-ms", "--step", "--study", "--storage",
                "--grid", "--out", "--space", "--max-memory", "--convert", "--stage-dir"):
        assert opt in out, opt


def test_bad_input_is_one_line_with_exit_2(tmp_path):
    r = run("search", str(tmp_path / "nope"))
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr
    r = run("search", ".", "--convert", "wds")
    assert r.returncode == 2 and "--stage-dir" in r.stderr


def test_a_step_that_exits_at_import_stops_the_search_with_exit_2(small_dataset, tmp_path):
    mod = tmp_path / "exitstep.py"
    mod.write_text("import sys\nsys.exit(3)\ndef step(batch):\n    return None\n")
    r = run("search", str(small_dataset), "--step", f"{mod}:step", "--no-probe", "--warm",
            "--batch-size", "4", "--seconds", "1", "--trials", "3", "--confirm", "0",
            "--out", str(tmp_path / "out"),
            env={**os.environ, "PYTHONPATH": str(TESTS.parents[1])})
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{mod} called sys.exit(3) while it was imported" in lines[0]
    assert not (tmp_path / "out" / "search.json").exists()


def test_a_window_too_short_for_a_long_step_is_refused_up_front(small_dataset, tmp_path):
    # A heavy model's step, 3 s per batch of 64: a 10 s window holds 4 batches. Before,
    # every trial and the baseline failed ("only 4 batches were measured"), exit 1; now the
    # search says what window it needs before it measures anything.
    r = run("search", str(small_dataset), "--compute-ms", "3000", "--batch-size", "64",
            "--seconds", "10", "--warm", "--no-probe", "--out", str(tmp_path / "out"))
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and "--seconds 10 is too short for a 3000 ms step" in line
    assert re.search(r"give --seconds (\d+) or more, or leave --seconds out", line), line
    assert not (tmp_path / "out" / "search.json").exists()
    # --confirm-seconds the same way, against the space's most demanding configuration
    # (here every one needs 5 warm-up + 10 measured batches: 45 s), before any trial.
    r = run("search", str(small_dataset), "--compute-ms", "3000", "--batch-size", "64",
            "--confirm-seconds", "40", "--warm", "--no-probe", "--out", str(tmp_path / "out"),
            "--space", str(TESTS / "space-tiny.yaml"))
    assert r.returncode == 2, r.stderr
    assert "--confirm-seconds 40 is too short" in r.stderr, r.stderr
    assert "give --confirm-seconds 45 or more" in r.stderr, r.stderr
    assert not list((tmp_path / "out").glob("timelines/*.jsonl"))


@pytest.mark.skipif(os.geteuid() != 0, reason="cold needs root here (drop_caches)")
def test_a_dataset_too_small_for_a_cold_window_is_refused_up_front(small_dataset, tmp_path):
    # 64 images in batches of 16: 4 batches per cold pass, a measurement needs 15. Before,
    # the search decided from a drained prefetch queue; now it says so and measures nothing,
    # and says it as soon as the images are counted: no configuration could be measured,
    # whatever the probe found (before, only after about 14 s of probe and decode).
    r = run("search", str(small_dataset), "--batch-size", "16", "--no-fio",
            "--out", str(tmp_path / "out"))
    assert r.returncode == 2, r.stderr
    assert "64 images make 4 batches of 16 per cold pass; a measurement needs at least 15 " \
           "(5 warm-up + 10 measured)" in r.stderr, r.stderr
    assert "--warm" in r.stderr and "batch size (at most 4)" in r.stderr
    # No probe ran (it leaves its probe.json before the space is checked).
    assert not (tmp_path / "out" / "probe.json").exists()
    assert not (tmp_path / "out" / "search.json").exists()
    # Two ranks each read half: 64 images in batches of 4 make 16 batches, 8 per rank. The
    # study the refused search left measured nothing, so other settings may take it over.
    # No probe this time: the refusal needs only the file count (8 s less).
    r = run("search", str(small_dataset), "--batch-size", "4", "--procs-per-node", "2",
            "--no-probe", "--out", str(tmp_path / "out"))
    assert r.returncode == 2, r.stderr
    assert "(each of 2 ranks reads 32) make 8 batches of 4" in r.stderr, r.stderr


@pytest.mark.slow
def test_json_to_stdout_and_ctrl_c_keeps_the_study(small_dataset, tmp_path,
                                                  live_measurements):
    out = tmp_path / "out"
    common = ["search", str(small_dataset), "--preset", "decode-only", "--batch-size", "4",
              "--compute-ms", "5", "--seconds", "1.5", "--space", str(TESTS / "space-tiny.yaml"),
              "--no-probe", "--confirm", "0", "--out", str(out), "--study", "cli"]
    r = run(*common, "--trials", "1", "--json", "-")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["recommended"]["config"]["num_workers"] in (0, 1, 2)
    assert (out / "report.html").is_file() and (out / "study.db").is_file()
    # Ctrl-C in the middle of the next trials: exit 130, what was measured is kept.
    p = subprocess.Popen([sys.executable, "-m", "autotune", "-q", *common, "--trials", "5"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # As soon as a trial's measurement process runs (not a fixed 8 s sleep: on a quiet
    # machine that was a trial and a half; on a busy one it could fall before any trial).
    wait_for(lambda: bool(live_measurements(p.pid)), 120, "the next trial's measurement")
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    import optuna

    study = optuna.load_study(study_name="cli", storage=f"sqlite:///{out / 'study.db'}")
    assert len([t for t in study.trials if t.user_attrs.get("record")]) >= 1


def test_a_max_memory_without_a_unit_is_refused_before_any_trial(small_dataset, tmp_path):
    # `--max-memory 600` is 600 bytes: the search measured every configuration and
    # rejected each ("peak memory 506 MiB ... is over"), exit 1, after a minute or more.
    r = run("search", str(small_dataset), "--max-memory", "600", "--warm", "--no-probe",
            "--batch-size", "4", "--out", str(tmp_path / "out"))
    assert r.returncode == 2, r.stderr[-2000:]
    line = r.stderr.strip()
    assert "\n" not in line and "--max-memory 600 is 600 bytes" in line and "600M" in line
    assert not (tmp_path / "out" / "search.json").exists()


def test_a_search_with_your_step_does_not_say_it_has_no_step(small_dataset, tmp_path):
    # With --step the demand ceiling is left out (the step's time is known only from the
    # trials); the evidence said "no step (compute 0): the loader alone is measured" and
    # the whole-run note "with the emulated step", while every trial ran the user's step.
    mod = tmp_path / "mystep.py"
    mod.write_text("import time\ndef step(batch):\n    time.sleep(0.005)\n")
    out = tmp_path / "out"
    r = run("search", str(small_dataset), "--step", f"{mod}:step", "--no-probe", "--warm",
            "--batch-size", "4", "--seconds", "1", "--trials", "1", "--confirm", "0",
            "--out", str(out), env={**os.environ, "PYTHONPATH": str(TESTS.parents[1])})
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads((out / "search.json").read_text())
    said = " ".join(d["ceilings"]["evidence"] + (d["run"] or {}).get("notes", []))
    assert "no step" not in said and "emulated step" not in said, said
    assert f"your step ({mod}:step)" in said, said

