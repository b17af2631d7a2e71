"""The cold pass's size checked before anything is measured (autotune.search.precheck):
check_samples with a space that searches batch sizes, and cold_pass_refused, the rule
analyze uses for its next command, against the search's own check_window."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from autotune.bench.config import BenchConfig
from autotune.errors import UsageError
from autotune.search.ceilings import Ceilings
from autotune.search.precheck import check_samples, check_window, cold_pass_refused
from autotune.search.session import Session
from autotune.search.space import load_space


def test_a_space_searching_smaller_batches_is_not_refused_for_the_base_batch():
    # 64 images: 4 batches of 16 (refused), but the space also measures batches of 2 (32
    # a pass), which the search did before the early check refused them all (review).
    base = BenchConfig.from_preset("decode-only", batch_size=16)
    with pytest.raises(UsageError, match=r"make 4 batches of 16 per cold pass"):
        check_samples("ds", 64, base, cold=True)
    check_samples("ds", 64, base, cold=True, batch_sizes=[2, 16])
    with pytest.raises(UsageError, match=r"make 2 batches of 32 \(the space's smallest\)"):
        check_samples("ds", 64, base, cold=True, batch_sizes=[32, 64])
    check_samples("ds", 64, base, cold=False)          # warm: any size will do


def _search_refuses(n: int, batch_size: int, cores: int) -> bool:
    """The search's own check_window on the default space, as prepare() runs it."""
    s = SimpleNamespace(
        ceilings=Ceilings(storage=None, decode=None, demand=None, cores=cores, samples=n),
        base=BenchConfig.from_preset("resnet50", batch_size=batch_size),
        opts=SimpleNamespace(cold=True), root="ds",
        space=load_space(None, cores=cores, cuda=False))
    s.needs = lambda p: Session.needs(s, p)          # type: ignore[attr-defined]
    s.unfit = lambda p: (None if s.needs(p)[1] >= s.needs(p)[0] else "short")
    try:
        check_window(s)
    except UsageError:
        return True
    return False


@pytest.mark.parametrize("n, batch_size, cores", [
    (3840, 256, 4), (3840, 256, 16), (12000, 256, 4), (50000, 256, 16), (400, 64, 2),
    (4000, 32, 2), (64, 16, 2)])
def test_analyzes_rule_is_the_searchs(n, batch_size, cores):
    # 3,840 samples at batch 256 make 15 batches: enough for the cheapest configuration,
    # not for half of the default space, so the search refused the next command analyze
    # printed without --warm (review).
    assert cold_pass_refused(n, batch_size, cores) == _search_refuses(n, batch_size, cores)
    if (n, batch_size) == (3840, 256):
        assert cold_pass_refused(n, batch_size, cores)
