"""The search's open-files gate (autotune.search.filesgate): which configurations a trial's
open-files limit lets run, in figures; the real search under --max-open-files is in
tests/search/test_search_faults.py."""

from __future__ import annotations

import resource

import pytest

from autotune.search.filesgate import FilesGate, trial_limit
from autotune.search.space import SearchSpace


def _p(w: int, pf: int | None = 2) -> dict:
    return {"num_workers": w, "prefetch_factor": pf if w else None}


def test_a_batch_of_two_tensors_runs_every_pool_under_1024() -> None:
    g = FilesGate(tensors=2, limit=1024)
    assert all(g.why(_p(w, pf)) is None for w in (1, 8, 16) for pf in (2, 8))


def test_a_detection_batch_under_1024_runs_shallow_pools_only() -> None:
    # 192 tensors a batch (a target list per sample): a worker 2 deep holds 32 + 192 x 3,
    # and the training process its own 64 + 192 x (ahead + 2) + pipes.
    g = FilesGate(tensors=192, limit=1024)
    assert g.why(_p(1)) is None                       # 608 and 652
    why = g.why(_p(8))
    assert why is not None and why.startswith("open files: not run: 8 worker(s) x prefetch 2")
    assert "192 tensors a batch" in why and "limit of 1,024 (ulimit -n)" in why
    assert g.why(_p(0, None)) is None                 # no worker: no file handed over


def test_nothing_is_refused_without_a_count_a_limit_or_fd_sharing() -> None:
    for g in (FilesGate(None, 64), FilesGate(0, 64), FilesGate(192, None),
              FilesGate(192, 64, by_fd=False)):
        assert g.why(_p(8)) is None


def test_a_space_with_no_pool_within_the_limit_gets_num_workers_0() -> None:
    space = SearchSpace(choices={"num_workers": [2, 4], "prefetch_factor": [2]})
    g = FilesGate(tensors=96, limit=200)
    g.apply(space)
    assert g.skipped == 2 and g.added_zero and space.choices["num_workers"] == [0, 2, 4]
    assert space.notes[0].startswith("open files: 2 of the space's 2 configurations not run")
    assert g.to_dict()["added_num_workers_0"] is True


def test_the_trials_limit_is_the_given_one_or_this_processs() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 600:
        pytest.skip(f"a hard open-files limit of {hard}: too low to lower the soft one to 500")
    assert trial_limit(48) == 48
    if hard != resource.RLIM_INFINITY:
        assert trial_limit(10 * hard) == hard   # capped as the measurement process caps it
    resource.setrlimit(resource.RLIMIT_NOFILE, (500, hard))
    try:
        assert trial_limit(None) == 500
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_what_the_two_gates_leave_nothing_of_gets_num_workers_0() -> None:
    # /dev/shm refuses 4 workers, the open-files limit 2: nothing with workers runs.
    space = SearchSpace(choices={"num_workers": [2, 4], "prefetch_factor": [2]})
    g2 = FilesGate(tensors=40, limit=400)
    assert g2.why(_p(2)) is None and g2.why(_p(4)) is not None
    g2.apply(space, refused=lambda p: "shm" if p["num_workers"] == 2 else None)
    assert g2.skipped == 1 and g2.added_zero and 0 in space.choices["num_workers"]
