"""`autotune monitor -- CMD`: the log, the time index, the metrics, the exit status, and
Ctrl-C / SIGTERM forwarded to the command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.errors import UsageError
from autotune.monitor.run import run_monitored

REPO = Path(__file__).resolve().parents[2]

CHATTY = r"""
import sys, time
for i in range(6):
    print(f"out {i}", flush=True)
    print(f"err {i}", file=sys.stderr, flush=True)
    time.sleep(0.1)
sys.stdout.write("no newline at the end")
sys.exit(3)
"""


def test_log_times_metrics_and_exit_status(tmp_path):
    out = tmp_path / "run"
    t0 = time.time()
    run = run_monitored([sys.executable, "-c", CHATTY], out, interval=0.1, gpu=False,
                        data=tmp_path)
    assert run.returncode == 3 and run.signal is None
    lines = (out / "train.log").read_text().splitlines()
    assert sorted(ln for ln in lines if ln.startswith(("out", "err"))) == sorted(
        [f"out {i}" for i in range(6)] + [f"err {i}" for i in range(6)])
    assert lines[-1] == "no newline at the end"       # a partial last line is kept, whole
    times = [tuple(map(float, x.split())) for x in (out / "train.log.times").read_text().splitlines()]
    offsets, stamps = [t[0] for t in times], [t[1] for t in times]
    assert offsets == sorted(offsets) and offsets[-1] == (out / "train.log").stat().st_size
    assert stamps == sorted(stamps) and t0 <= stamps[0] and stamps[-1] - stamps[0] >= 0.4
    samples = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(samples) == run.samples >= 4
    assert all(t0 - 1 < s["time"] < time.time() + 1 for s in samples)
    assert any((s.get("proc") or {}).get("available") for s in samples)
    assert any((s.get("sched") or {}).get("available") for s in samples)
    meta = json.loads((out / "run.json").read_text())
    assert meta["returncode"] == 3 and meta["data"] == str(tmp_path)
    assert run.steps is None                         # the command was not instrumented


def test_killed_command_reports_128_plus_signal(tmp_path):
    run = run_monitored([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), 9)"],
                        tmp_path / "run", gpu=False)
    assert run.returncode == 137 and run.signal == 9


def test_command_not_found(tmp_path):
    with pytest.raises(UsageError, match="no-such-program-xyz: command not found"):
        run_monitored(["no-such-program-xyz"], tmp_path / "run", gpu=False)
    with pytest.raises(UsageError, match="put it after `--`"):
        run_monitored([], tmp_path / "run", gpu=False)


def test_steps_log_env_reaches_the_command(tmp_path):
    code = ("import autotune\n"
            "for _ in autotune.instrument(range(20), batch_size=4):\n    pass\n")
    run = run_monitored([sys.executable, "-c", code], tmp_path / "run", gpu=False)
    assert run.returncode == 0
    assert run.steps and sum('"wait_s"' in x for x in Path(run.steps).read_text().splitlines()) == 20


TRAPS = r"""
import signal, sys, time
def on(sig, frame):
    print(f"got {signal.Signals(sig).name}", flush=True)
    sys.exit(7)
signal.signal(signal.SIGTERM, on)
signal.signal(signal.SIGINT, on)
print("ready", flush=True)
time.sleep(30)
"""


def _monitor_until_ready(out, script: str) -> subprocess.Popen:
    """`autotune monitor` running `python -c script`, once the script has printed "ready"."""
    p = subprocess.Popen([sys.executable, "-m", "autotune", "monitor", "--out",
                          str(out), "--no-gpu", "--interval", "0.2", "--", sys.executable,
                          "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=REPO)
    deadline = time.time() + 30
    while "ready" not in (out / "train.log").read_text() if (out / "train.log").exists() else True:
        assert time.time() < deadline, "the command never started"
        time.sleep(0.05)
    return p


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_cli_forwards_signals_and_exits_with_the_commands_status(tmp_path, sig):
    out = tmp_path / "run"
    p = _monitor_until_ready(out, TRAPS)
    p.send_signal(sig)
    stdout, stderr = p.communicate(timeout=30)
    assert p.returncode == 7, stderr
    assert f"got {sig.name}" in (out / "train.log").read_text()
    assert f"forwarded {sig.name}" in stderr
    assert "no analysis" in stderr                # no step timing in this log: said, not fatal


IGNORES_SIGINT = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)   # as a shell's background job starts it
print("ready", flush=True)
time.sleep(60)
"""


def test_a_ctrl_c_stops_a_command_that_ignores_sigint(tmp_path):
    """A command started with SIGINT ignored (a script's background job) ran to its end
    through every Ctrl-C forwarded to it (a user's review: 40 s, three SIGINTs); it gets
    SIGTERM for the user's Ctrl-C, and run.json counts it as the user's stop."""
    out = tmp_path / "run"
    p = _monitor_until_ready(out, IGNORES_SIGINT)
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=40)
    assert p.returncode == 128 + signal.SIGTERM, stderr
    run = json.loads((out / "run.json").read_text())
    assert run["forwarded_signals"] == ["SIGTERM"], run
    # The summary names the signal as analyze does, not by its number ("killed by 15").
    assert "killed by SIGTERM (status 143)" in stderr, stderr


