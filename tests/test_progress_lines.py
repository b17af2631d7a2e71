"""Progress where stderr is not a terminal (a batch job's log, a pipe): a spinner or a bar
shows nothing there, so a long search or conversion under Slurm printed nothing until it
ended (a review: a search killed at 47 s left one line, 'terminated'). Plain lines now."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from autotune.cli._base import PlainProgress


def test_lines_come_on_a_change_of_step_and_otherwise_now_and_then(capsys, monkeypatch):
    clock = iter([0.0, 1.0, 2.0, 3.0, 4.0, 40.0, 41.0, 42.0])
    monkeypatch.setattr("autotune.cli._base.time.monotonic", lambda: next(clock))
    p = PlainProgress(quiet_s=2.0, every_s=30.0)       # made at t=0
    p("ceilings: decode")                               # t=1: within the first 2 s
    p("trial 1 of 3: {'num_workers': 2}")               # t=2: said
    p("trial 1 of 3: 40 images/s")                      # t=3: the same step, 1 s later
    p("trial-000: scanning /data")                      # t=4: another step
    p("trial-000: measuring")                           # t=40: the same step, 36 s later
    p("staging 10 of 90 MiB")                           # t=41: no colon: its first word
    p("staging 20 of 90 MiB")                           # t=42: the same step
    lines = capsys.readouterr().err.splitlines()
    assert [ln.split(" ", 1)[1] for ln in lines] == [
        "trial 1 of 3: {'num_workers': 2}", "trial-000: scanning /data",
        "trial-000: measuring", "staging 10 of 90 MiB"]
    assert all(re.match(r"\d\d:\d\d:\d\d ", ln) for ln in lines), lines


@pytest.mark.slow
def test_a_search_into_a_pipe_says_its_trials(small_dataset, tmp_path):
    r = subprocess.run([sys.executable, "-m", "autotune", "search", str(small_dataset),
                        "--preset", "decode-only", "--batch-size", "4", "--compute-ms", "5",
                        "--seconds", "3", "--trials", "4", "--no-probe", "--warm",
                        "--confirm", "0", "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    # Silent for its first 10 s; the search runs longer than that (a baseline and four
    # trials of 3 s windows, each in a fresh process), so a later trial is said.
    assert re.search(r"^\d\d:\d\d:\d\d trial [234] of 4: \{", r.stderr, re.M), r.stderr[-3000:]
