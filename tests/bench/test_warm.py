"""Measurement processes forked from the warm interpreter (autotune.bench.warm): real
measurements, each its own process, the search's child, seeded afresh; and the plain
start when the warm interpreter is gone."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from autotune.bench.config import BenchConfig
from autotune.bench.runner import run_bench
from autotune.bench.warm import WARM_ENV, WarmStarter

STEP = '''
import json, os, random
import numpy, psutil

_done = False

def step(batch):
    global _done
    if not _done:
        _done = True
        with open(os.environ["AUTOTUNE_TEST_WARM_OUT"], "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "ppid": os.getppid(),
                                "sid": os.getsid(0), "warm": os.environ.get("%s"),
                                "random": random.random(),
                                "cmdline": psutil.Process().cmdline(), "np": float(numpy.random.rand()),
                                "fds": sorted(int(x) for x in os.listdir("/proc/self/fd"))})
                    + "\\n")
''' % WARM_ENV


def _cfg(step: Path, **kw) -> BenchConfig:
    base = dict(num_workers=1, batch_size=4, seconds=1, cold=False, timeout_s=90,
                step=f"{step}:step")
    base.update(kw)
    return BenchConfig.from_preset("decode-only", **base)


@pytest.fixture
def step_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    step = tmp_path / "warmstep.py"
    step.write_text(STEP)
    out = tmp_path / "seen.jsonl"
    monkeypatch.setenv("AUTOTUNE_TEST_WARM_OUT", str(out))
    return step, out


def _seen(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_measurements_are_forked_children_of_the_caller_each_seeded_afresh(
        small_dataset: Path, step_file: tuple[Path, Path]):
    step, out = step_file
    with WarmStarter() as warm:
        results = [run_bench(small_dataset, _cfg(step), popen=warm.popen) for _ in range(2)]
        assert warm.forked == 2 and warm.fallback is None
    plain = run_bench(small_dataset, _cfg(step))
    for r in results:
        assert not r.failed, (r.reason, r.hint)
        assert r.images_per_s > 0
    seen = _seen(out)
    assert len(seen) == 3 and seen[2]["warm"] is None
    plain_seen = seen.pop()
    for s, r in zip(seen, results):
        assert s["warm"] == "1"
        assert s["ppid"] == os.getpid()          # re-parented to the caller: waited on by pid
        assert s["sid"] == s["pid"]              # its own session, as start_new_session gives
        # Its command line is the plain start's, as psutil and ps read it (setproctitle's
        # form: the words joined by spaces), with no padding left in it.
        assert s["cmdline"][1:3] == ["-m", "autotune.bench.child"], s["cmdline"]
        assert s["cmdline"][3].endswith("spec.json") and len(s["cmdline"]) == 7, s["cmdline"]
        assert s["pid"] == r.process["pid"] and r.process["returncode"] == 0
    # NumPy's global generator is not seeded from the configuration (Python's and torch's
    # are): a fresh interpreter seeds it from the OS; forks of one would repeat its state.
    assert seen[0]["np"] != seen[1]["np"]
    # Only what Popen hands over (stdio, the two pipes): the same descriptors as the
    # plainly started measurement holds at the same point. The pipes keep the numbers
    # they had in the caller (argv names them), which other tests' descriptors left open
    # in this process may move between the warm and the plain run: compared apart.
    def _own(s):
        piped = {int(s["cmdline"][5]), int(s["cmdline"][6])}
        return [fd for fd in s["fds"] if fd not in piped], len(piped & set(s["fds"]))

    assert _own(seen[0]) == _own(plain_seen), (seen[0]["fds"], plain_seen["fds"])
    # Its memory reads as a plain start's: the library pages importing torch mapped in are
    # counted (a fork alone copies no page-table entries of file mappings).
    print("peak RSS MiB, warm / plain:", [r.peak_rss_mib for r in results], plain.peak_rss_mib)
    for r in results:
        assert r.peak_rss_mib > 0.95 * plain.peak_rss_mib, (r.peak_rss_mib, plain.peak_rss_mib)


def test_a_killed_warm_interpreter_means_a_plain_start_not_a_failed_measurement(
        small_dataset: Path, step_file: tuple[Path, Path]):
    step, out = step_file
    with WarmStarter() as warm:
        first = run_bench(small_dataset, _cfg(step), popen=warm.popen)
        assert warm._proc is not None
        os.kill(warm._proc.pid, signal.SIGKILL)
        second = run_bench(small_dataset, _cfg(step), popen=warm.popen)
        assert warm.forked == 1
        assert "warm interpreter" in (warm.fallback or "")
    assert not first.failed and not second.failed, (second.reason, second.hint)
    assert [s["warm"] for s in _seen(out)] == ["1", None]


def test_a_measurement_that_hangs_is_killed_with_its_workers(small_dataset: Path,
                                                            step_file: tuple[Path, Path],
                                                            tmp_path: Path):
    step, _out = step_file
    hang = tmp_path / "hangstep.py"
    hang.write_text("import time\n\ndef step(batch):\n    time.sleep(3600)\n")
    with WarmStarter() as warm:
        r = run_bench(small_dataset, _cfg(hang, timeout_s=6), popen=warm.popen)
        assert warm.forked == 1
    assert r.failed and r.failure_kind == "hung", (r.failure_kind, r.reason)
    assert r.process["returncode"] == -signal.SIGKILL
    assert r.process["stray"] == [] and r.process["zombies"] == [], r.process
    for pid in [r.process["pid"], *r.process["killed"]]:   # none of the group is left
        assert not os.path.exists(f"/proc/{pid}"), pid


def test_a_process_the_search_does_not_take_as_its_child_exits_unmeasured(
        small_dataset: Path, step_file: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch):
    # As when this process is no subreaper: the forked process is not ours to wait on.
    # Its lease is closed unanswered; it must exit before it measures anything, and the
    # measurement starts the plain way instead.
    from autotune.bench import warm as warm_mod

    refused = []

    def not_ours(pid: int) -> int:
        refused.append(pid)
        return 1

    monkeypatch.setattr(warm_mod, "_parent_of", not_ours)
    step, out = step_file
    with WarmStarter() as warm:
        r = run_bench(small_dataset, _cfg(step), popen=warm.popen)
        assert warm.forked == 0 and "re-parented" in (warm.fallback or "")
    assert not r.failed, (r.reason, r.hint)
    assert [s["warm"] for s in _seen(out)] == [None]     # only the plain start measured
    assert len(refused) == 1
    _pid, status = os.waitpid(refused[0], 0)           # our child; exited on its own
    assert os.waitstatus_to_exitcode(status) == 3
