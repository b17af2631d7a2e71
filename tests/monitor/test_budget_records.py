"""The time budget where it is used: each `autotune monitor` record carries "budget", and
the window's figures sum them into SystemFigures.budget."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

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
