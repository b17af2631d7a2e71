"""The time budget where it is used: each `autotune monitor` record carries "budget", and
the window's figures sum them into SystemFigures.budget."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from autotune.monitor.figures import figures_of
from autotune.monitor.run import run_monitored

JOB = """
    import os, time
    pid = os.fork()
    if pid == 0:                       # a worker that spins
        t = time.time()
        while time.time() - t < 1.6: pass
        os._exit(0)
    time.sleep(1.6)                    # the main process waits
    os.waitpid(pid, 0)
"""


def test_monitor_records_carry_the_budget(tmp_path: Path) -> None:
    run = run_monitored([sys.executable, "-c", textwrap.dedent(JOB)], tmp_path / "out",
                        interval=0.3, gpu=False)
    assert run.returncode == 0
    recs = [json.loads(x) for x in Path(run.metrics).read_text().splitlines()]
    budgets = [r["budget"] for r in recs if r.get("budget")]
    assert len(budgets) >= 3, recs[:2]
    assert all(b["available"] and b["samples"] > 0 and b["hz"] > 0 for b in budgets)
    assert all(b["io_source"] in ("delayacct", "state-sampling") for b in budgets)
    figs = figures_of(recs, source="test", joined_by="whole run")
    assert figs.budget is not None
    main, workers = figs.budget["classes"]["main"], figs.budget["classes"]["workers"]
    assert main["processes"] == 1 and workers["processes"] == 1
    assert workers["shares"]["on_cpu"] + workers["shares"]["runnable"] > 0.7
    assert main["shares"]["asleep"] > 0.7
    assert figs.budget["samples"] == sum(b["samples"] for b in budgets)


def test_one_window_without_a_named_wchan_does_not_say_the_kernel_hides_them() -> None:
    # Seen in a decode-bound run: in 3 of 69 half-second windows every S read of a thread
    # read wchan "0" (the workers on a CPU, a thread woken between its stat and its wchan),
    # and the run's budget said "wchan reads 0 on this kernel", while the other windows
    # named wchans (a FUSE run on the same kernel saw its storage waits through them).
    from autotune.monitor.timebudget import ClassBudget, TimeBudget, sum_budgets

    WCHAN_NOTE = ("wchan reads 0 on this kernel: storage waits in S (FUSE, NFS, sockets) "
                  "cannot be seen")

    def window(notes: list[str], named: int) -> dict:
        b = TimeBudget(wall_s=0.5, classes={"main": ClassBudget(1, 1, 0.5)}, samples=25,
                       hz=50.0, notes=notes)
        d = b.to_dict()
        d["wchan_named"] = named          # what the monitor records beside the notes
        return d

    mixed = sum_budgets([window([], 12), window([WCHAN_NOTE], 0), window([], 9)])
    assert mixed is not None and WCHAN_NOTE not in mixed.notes, mixed.notes
    assert not any("wchan" in line for line in mixed.lines())
    # Where no window named one, the note stays: that is what could not be seen.
    blind = sum_budgets([window([WCHAN_NOTE], 0), window([WCHAN_NOTE], 0)])
    assert blind is not None and blind.notes == [WCHAN_NOTE]
    # The count survives the record: a monitor's window says how many it named.
    assert TimeBudget.from_dict(window([], 7)).wchan_named == 7


def test_a_long_runs_budgets_are_summed_as_they_are_read_not_held() -> None:
    # A day of samples at the monitor's 0.5 s (172,800 records) held every budget section
    # until the end: `autotune analyze` of a 24 h run reached 1.1 GB. Each record's sections
    # are now added to the window's sums as it is read; the figures are the same.
    import tracemalloc

    from autotune.monitor.timebudget import ClassBudget, TimeBudget

    b = TimeBudget(wall_s=0.5, classes={"main": ClassBudget(1, 5, 0.5), "workers": ClassBudget(
        2, 6, 1.0, {"on_cpu": 0.9, "runnable": 0.05, "io": 0.0, "storage_wait": 0.0,
                    "asleep": 0.05})}, samples=28, hz=56.0, notes=["a note"])
    line = json.dumps({"time": 1.0, "interval_s": 0.5, "budget": b.to_dict(),
                       "cpu_quota": {"available": True, "cores": 1.5, "quota_file": "q",
                                     "quota": 150000, "stat_file": "s", "periods": 5,
                                     "throttled": 1, "throttled_s": 0.01}})
    n = 3000
    tracemalloc.start()
    try:
        figs = figures_of((json.loads(line) for _ in range(n)), source="test", joined_by="t")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # Held, 3,000 parsed sections took 13 MiB; summed, the peak is a few records'.
    assert peak < 2 * 2**20, f"{peak / 2**20:.1f} MiB"
    assert figs.budget is not None and figs.budget["samples"] == 28 * n
    w = figs.budget["classes"]["workers"]
    assert w["process_seconds"] == pytest.approx(1.0 * n)
    assert w["shares"]["on_cpu"] == pytest.approx(0.9)
    assert figs.cpu_quota == {"cores": 1.5, "quota_file": "q", "quota": 150000, "stat_file": "s",
                              "periods": 5.0 * n, "throttled": 1.0 * n,
                              "throttled_s": pytest.approx(0.01 * n), "throttled_share": 0.2}
