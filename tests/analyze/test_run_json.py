"""What the monitor's run.json adds to the analysis: a job that failed is said (with its
status, and /dev/shm when its log or the metrics point there), a user's Ctrl-C is not; and
the disk the monitor watched without --data is named, with `--data` as the fix."""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path

import pytest

from rich.console import Console

from autotune.analyze import analyze
from autotune.errors import UsageError
from autotune.cli.tables.analyze import analysis_renderable
from autotune.monitor.run import run_monitored

T0 = 1_700_000_000.0
MIB = 2**20
SHM_LINE = ("RuntimeError: unable to allocate shared memory(shm) for file </torch_31_1807_0>: "
            "No space left on device (28)")


def _rendered(a) -> str:
    con = Console(width=200, record=True, file=open(os.devnull, "w"))
    con.print(analysis_renderable(a))
    return con.export_text()


def monitor_dir(path: Path, *, run: dict, log: str = "", shm_used_mib: float | None = None,
                steps: int = 40, device: str = "vda") -> Path:
    """A monitor output dir: an instrument() step log (40 steps, 0.1 s apart, waiting
    20 %), its train.log, metrics every 0.5 s over the steps (and 3 s after), run.json."""
    path.mkdir()
    head = {"autotune": "steps", "version": 1, "cores": 4,
            "loader": {"num_workers": 4, "prefetch_factor": 2, "dataset": {"root": "/data/train"}}}
    rows = [json.dumps(head)] + [json.dumps({"t": T0 + 0.1 * i, "epoch": 0, "step": i,
                                             "wait_s": 0.02, "step_s": 0.08, "batch": 32})
                                 for i in range(steps)]
    (path / "steps.jsonl").write_text("\n".join(rows) + "\n")
    (path / "train.log").write_text(log)
    shm = (None if shm_used_mib is None else
           {"available": True, "used_bytes": int(shm_used_mib * MIB), "total_bytes": 64 * MIB})
    recs = []
    for k in range(int((0.1 * steps + 3) / 0.5)):
        t = T0 + 0.5 * (k + 1)
        recs.append(json.dumps({
            "time": t, "monotonic": t, "interval_s": 0.5,
            "disk": {"available": True, "device": device, "reads_per_s": 708.0,
                     "read_mib_s": 30.0, "r_await_ms": 0.5, "util_pct": 10.0},
            "cpu": {"available": True, "total_pct": 50.0, "iowait_pct": 0.0,
                    "per_core_pct": [50.0] * 4},
            "shm": shm if k < 2 * 0.1 * steps else shm and {**shm, "used_bytes": 1 * MIB},
            "gpu": {"available": False, "reason": "NVML: no GPU found"}}))
    (path / "metrics.jsonl").write_text("\n".join(recs) + "\n")
    base = {"command": ["python", "train.py"], "data": "/data/train", "watched": "/data/train",
            "returncode": 0, "signal": None, "seconds": 7.5, "forwarded_signals": []}
    (path / "run.json").write_text(json.dumps({**base, **run}))
    return path


def test_a_crash_of_full_shm_is_said_beside_the_verdict(tmp_path):
    ok = analyze(monitor_dir(tmp_path / "ok", run={}, shm_used_mib=48))
    crashed = monitor_dir(tmp_path / "crashed", run={"returncode": 1},
                          log=f"epoch 0\nTraceback (most recent call last):\n{SHM_LINE}\n",
                          shm_used_mib=48)
    a = analyze(crashed)
    assert a.verdict.bottleneck == ok.verdict.bottleneck      # the verdict is kept
    assert not any("failed" in w for w in ok.warnings)        # a job that ended well: quiet
    failed = [w for w in a.warnings if w.startswith("the job failed")]
    assert failed and "exit status 1 after 7.5 s" in failed[0], a.warnings
    assert "run.json" in failed[0] and f"only the {a.steps} step(s)" in failed[0]
    shm = [w for w in a.warnings if w.startswith("/dev/shm was the likely cause")]
    assert shm, a.warnings
    assert "unable to allocate shared memory" in shm[0] and "48 of 64 MiB (75%)" in shm[0]
    assert "--shm-size" in shm[0] and "num_workers" in shm[0]
    d = json.loads(json.dumps(a.to_dict()))["run"]
    assert d["outcome"] == "failed" and d["returncode"] == 1
    assert d["shm"]["log_line"] == SHM_LINE and d["shm"]["peak_share"] == 0.75
    text = _rendered(a)
    assert "job: FAILED (exit status 1)" in text and "/dev/shm: the likely cause" in text


