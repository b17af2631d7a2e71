"""The in-loop tuner's time-budget line counts the workers that ran at once.

A DataLoader without persistent_workers starts its workers anew each epoch, and the one
sample where the old ones still exit sees both: 4 processes for num_workers=2. The verdict
engine counts process-seconds over the window (ClassBudget.at_once); the tuner's reason for
a raised worker bound said "the 4 workers" (monitor/analyze review, df03b2e).
"""

from __future__ import annotations

from autotune.monitor.timebudget import STATES, ClassBudget, TimeBudget
from autotune.online.budget import Budget


class _Ctl:
    bound = 2

    def __init__(self) -> None:
        self.why: list[str] = []

    def workers_blocked(self, blocked, bound, why):
        self.why.append(why)
        return None


class _Loader:
    def __init__(self) -> None:
        self._ctl = _Ctl()


def test_the_tuners_reason_counts_the_workers_that_ran_at_once():
    wall = 20.0
    secs = {s: 0.0 for s in STATES}
    secs["io"], secs["asleep"] = 0.8 * 2 * wall, 0.2 * 2 * wall
    # 2 workers alive the whole window; 4 seen in one sample.
    w = ClassBudget(processes=4, threads=4, process_seconds=2 * wall, seconds=secs)
    d = TimeBudget(wall_s=wall, classes={"workers": w}, io_source="delayacct",
                   samples=1000, hz=50.0).to_dict()
    owner = _Loader()
    Budget(owner).bound_from(d)
    assert len(owner._ctl.why) == 1
    assert owner._ctl.why[0].startswith("the 2 workers were blocked on storage 80%"), \
        owner._ctl.why
