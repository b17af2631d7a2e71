"""Why the search stops before its budget: the reasons read from one trial's record (a
real search that meets them is in test_search_real.py; a batch a worker cannot pickle
costs a whole batch timeout a trial, too long to run here, and bench's real run of it is
tests/bench/test_bench_failures.py)."""

from __future__ import annotations

from autotune.search.records import TrialRecord
from autotune.search.trials import _cannot_send


def _rec(kind: str | None) -> TrialRecord:
    return TrialRecord(3, {"num_workers": 2}, "failed" if kind else "complete",
                       reason="no batch arrived for 120 s (DataLoader timeout) during warm-up: "
                              "a worker could not send its batch back (TypeError: cannot "
                              "pickle 'generator' object), so it dropped it",
                       hint="... --workers 0 loads in the training process ...",
                       failure_kind=kind)


def test_a_batch_no_worker_can_send_stops_the_search_at_once():
    why = _cannot_send(_rec("unsendable"))
    assert why is not None and "cannot pickle 'generator' object" in why
    assert "every configuration with workers fails alike" in why and "--workers 0" in why
    for other in (None, "timeout", "open_files", "step_error"):
        assert _cannot_send(_rec(other)) is None