def test_the_metrics_alone_or_the_log_alone_point_at_shm(tmp_path):
    by_metrics = analyze(monitor_dir(tmp_path / "m", run={"returncode": 1}, shm_used_mib=60))
    assert any(w.startswith("/dev/shm was the likely cause") and "60 of 64 MiB" in w
               for w in by_metrics.warnings), by_metrics.warnings
    bus = "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Bus error.\n"
    by_log = analyze(monitor_dir(tmp_path / "l", run={"returncode": 1, "signal": None},
                                 log=bus))
    assert any(w.startswith("/dev/shm was the likely cause") and "Bus error" in w
               for w in by_log.warnings), by_log.warnings
    # Another failure (no shm line, /dev/shm a quarter full): failed, with no cause guessed.
    other = analyze(monitor_dir(tmp_path / "o", run={"returncode": 137, "signal": 9},
                                log="ValueError: bad label\n", shm_used_mib=16))
    assert any(w.startswith("the job failed: killed by SIGKILL (status 137)")
               for w in other.warnings), other.warnings
    assert not any("/dev/shm" in w for w in other.warnings)


def test_a_job_that_ran_with_dev_shm_nearly_full_is_told_it_has_little_room(tmp_path):
    """A job that ended well with /dev/shm 86 % full at a sample (a user's walk: a plain
    DataLoader, 2 workers x prefetch 2 of 18 MiB batches in a 64 MiB /dev/shm): one worker
    more dies of it. Half full: nothing said."""
    full = analyze(monitor_dir(tmp_path / "full", run={"returncode": 0}, shm_used_mib=55))
    said = [w for w in full.warnings if w.startswith("/dev/shm was 86% full")]
    assert said and "55 of 64 MiB" in said[0] and "--shm-size" in said[0], full.warnings
    assert not any("failed" in w or "likely cause" in w for w in full.warnings)
    half = analyze(monitor_dir(tmp_path / "half", run={"returncode": 0}, shm_used_mib=32))
    assert not any("/dev/shm" in w for w in half.warnings), half.warnings


def test_a_users_ctrl_c_is_not_a_crash(tmp_path):
    for name, run in (("int", {"returncode": 130, "signal": 2, "forwarded_signals": ["SIGINT"]}),
                      ("exit130", {"returncode": 130}),
                      ("term", {"returncode": 1, "forwarded_signals": ["SIGTERM"]}),
                      # a scheduler's SIGTERM to the job itself, not through the monitor
                      ("sched", {"returncode": 143, "signal": 15})):
        a = analyze(monitor_dir(tmp_path / name, run=run, log=f"{SHM_LINE}\n",
                                shm_used_mib=60))
        assert a.run["outcome"] == "stopped", name
        assert not any("failed" in w or "/dev/shm" in w for w in a.warnings), (name, a.warnings)
        shown = _rendered(a)
        assert "FAILED" not in shown and "job: stopped (" in shown, shown


def test_without_data_the_watched_disk_is_named_and_data_is_the_fix(tmp_path):
    a = analyze(monitor_dir(tmp_path / "nodata", run={"data": None, "watched": "/home/me/job"}))
    said = [w for w in a.warnings if w.startswith("disk vda:")]
    assert said, a.warnings
    assert "/home/me/job" in said[0] and "no --data" in said[0]
    assert "may not hold the dataset" in said[0]
    assert "`autotune monitor --data /data/train -- ...`" in said[0]   # the step log's dataset
    assert a.run["disk"] == {"device": "vda", "path": "/home/me/job", "measured": True,
                             "from": "the current directory (no --data)"}
    assert "disk watched: vda (/home/me/job, from the current directory (no --data))" in \
        _rendered(a)
    # With --data, the disk is the dataset's: nothing to say.
    b = analyze(monitor_dir(tmp_path / "data", run={}))
    assert not any(w.startswith("disk ") for w in b.warnings) and b.run["disk"]["from"] == "--data"
    # Without it, but the dataset is on the disk watched: nothing to say either.
    from autotune.monitor.diskstats import resolve_disk

    here = getattr(resolve_disk(tmp_path), "name", None)
    if here is not None:
        c = analyze(monitor_dir(tmp_path / "same", run={"data": None, "watched": str(tmp_path)},
                                device=here), dataset=str(tmp_path))
        assert not any(w.startswith("disk ") for w in c.warnings), c.warnings


