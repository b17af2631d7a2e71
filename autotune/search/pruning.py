"""Stop a clearly worse trial before its window ends.

Each trial reports its running images/s about once a second (intermediate values, step =
tick number). A trial is pruned once, past the first `min_steps` ticks, its running figure
is under `fraction` of the best complete trial's images/s. Optuna's MedianPruner compares
with the median of earlier trials, which, in a space where half the configurations are
within noise of each other, stops good trials; here only a configuration far below the
best is stopped, and a pruned trial's reason says by how much.

The running figure counts the batches the prefetch queue held at the window's start, so
it errs high early on: a pruned trial was slower than it looked, never faster.
"""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial, TrialState


class BestFractionPruner(optuna.pruners.BasePruner):
    """Prune when the last reported value is below `fraction` x the best complete value.

    fraction: in (0, 1]; 0.7 stops trials running 30 % or more below the best so far.
    min_steps: ticks (about seconds of the measurement window) before any judgement, so a
        slow first second (workers filling their queues) does not count.
    """

    def __init__(self, fraction: float = 0.7, min_steps: int = 3) -> None:
        if not 0 < fraction:
            raise ValueError(f"fraction must be positive, but got {fraction}.")
        if min_steps < 1:
            raise ValueError(f"min_steps must be at least 1, but got {min_steps}.")
        self.fraction = fraction
        self.min_steps = min_steps

    def best_value(self, study: optuna.Study) -> float | None:
        vals = [t.value for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if t.value is not None]
        return max(vals) if vals else None

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        step = trial.last_step
        if step is None or step < self.min_steps:
            return False
        best = self.best_value(study)
        return best is not None and trial.intermediate_values[step] < self.fraction * best
