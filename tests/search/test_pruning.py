"""BestFractionPruner on a real (in-memory) Optuna study."""

from __future__ import annotations

import optuna
import pytest

from autotune.search.pruning import BestFractionPruner


def _study(pruner: BestFractionPruner) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(direction="maximize", pruner=pruner)


def test_prunes_only_clearly_worse_and_only_after_min_steps() -> None:
    study = _study(BestFractionPruner(0.7, min_steps=3))
    t = study.ask()
    t.report(10.0, 1)
    assert not t.should_prune()  # no complete trial yet: nothing to compare with
    study.tell(t, 100.0)

    slow = study.ask()
    for step in (1, 2):
        slow.report(50.0, step)
        assert not slow.should_prune(), step  # too early to judge
    slow.report(69.0, 3)
    assert slow.should_prune()

    close = study.ask()
    for step in (1, 2, 3, 4):
        close.report(71.0, step)
        assert not close.should_prune()


def test_compares_with_the_best_not_the_last() -> None:
    study = _study(BestFractionPruner(0.7, min_steps=1))
    for v in (100.0, 300.0, 50.0):
        study.tell(study.ask(), v)
    t = study.ask()
    t.report(200.0, 1)  # well above the median and the last, but under 0.7 x 300
    assert t.should_prune()


@pytest.mark.parametrize("kw", [dict(fraction=0), dict(min_steps=0)])
def test_bad_arguments_are_named(kw) -> None:
    with pytest.raises(ValueError, match="must be"):
        BestFractionPruner(**kw)