def test_monitor_records_the_watched_directory_without_data(tmp_path):
    run = run_monitored([sys.executable, "-c", "pass"], tmp_path / "run", gpu=False)
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["data"] is None and meta["watched"] == os.getcwd() == run.watched


CRASHING_JOB = f"""
import sys, time, autotune
for _ in autotune.instrument(range(30), batch_size=8):
    time.sleep(0.01)
print("Traceback (most recent call last):", file=sys.stderr)
print({SHM_LINE!r}, file=sys.stderr)
sys.exit(1)
"""


def test_a_real_monitored_job_that_dies_of_shm(tmp_path):
    run = run_monitored([sys.executable, "-c", CRASHING_JOB], tmp_path / "run", gpu=False,
                        data=tmp_path, interval=0.1)
    assert run.returncode == 1
    a = analyze(tmp_path / "run")
    assert a.format == "own" and a.run["outcome"] == "failed"
    assert any(w.startswith("the job failed: exit status 1") for w in a.warnings), a.warnings
    assert any(w.startswith("/dev/shm was the likely cause") and "train.log says" in w
               for w in a.warnings), a.warnings


def test_a_job_that_dies_of_shm_in_its_warm_up_gets_that_as_its_verdict(tmp_path):
    # One step logged, then the first batches in flight filled a 64 MiB /dev/shm (as a
    # README walk in a container saw with examples/train_cnn.py): that step is start-up.
    # Before: "loader-configuration-bound (main process)" from it, and a next search
    # emulating its 2,000 ms as the step. A job that trained first keeps its verdict
    # (test_a_crash_of_full_shm_is_said_beside_the_verdict).
    a = analyze(monitor_dir(tmp_path / "run", run={"returncode": 1}, steps=1,
                            log=f"Traceback (most recent call last):\n{SHM_LINE}\n",
                            shm_used_mib=37))
    v = a.verdict
    assert v.bottleneck == "loader" and v.summary.startswith(
        "loader-configuration-bound (/dev/shm): the job failed"), v.summary
    assert any("the job failed on /dev/shm" in e and "unable to allocate" in e
               for e in v.evidence), v.evidence
    assert "--shm-size" in v.advice[0] and "autotune search" in v.advice[0]
    assert v.next_command.startswith("autotune search /data/train")
    assert "--compute-ms MS" in v.next_command, v.next_command   # no start-up step time
    failed = [w for w in a.warnings if w.startswith("the job failed")]
    assert failed and "not why it failed" not in failed[0], failed
    # A /dev/shm seen nearly full, with nothing of it in the job's log, may be another
    # process's: named as the likely cause beside the verdict, never as the verdict.
    seen = analyze(monitor_dir(tmp_path / "seen", run={"returncode": 1}, steps=1,
                               log="ValueError: bad label\n", shm_used_mib=60))
    assert any(w.startswith("/dev/shm was the likely cause") for w in seen.warnings)
    assert "(/dev/shm)" not in seen.verdict.summary, seen.verdict.summary


FILES_LINE = "RuntimeError: received 0 items of ancdata"
EMFILE_IN_WORKER = ("RuntimeError: unable to open shared memory object </torch_28185_1355_37> "
                    "in read-write mode: Too many open files (24)")