def test_cli_monitor_needs_a_command(tmp_path):
    r = subprocess.run([sys.executable, "-m", "autotune", "monitor", "--out",
                        str(tmp_path / "r"), "--"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and "put it after `--`" in r.stderr


def test_run_queue_sampler_sees_cpu_demand_and_sleep():
    from autotune.runqueue import RunQueueSampler, allowed_cpus, procs_running

    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    nap = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.3)
        samplers = {p.pid: RunQueueSampler(p.pid) for p in (spin, nap)}
        t0 = time.monotonic()
        for s in samplers.values():
            assert s.sample(t0) is None              # the baseline
        time.sleep(1.0)
        t1 = time.monotonic()
        busy, idle = samplers[spin.pid].sample(t1), samplers[nap.pid].sample(t1)
    finally:
        spin.kill()
        nap.kill()
        spin.wait()
        nap.wait()
    # wanted (on a CPU + runnable) is ~100 % however busy the machine; how much of it was
    # on a CPU is the machine's load (13 % beside a full test run here): only that it ran.
    assert busy.wanted_pct > 80 and busy.on_cpu_pct > 0 and busy.tasks >= 1
    assert idle.wanted_pct < 5
    assert busy.cpus == sorted(os.sched_getaffinity(0)) == allowed_cpus(os.getpid())
    assert procs_running() >= 1


def test_cli_json_to_stdout_is_only_the_json(tmp_path):
    """`--json -` is for a script reading stdout: the command's own prints go to stderr."""
    code = ("import autotune, time\n"
            "print('hello from training', flush=True)\n"
            "for _ in autotune.instrument(range(60), batch_size=4):\n    time.sleep(0.005)\n")
    r = subprocess.run([sys.executable, "-m", "autotune", "monitor", "--out", str(tmp_path / "r"),
                        "--no-gpu", "--json", "-", "--", sys.executable, "-c", code],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["steps"] > 0       # the whole of stdout is one JSON document
    assert "hello from training\n" in r.stderr
    assert "hello from training" in (tmp_path / "r" / "train.log").read_text()


def test_a_run_shorter_than_the_first_sample_is_analysed_from_its_log(tmp_path):
    """The command ended before the monitor's first sample: an empty metrics.jsonl. The
    analysis is made from the step log alone, and says so (it was refused)."""
    from autotune.analyze import analyze

    run = tmp_path / "run"
    run.mkdir()
    code = ("import autotune, time\n"
            "for _ in autotune.instrument(range(60), batch_size=4, log=%r):\n"
            "    time.sleep(0.002)\n" % str(run / "steps.jsonl"))
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=120)
    (run / "metrics.jsonl").write_text("")
    a = analyze(run)
    assert a.steps > 0
    assert any("holds no sample" in w for w in a.warnings), a.warnings


QUIET = """
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
print("ready", flush=True)
time.sleep(60)          # a job that logs to its own files: it never writes to the pipe again
"""


def test_a_killed_monitor_takes_its_command_with_it(tmp_path):
    """The scheduler's SIGKILL of the monitor's process group (after the grace period,
    `timeout -k`, Slurm's proctrack/pgid) never reached the command, which runs in a group
    of its own: it trained on unobserved for its whole run, beside the requeued job. Now it
    gets SIGTERM when the monitor dies, however the monitor dies."""
    out, pidfile = tmp_path / "run", tmp_path / "cmd.pid"
    p = subprocess.Popen([sys.executable, "-m", "autotune", "monitor", "--out", str(out),
                          "--no-gpu", "--interval", "0.2", "--", sys.executable, "-c", QUIET,
                          str(pidfile)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         cwd=REPO, start_new_session=True)
    deadline = time.time() + 30
    while not ((out / "train.log").exists() and "ready" in (out / "train.log").read_text()):
        assert time.time() < deadline and p.poll() is None, "the command never started"
        time.sleep(0.05)
    cmd_pid = int(pidfile.read_text())
    os.killpg(p.pid, signal.SIGKILL)          # the monitor's group: the command is not in it
    p.wait()
    try:
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                os.kill(cmd_pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"the command (pid {cmd_pid}) outlived the killed monitor by 10 s")
    finally:
        try:
            os.kill(cmd_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


STEPS_THEN_QUIET = """
import os, sys, time
import autotune
open(sys.argv[1], "w").write(str(os.getpid()))
for _ in autotune.instrument(range(40), batch_size=4):
    time.sleep(0.01)
print("ready", flush=True)
time.sleep(60)
"""


def test_analyze_says_the_end_is_unknown_after_the_monitor_was_killed(tmp_path):
    """A monitor killed by SIGKILL wrote no run.json (it wrote it only at the end), and
    `analyze DIR` then said nothing of how the job ended, as if it had run to the end."""
    out, pidfile = tmp_path / "run", tmp_path / "cmd.pid"
    p = subprocess.Popen([sys.executable, "-m", "autotune", "monitor", "--out", str(out),
                          "--no-gpu", "--interval", "0.2", "--", sys.executable, "-c",
                          STEPS_THEN_QUIET, str(pidfile)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, cwd=REPO)
    try:
        deadline = time.time() + 60
        while not ((out / "train.log").exists() and "ready" in (out / "train.log").read_text()):
            assert time.time() < deadline and p.poll() is None, "the command never got ready"
            time.sleep(0.05)
        time.sleep(0.5)                        # a monitor sample or two
        p.kill()
        p.wait()
    finally:
        if pidfile.exists():
            try:
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    a = subprocess.run([sys.executable, "-m", "autotune", "analyze", str(out), "--json", "-"],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert a.returncode == 0, a.stderr
    d = json.loads(a.stdout)
    assert d["run"] is not None and d["run"]["outcome"] == "unknown", d["run"]
    assert any("how the job ended is unknown" in w for w in d["warnings"]), d["warnings"]
    t = subprocess.run([sys.executable, "-m", "autotune", "analyze", str(out)],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert "how it ended is unknown" in t.stdout + t.stderr, t.stdout
