"""The first epoch's summary when the epoch ends with a trial under way.

A 30-epoch run read 'first epoch: prefetch 2 → 4: ... (the last measured a trial,
num_workers=2, prefetch_factor=2)': prefetch_factor=4 had only just been chosen to try
(and was not kept), and the configuration kept and measured was called the trial. The
summary names the configuration kept, and the trial as one.
"""

from __future__ import annotations

import time

import autotune
from online_datasets import Slow


def test_a_trial_begun_in_the_first_epoch_is_not_its_change(decisions):
    # 24 batches: the start point's window closes about batch 14 and prefetch 4 is tried;
    # its window (16 batches) cannot close before the epoch ends.
    loader = autotune.DataLoader(Slow(96, 0.004), batch_size=4, num_workers=2)
    for _ in loader:
        time.sleep(0.002)
    loader.close()
    events = [e for e, _ in decisions()]
    assert "try" in events and "summary" in events, events
    assert events.index("try") < events.index("summary"), events
    assert not {"keep", "reject"} & set(events[:events.index("summary")]), events
    summary = next(r for e, r in decisions() if e == "summary").getMessage()
    assert "\u2192" not in summary and "the last measured a trial" not in summary, summary
    assert summary.startswith("first epoch: unchanged at num_workers=2, prefetch_factor=2"), \
        summary
    assert "; trying num_workers=2, prefetch_factor=" in summary, summary


def test_an_epoch_too_short_to_measure_says_how_many_batches_were_measured(decisions):
    # 10 batches served, one window of 10: the epoch's first batch waits for the start and
    # is not measured, so no window closed. "10 batches, fewer than one window (10)" read
    # as a miscount; the measured count says why.
    loader = autotune.DataLoader(Slow(40, 0.002), batch_size=4, num_workers=2)
    for _ in loader:
        pass
    loader.close()
    summary = next(r for e, r in decisions() if e == "summary").getMessage()
    assert summary.startswith("first epoch: 10 batches, "), summary
    measured = int(summary.split("10 batches, ")[1].split(" of them measured")[0])
    assert measured < 10 and "fewer than one window (10); nothing measured" in summary, summary
