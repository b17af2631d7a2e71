"""The confirmation phase's decisions, with the measurement replaced by figures chosen to
sit on each side of each rule (the real measurement is exercised by test_search_real's
`test_json_keys_report_and_resume`, which confirms in real 2 s windows)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.search import SearchOptions, run_search
from autotune.search import session as session_mod


class _Result:
    def __init__(self, d: dict) -> None:
        self.d = d

    def to_dict(self) -> dict:
        return self.d


def _fake_bench(monkeypatch, figure) -> list[tuple[int, int, float]]:
    """run_bench replaced: figure(workers, prefetch, seconds) -> images/s, None (a crash)
    or an exception to raise. Returns the calls made (workers, prefetch, seconds)."""
    calls: list[tuple[int, int, float]] = []

    def run(root, cfg, **kw):
        calls.append((cfg.num_workers, cfg.prefetch_factor, cfg.seconds))
        ips = figure(cfg.num_workers, cfg.prefetch_factor, cfg.seconds)
        if isinstance(ips, BaseException):
            raise ips
        if ips is None:
            return _Result({"failed": True, "failure_kind": "crash", "reason": "worker crashed"})
        return _Result({"failed": False, "images_per_s": ips, "au": min(1.0, ips / 1000),
                        "data_wait_fraction": 0.1, "peak_rss_mib": 100.0 * (cfg.num_workers + 1),
                        "seconds_total": cfg.seconds, "window": {"seconds": cfg.seconds}})

    monkeypatch.setattr(session_mod, "run_bench", run)
    return calls


def _opts(tmp_path: Path, **kw) -> SearchOptions:
    space = tmp_path / "space.yaml"
    space.write_text("num_workers: {choices: [1, 2, 4]}\nprefetch_factor: {choices: [2]}\n"
                     "persistent_workers: {choices: [false]}\npin_memory: {choices: [false]}\n")
    base = dict(preset="decode-only", batch_size=8, compute_ms=1, seconds=1.0, early_stop=False,
                confirm_seconds=3.0, space=str(space), out=str(tmp_path / "out"), trials=3,
                probe=False, cold=False, confirm=2, grid=True, baseline=False)
    base.update(kw)
    return SearchOptions(**base)


def test_a_figure_flattered_by_a_short_window_loses_on_confirmation(small_dataset, tmp_path,
                                                                    monkeypatch):
    # 4 workers look fastest in 1 s windows (a queue filled at warm-up), not in 3 s ones.
    first = {1: 200.0, 2: 400.0, 4: 500.0}
    confirmed = {1: 200.0, 2: 400.0, 4: 390.0}
    calls = _fake_bench(monkeypatch, lambda w, pf, s: (first if s == 1.0 else confirmed)[w])
    r = run_search(small_dataset, _opts(tmp_path))
    assert r.recommended.params["num_workers"] == 2 and r.recommended.images_per_s == 400.0
    assert r.recommended.window_s == 3.0 and r.recommended.first_images_per_s == 400.0
    assert r.best.params["num_workers"] == 2  # 390 confirmed beats nothing
    confirmed_runs = sorted(w for w, _, s in calls if s == 3.0)
    assert confirmed_runs == [2, 4]  # the two fastest (the knee is one of them); no baseline in a grid
    assert not any("not confirmed" in w for w in r.warnings)

    # Resumed: nothing is measured again, not even a confirmation.
    calls.clear()
    r2 = run_search(small_dataset, _opts(tmp_path))
    assert calls == [] and r2.recommended.params == r.recommended.params
    # A different window is a different measurement: confirmed again.
    r3 = run_search(small_dataset, _opts(tmp_path, confirm_seconds=4.0))
    assert sorted(w for w, _, s in calls if s == 4.0) == [2, 4] and r3.recommended.window_s == 4.0


def test_the_gain_compares_confirmed_with_confirmed(small_dataset, tmp_path, monkeypatch):
    # The baseline (2 workers, pin, persistent here) reads 300 in its short window and
    # 400 in the long one; the recommended 4 workers 440 in the long one: gain 1.10x, not 1.47x.
    def figure(w, pf, s):
        if s == 1.0:
            return {1: 100.0, 2: 300.0, 4: 450.0}[w]
        return {1: 100.0, 2: 400.0, 4: 440.0}[w]

    _fake_bench(monkeypatch, figure)
    from autotune.search import recommend

    monkeypatch.setattr(recommend, "baseline_params", lambda cores, cuda: {
        "num_workers": 2, "prefetch_factor": 2, "persistent_workers": True, "pin_memory": True})
    r = run_search(small_dataset, _opts(tmp_path, grid=False, baseline=True))
    d = json.loads(Path(r.json_file).read_text())
    assert r.baseline.images_per_s == 300.0 and r.baseline_confirmed.images_per_s == 400.0
    assert r.recommended.params["num_workers"] == 4
    assert r.gain_vs_baseline == pytest.approx(440.0 / 400.0)
    assert d["baseline_confirmed"]["window_s"] == 3.0


def test_a_failed_confirmation_is_said_and_drops_out(small_dataset, tmp_path, monkeypatch):
    def figure(w, pf, s):
        if s == 3.0 and w == 4:
            return None  # crashes when measured again
        return {1: 200.0, 2: 400.0, 4: 500.0}[w]

    _fake_bench(monkeypatch, figure)
    r = run_search(small_dataset, _opts(tmp_path))
    assert r.recommended.params["num_workers"] == 2 and r.recommended.window_s == 3.0
    assert any("confirming" in w and "worker crashed" in w for w in r.warnings), r.warnings


def test_interrupted_confirmation_names_the_winner_from_the_trials_and_says_so(
        small_dataset, tmp_path, monkeypatch):
    def figure(w, pf, s):
        if s == 3.0:
            return KeyboardInterrupt()
        return {1: 200.0, 2: 400.0, 4: 500.0}[w]

    _fake_bench(monkeypatch, figure)
    r = run_search(small_dataset, _opts(tmp_path))
    assert r.stop_reason.startswith("interrupted")
    assert r.recommended.params["num_workers"] == 4 and r.recommended.window_s is None
    assert any("not confirmed" in w and "were not measured again" in w for w in r.warnings)
    # The windows the trials were measured in (the search said 10 s whatever they were).
    assert any("the figures are single windows of 1.0 s" in w for w in r.warnings), r.warnings