def test_a_job_that_dies_of_the_open_files_limit_in_its_warm_up_gets_that_as_its_verdict(
        tmp_path):
    # torch's error when the training process cannot take a batch's file descriptors
    # (a detection collate's 128 tensors a batch under a container's soft ulimit -n 1024),
    # after one step: before, "loader-configuration-bound (main process)" from that step.
    a = analyze(monitor_dir(tmp_path / "run", run={"returncode": 1}, steps=1,
                            log=f"Traceback (most recent call last):\n{FILES_LINE}\n"))
    v = a.verdict
    assert v.bottleneck == "loader" and v.summary.startswith(
        "loader-configuration-bound (open files): the job failed"), v.summary
    assert any("the job failed on the open-files limit" in e and "ancdata" in e
               for e in v.evidence), v.evidence
    assert "ulimit -n" in v.advice[0] and "file_system" in v.advice[0]
    assert "--compute-ms MS" in v.next_command, v.next_command
    said = [w for w in a.warnings if w.startswith("the open-files limit was the likely cause")]
    assert said and "ulimit -n" in said[0], a.warnings
    assert not any(w.startswith("/dev/shm was") for w in a.warnings), a.warnings
    failed = [w for w in a.warnings if w.startswith("the job failed")]
    assert failed and "not why it failed" not in failed[0], failed
    d = json.loads(json.dumps(a.to_dict()))["run"]
    assert d["files"]["log_line"] == FILES_LINE and d["verdict_is_failure"] is True
    text = _rendered(a)
    assert "job: FAILED (exit status 1): the verdict is its failure" in text, text
    assert "the open-files limit: the likely cause" in text
    # Batches in flight fill /dev/shm too: seen nearly full, it is not a second cause.
    both = analyze(monitor_dir(tmp_path / "both", run={"returncode": 1}, steps=1,
                               log=f"{FILES_LINE}\n", shm_used_mib=60))
    assert both.verdict.summary.startswith("loader-configuration-bound (open files)")
    assert not any(w.startswith("/dev/shm was") for w in both.warnings), both.warnings
    # Two lines in the log: the later one ended the job.
    later = analyze(monitor_dir(tmp_path / "later", run={"returncode": 1}, steps=1,
                                log=f"{SHM_LINE}\nretrying\n{FILES_LINE}\n"))
    assert later.verdict.summary.startswith("loader-configuration-bound (open files)")
    earlier = analyze(monitor_dir(tmp_path / "earlier", run={"returncode": 1}, steps=1,
                                  log=f"{FILES_LINE}\nretrying\n{SHM_LINE}\n"))
    assert earlier.verdict.summary.startswith("loader-configuration-bound (/dev/shm)")
    assert not any(w.startswith("the open-files limit was") for w in earlier.warnings)


def test_a_worker_out_of_open_files_is_not_read_as_dev_shm(tmp_path):
    # torch's worker-side EMFILE names "shared memory": it is the open-files limit, and a
    # job that trained first keeps its steps' verdict with the cause said beside it.
    ok = analyze(monitor_dir(tmp_path / "ok", run={}))
    a = analyze(monitor_dir(tmp_path / "run", run={"returncode": 1},
                            log=f"epoch 0\n{EMFILE_IN_WORKER}\n"))
    assert a.verdict.bottleneck == ok.verdict.bottleneck
    assert "(open files)" not in a.verdict.summary and "(/dev/shm)" not in a.verdict.summary
    assert any(w.startswith("the open-files limit was the likely cause") and
               "Too many open files" in w for w in a.warnings), a.warnings
    assert not any("/dev/shm" in w for w in a.warnings), a.warnings


# A job that holds 340 files open under a soft limit of 400 it set itself, as a DataLoader
# whose batches of many tensors hold their files in flight does, then ends as argv[1] says.
HOLDING_JOB = """
import os, resource, sys, time, autotune
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (400, hard))
fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(340)]
time.sleep(1.5)   # held long enough for the monitor's samples, 0.1 s apart, on a busy machine
for _ in autotune.instrument(range(0 if sys.argv[1] == "early" else 40), batch_size=8):
    time.sleep(0.02)
if sys.argv[1] in ("fail", "early"):
    print("RuntimeError: DataLoader timed out after 5 seconds", file=sys.stderr)
    sys.exit(1)
"""


