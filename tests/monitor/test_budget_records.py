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
