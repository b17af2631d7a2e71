"""The search's trials table in a terminal: a trial's reason is read whole, not cut."""

from __future__ import annotations

import re

from rich.console import Console

from autotune.cli.tables.search import _trials_table


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z0-9%()-]+", text)


def test_a_long_reason_wraps_in_its_column_and_only_a_very_long_one_is_clipped():
    reason = ("not measured: its warm-up and the batches a figure needs (36 batches of 8) "
              "take longer than one cold pass of the dataset (32 batches): a larger dataset, "
              "or --warm")
    huge = "word " * 100
    trials = [{"number": i, "params": {}, "state": "failed", "images_per_s": None, "au": None,
               "data_wait_fraction": None, "peak_rss_mib": None, "reason": r}
              for i, r in enumerate((reason, huge))]
    c = Console(width=140, record=True)
    c.print(_trials_table({"study": "s", "trials": trials}, [], None))
    out = c.export_text()
    shown = _words(out)
    # Every word of the reason is on screen (cut at 60 characters, it ended "needs (36").
    assert all(w in shown for w in _words(reason)), out
    assert "--warm" in out and "pass" in shown
    # A reason of 500 characters stops at a word, with an ellipsis.
    assert shown.count("word") < 60 and "…" in out