def test_a_job_seen_near_its_open_files_limit_is_told_so_with_its_own_hard_limit(tmp_path):
    """The log of a job whose worker dropped a batch on EMFILE says only that the
    DataLoader timed out: the monitor's count of the job's open files names the cause, and
    the fix the job's own hard limit (read from /proc/PID/limits, not analyze's)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 600:
        pytest.skip(f"the hard open-files limit is {hard}")
    to = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    for end in ("fail", "ok"):
        run = run_monitored([sys.executable, "-c", HOLDING_JOB, end], tmp_path / end,
                            gpu=False, data=tmp_path, interval=0.1)
        assert run.returncode == (1 if end == "fail" else 0)
        a = analyze(tmp_path / end)
        said = [w for w in a.warnings if "open files of its limit of 400" in w]
        assert len(said) == 1, a.warnings
        assert f"`ulimit -n {to}` in the job's shell" in said[0], said[0]
        if end == "fail":
            # Only seen, the log naming no cause: it may have been.
            assert said[0].startswith("the open-files limit may have been the cause"), said[0]
            files = a.to_dict()["run"]["files"]
            assert files["log_line"] is None and files["nearly_full"] and files["limit"] == 400
            assert 340 <= files["peak_open"] < 400, files
            # Only seen, not named by the log: the steps' verdict stands.
            assert "(open files)" not in a.verdict.summary, a.verdict.summary
        else:
            assert "the job fits with little room" in said[0], said[0]


def test_a_job_that_failed_before_its_first_step_is_told_its_cause_not_a_format_error(
        tmp_path):
    """A job that dies on its first batch (the usual way a container's limit shows)
    logged no step: analyze said "no known step-timing format", as though the log were
    the question. It now says first how the job ended and what may have caused it, still
    exit 2."""
    run = run_monitored([sys.executable, "-c", HOLDING_JOB, "early"], tmp_path / "early",
                        gpu=False, data=tmp_path, interval=0.1)
    assert run.returncode == 1
    with pytest.raises(UsageError) as e:
        analyze(tmp_path / "early")
    msg = str(e.value)
    assert "the job failed (exit status 1" in msg and "No step timing to analyse" in msg, msg
    assert "the open-files limit may have been the cause" in msg and "of its limit of 400" in msg
    # How the job ended first; the format's own hint still follows, in case it was that.
    assert msg.index("the job failed") < msg.index("step-timing format"), msg
    # A job that failed of something else before its first step: no cause is made up.
    other = monitor_dir(tmp_path / "other", run={"returncode": 1}, steps=0,
                        log="ValueError: bad label in sample 3\n")
    with pytest.raises(UsageError) as e:
        analyze(other)
    assert "No step timing to analyse" in str(e.value)
    assert "cause" not in str(e.value).split("No step timing")[0], str(e.value)
    # One that did not fail keeps the format error.
    with pytest.raises(UsageError, match="step-timing format"):
        analyze(monitor_dir(tmp_path / "ok", run={}, steps=0, log="hello\n"))


def test_a_run_folders_train_log_with_no_timing_points_at_its_step_log(tmp_path):
    """A job wrapped in autotune.instrument prints no step lines of its own: analyzing its
    train.log said "wrap the loader with autotune.instrument(loader)", which it was."""
    run = monitor_dir(tmp_path / "run", run={}, log="epoch 0 done\nepoch 1 done\n")
    with pytest.raises(UsageError) as e:
        analyze(run / "train.log")
    msg = str(e.value)
    assert msg.startswith(f"{run / 'train.log'}: no step timing in it, but {run} holds"), msg
    assert f"`autotune analyze {run}` reads it" in msg, msg


def test_an_oom_kill_that_did_not_end_the_job_is_no_more_than_a_possible_cause(tmp_path):
    """A review: with autotune.DataLoader's workers the OOM killer's first choice (and a
    worker it takes replaced by fewer), a job that lost a worker and later failed of its
    own error was told the memory limit was the likely cause and that its log held no
    error; a /dev/shm line in the log lost to the count."""
    mem = {"limit_bytes": 700 * MIB, "limit_file": "/sys/fs/cgroup/x/memory.max", "oom_kills": 1}
    later = analyze(monitor_dir(tmp_path / "later", run={"returncode": 1, "memory": mem},
                                log="Traceback (most recent call last):\nValueError: bad\n"))
    said = [w for w in later.warnings if w.startswith("the memory limit")]
    assert said and said[0].startswith("the memory limit may have been the cause"), said
    assert any("with the error" in w for w in later.warnings), later.warnings
    shm = analyze(monitor_dir(tmp_path / "shm", run={"returncode": 1, "memory": mem},
                              log=f"Traceback (most recent call last):\n{SHM_LINE}\n"))
    assert any(w.startswith("/dev/shm was the likely cause") for w in shm.warnings)
    assert not any(w.startswith("the memory limit") for w in shm.warnings), shm.warnings
    killed = analyze(monitor_dir(tmp_path / "killed", run={"returncode": 137, "signal": 9,
                                                           "memory": mem}))
    said = [w for w in killed.warnings if w.startswith("the memory limit")]
    assert said and said[0].startswith("the memory limit was the likely cause"), said
    assert "OOM killer ended 1 process(es)" in said[0] and "limit 700 MiB" in said[0], said
    assert any("prints nothing there" in w for w in killed.warnings), killed.warnings
    assert json.loads(json.dumps(killed.to_dict()))["run"]["memory"]["counted"] is True
