"""The sampler thread: timing, clean stop, records, JSONL, summary, callback errors."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from autotune.errors import AutotuneError
from autotune.monitor import Sample, SystemMonitor, percentile


def _monitor_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "autotune-monitor"]


def test_samples_timestamps_and_clean_stop(tmp_path: Path) -> None:
    mon = SystemMonitor(path=tmp_path, pid=os.getpid(), interval=0.1)
    mon.start()
    assert len(_monitor_threads()) == 1
    time.sleep(0.75)
    mon.stop()
    assert _monitor_threads() == []
    mon.stop()   # idempotent
    recs = mon.records
    assert 6 <= len(recs) <= 10      # ~7 full intervals plus the final partial one
    monos = [r.monotonic for r in recs]
    walls = [r.time for r in recs]
    assert monos == sorted(monos) and len(set(monos)) == len(monos)
    assert walls == sorted(walls)
    assert abs(walls[-1] - time.time()) < 5
    for r in recs[:-1]:
        assert r.interval_s == pytest.approx(0.1, abs=0.08)
    d = recs[0].to_dict()
    assert d["disk"]["available"] and d["cpu"]["available"] and d["proc"]["available"]
    assert d["shm"]["available"] and "available" in d["gpu"]


def test_context_manager_jsonl_and_summary(tmp_path: Path) -> None:
    with SystemMonitor(path=tmp_path, interval=0.1, gpu=False) as mon:
        time.sleep(0.35)
    assert _monitor_threads() == []
    out = tmp_path / "m.jsonl"
    mon.write_jsonl(out)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == len(mon.records) >= 3
    assert lines[0]["proc"] is None and lines[0]["gpu"] is None   # not requested
    s = mon.summary()
    assert s["samples"] + s["samples_left_out"] == len(lines) and s["samples"] >= 3
    f = s["figures"]["cpu.total_pct"]
    assert f["median"] <= f["p95"] <= f["max"]
    assert s["window"]["disk"]["available"] is True
    assert s["overhead"]["wall_s"] > 0.3
    json.dumps(s)   # JSON-ready


def test_callback_receives_samples_and_its_errors_do_not_stop_sampling() -> None:
    got: list[Sample] = []

    def cb(s: Sample) -> None:
        got.append(s)
        if len(got) == 1:
            raise RuntimeError("boom")

    with SystemMonitor(interval=0.05, gpu=False, callback=cb) as mon:
        time.sleep(0.3)
    assert len(got) == len(mon.records) >= 4
    assert mon.errors == ["callback: RuntimeError: boom"]


def test_start_twice_and_bad_interval() -> None:
    with SystemMonitor(interval=0.05, gpu=False) as mon:
        with pytest.raises(RuntimeError):
            mon.start()
    with pytest.raises(AutotuneError):
        SystemMonitor(interval=0)


def test_stop_right_after_start_leaves_no_thread() -> None:
    mon = SystemMonitor(interval=10, gpu=False).start()
    t0 = time.monotonic()
    mon.stop()
    assert time.monotonic() - t0 < 2.0     # does not wait out the interval
    assert _monitor_threads() == []


def test_percentile_matches_numpy_linear() -> None:
    np = pytest.importorskip("numpy")
    vals = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    for q in (0, 50, 95, 100):
        assert percentile(vals, q) == pytest.approx(float(np.percentile(vals, q)))


def test_an_interval_after_a_failed_read_is_unavailable_not_a_raw_snapshot():
    # Seen under `ulimit -n 32`: one /proc/stat read failed (EMFILE), the next interval
    # carried the raw snapshot and the search's JSON could not be written.
    import json
    import time

    from autotune.monitor.cpu import CpuSnapshot, cpu_usage, read_cpu_times
    from autotune.monitor.records import Unavailable, to_jsonable
    from autotune.monitor.sampler import _rates

    cur = read_cpu_times()
    got = _rates(Unavailable("OSError: [Errno 24] Too many open files"), cur, CpuSnapshot,
                 cpu_usage)
    assert isinstance(got, Unavailable) and "Too many open files" in got.reason
    json.dumps(to_jsonable(got))
    assert isinstance(_rates(None, cur, CpuSnapshot, cpu_usage), Unavailable)
    time.sleep(0.05)
    assert not isinstance(_rates(cur, read_cpu_times(), CpuSnapshot, cpu_usage), Unavailable)


def test_a_monitor_that_keeps_no_samples_summarizes_them_as_they_come(tmp_path: Path) -> None:
    # `autotune monitor` runs beside a job for hours or days: holding every Sample grew it
    # by about 1.8 KB a sample (300 MB a day at 0.5 s) in the job's own memory limit. Its
    # callback writes each sample; the summary is built as they come, the same as from the
    # whole list.
    from autotune.monitor import summarize

    got: list[Sample] = []
    kept = SystemMonitor(path=tmp_path, pid=os.getpid(), interval=0.05, gpu=False)
    lean = SystemMonitor(path=tmp_path, pid=os.getpid(), interval=0.05, gpu=False,
                         callback=got.append, keep=False)
    with kept, lean:
        time.sleep(0.5)
    with pytest.raises(RuntimeError, match="keeps no samples"):
        lean.records
    assert not lean._records
    s = lean.summary()
    assert s["samples"] + s["samples_left_out"] == len(got) >= 5
    assert s["overhead"]["samples"] == len(got)
    assert {k: v for k, v in s.items() if k not in ("window", "overhead")} == summarize(
        got, min_interval_s=0.025)
    # The running summary of the monitor that keeps them equals the one of its list.
    k = kept.summary()
    assert {x: v for x, v in k.items() if x not in ("window", "overhead")} == summarize(
        kept.records, min_interval_s=0.025)
