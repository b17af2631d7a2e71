"""The time budget's stacked bar per process class, and its table lines."""

from __future__ import annotations

import re
import xml.dom.minidom

from autotune.cli.tables import budget_texts
from autotune.monitor.timebudget import ClassBudget, TimeBudget
from autotune.report.html import budget_chart
from autotune.report.svg import FONT, text_box


def _budget() -> TimeBudget:
    workers = ClassBudget(processes=4, threads=9, process_seconds=40.0,
                          seconds={"on_cpu": 2.4, "runnable": 0.4, "io": 35.2,
                                   "storage_wait": 0.0, "asleep": 2.0})
    main = ClassBudget(processes=1, threads=5, process_seconds=10.0,
                       seconds={"on_cpu": 9.0, "runnable": 0.5, "io": 0.0,
                                "storage_wait": 0.0, "asleep": 40.5})
    return TimeBudget(wall_s=10.0, classes={"main": main, "workers": workers},
                      io_source="state-sampling", samples=600, hz=60.0,
                      psi_io={"scope": "machine", "some_pct": 61.0, "full_pct": 20.0},
                      notes=["wchan reads 0 on this kernel: storage waits in S (FUSE, NFS, "
                             "sockets) cannot be seen"])


def test_a_bar_per_class_with_its_parts() -> None:
    svg = budget_chart(_budget().to_dict(), "where the time goes")
    assert svg is not None
    xml.dom.minidom.parseString(svg)        # well-formed
    assert "workers (4 procs, 9 threads)" in svg and "main (1 procs, 5 threads)" in svg
    # workers: on CPU, runnable, I/O, asleep (storage wait 0 draws nothing); main: 3 parts
    assert svg.count('class="mark"') == 4 + 3
    assert svg.count('class="key"') == 5
    assert "task-state sampling (600 samples), 60 Hz" in svg
    assert "I/O 88%" in svg                  # 35.2 of 40 process-seconds


def test_the_bar_labels_stay_apart() -> None:
    svg = budget_chart(_budget().to_dict(), "where the time goes")
    assert svg is not None
    boxes = []
    for m in re.finditer(r"<text([^>]*)>([^<]*)</text>", svg):
        a = dict(re.findall(r'([\w-]+)="([^"]*)"', m.group(1)))
        boxes.append(text_box(float(a["x"]), float(a["y"]), m.group(2),
                              float(a.get("font-size", FONT)), a.get("text-anchor", "start")))
    assert not [(i, j) for i, p in enumerate(boxes) for j, q in enumerate(boxes[i + 1:])
                if p.overlaps(q)]


def test_no_budget_no_chart_and_no_lines() -> None:
    assert budget_chart(None, "t") is None
    assert budget_chart({"available": False, "reason": "x"}, "t") is None
    assert budget_texts(None) == []


def test_table_lines_per_class_source_psi_notes() -> None:
    lines = _budget().lines()
    assert lines[0].startswith("main (1 procs, 5 threads): on CPU 90 %, runnable 5 %, I/O 0 %")
    assert lines[0].endswith("I/O from task-state sampling (600 samples), 60 Hz")
    assert lines[1] == ("workers (4 procs, 9 threads): on CPU 6 %, runnable 1 %, I/O 88 %, "
                        "storage wait 0 %, asleep 5 %")
    assert lines[2] == "I/O pressure (PSI, machine): some 61 %, full 20 %"
    assert lines[3].startswith("note: wchan reads 0")
    texts = budget_texts(_budget().to_dict())
    assert len(texts) == 1 + len(lines)


def test_the_pipeline_stages_are_one_bar_of_four_parts() -> None:
    from autotune.data.stages import stage_budget
    from autotune.report.html import stage_chart

    after = {"read": 6.0, "decode": 2.0, "transform": 1.5, "collate": 0.5, "samples": 500,
             "batches": 50}
    svg = stage_chart(stage_budget({}, after, workers=2, wall_s=10.0), "stages")
    assert svg is not None
    xml.dom.minidom.parseString(svg)
    assert svg.count('class="mark"') == 4 and svg.count('class="key"') == 4
    assert "pipeline time (500 samples)" in svg and "read 60%" in svg
    assert "the 2 workers were in the pipeline 50% of their time" in svg
    assert stage_chart(None, "t") is None
