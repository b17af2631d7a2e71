"""`autotune probe` end to end as a user runs it: a real process, real fio."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from autotune_base.units import fmt_bytes

REQUIRED = {"path", "filesystem", "fio", "fio_error", "replay", "verdict"}


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotune", *args], capture_output=True,
                          text=True, timeout=300, env=env)


def test_help_lists_commands_options_and_exit_codes():
    top = run("--help")
    assert top.returncode == 0 and "probe" in top.stdout and "exit status" in top.stdout
    p = run("probe", "--help")
    for opt in ("--json", "--runtime", "--size", "--scratch", "--min-iops", "--min-seq-mibps"):
        assert opt in p.stdout


@pytest.mark.fio
@pytest.mark.slow
def test_json_to_stdout_has_the_documented_keys(small_dataset, tmp_path):
    r = run("-q", "probe", str(small_dataset), "--json", "-", "--size", "32M", "--runtime", "1",
            "--replay-seconds", "5", "--concurrency", "1,4")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)  # stdout is pure JSON; the table went to stderr
    assert REQUIRED <= d.keys()
    assert {"type", "device", "class"} <= d["filesystem"].keys()
    for job in ("seq_read", "rand_read"):
        assert {"iops", "bw_mib_s", "lat_mean_ms", "lat_p99_ms"} <= d["fio"][job].keys()
    assert d["fio"]["direct"] is True
    rp = d["replay"]
    assert rp["files_sampled"] == 64 and rp["mean_file_bytes"] > 10_000
    assert [lv["concurrency"] for lv in rp["by_concurrency"]] == [1, 4]
    assert {"files_per_s", "mib_per_s", "lat_p50_ms", "lat_p99_ms"} <= rp["by_concurrency"][0].keys()
    assert "storage_files_per_s" in d["verdict"] and "Verdict" in r.stderr
    # The verdict's file size in the table's units ("mean 1 KB" beside "mean 1.3 KiB").
    mean = fmt_bytes(rp["mean_file_bytes"])
    assert any(f"(mean {mean}," in e for e in d["verdict"]["evidence"]), d["verdict"]
    assert not [p for p in os.listdir(small_dataset) if p.startswith(".autotune")]


@pytest.mark.fio
@pytest.mark.parametrize("threshold, status, outcome", [("1", 0, "passed"),
                                                        ("1e9", 3, "failed")])
def test_the_ci_gate_passes_or_fails_on_real_fio_and_says_so_in_the_json(
        work_dir, threshold, status, outcome):
    """The recipe of docs/commands/probe.md: fio on a scratch directory on a real disk, a
    threshold it surely passes and one it surely fails."""
    out = work_dir / "probe.json"
    r = run("-q", "probe", str(work_dir), "--size", "16M", "--runtime", "0.5", "--no-replay",
            "--min-iops", threshold, "--json", str(out))
    assert r.returncode == status, r.stderr
    g = json.loads(out.read_text())["gate"]
    assert g["outcome"] == outcome and g["passed"] is (status == 0)
    (c,) = g["checks"]
    assert c["flag"] == "--min-iops" and c["threshold"] == float(threshold)
    assert c["measured"] > 1 and c["outcome"] == outcome
    if status:
        assert f"gate failed: --min-iops {float(threshold):g}: measured" in r.stderr
        assert "random-read IOPS" in r.stderr and "error" not in r.stderr
    assert f"Gate: {outcome.upper()}" in r.stdout   # the table (JSON went to a file)


def test_fio_missing_still_replays_and_the_gate_is_not_measured(small_dataset, tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    env = dict(os.environ, PATH=str(bindir))  # no fio on PATH
    out = tmp_path / "p.json"
    r = run("-q", "probe", str(small_dataset), "--json", str(out), "--concurrency", "1",
            "--min-iops", "1", env=env)
    assert r.returncode == 5, r.stderr  # could not measure: not the "too slow" status 3
    d = json.loads(out.read_text())
    assert d["fio"] is None and "apt-get install fio" in d["fio_error"]
    assert d["replay"]["files_sampled"] == 64
    g = d["gate"]
    assert g["outcome"] == "unmeasured" and g["passed"] is None
    (c,) = g["checks"]
    assert c["measured"] is None and c["passed"] is None and "apt-get install fio" in c["reason"]
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("autotune probe: gate not measured: --min-iops 1: random-read IOPS "
                           "not measured"), r.stderr


def test_without_a_threshold_the_gate_is_null(small_dataset):
    r = run("-q", "probe", str(small_dataset), "--no-fio", "--concurrency", "1",
            "--replay-seconds", "0.5", "--json", "-")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["gate"] is None


@pytest.mark.parametrize("args, msg", [
    (("probe", "/nonexistent/dataset"), "no such file"),
    (("probe", ".", "--size", "lots"), "--size must be a size"),
    (("probe", ".", "--runtime", "0"), "--runtime must be positive"),
    (("probe", ".", "--concurrency", "1,x"), "comma-separated"),
    (("probe", ".", "--min-iops", "0"), "--min-iops must be positive"),
])
def test_bad_input_is_one_line_on_stderr_with_exit_2(args, msg):
    r = run(*args)
    assert r.returncode == 2
    assert msg in r.stderr
    assert "Traceback" not in r.stderr


def test_read_only_path_reports_fio_error_and_suggests_scratch(small_dataset, tmp_path):
    if os.geteuid() == 0:
        # root ignores permission bits; a read-only bind mount is the honest case.
        ro = tmp_path / "ro"
        ro.mkdir()
        if subprocess.run(["mount", "--bind", "-o", "ro", str(small_dataset), str(ro)]).returncode:
            pytest.skip("cannot make a read-only bind mount here")
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)])
        try:
            r = run("-q", "probe", str(ro), "--json", "-", "--concurrency", "1")
        finally:
            subprocess.run(["umount", str(ro)])
    else:
        ro = tmp_path / "ro"
        shutil.copytree(small_dataset, ro)
        os.chmod(ro, 0o555)
        r = run("-q", "probe", str(ro), "--json", "-", "--concurrency", "1")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["fio"] is None and "--scratch" in d["fio_error"]
    assert d["replay"]["files_sampled"] == 64


def test_a_probe_that_measured_nothing_says_so(tmp_path):
    """No fio (--no-fio), no files to replay: the class is only the kernel's description of
    the device, and the verdict must not read as a measurement."""
    r = run("probe", str(tmp_path), "--no-fio", "--json", "-")
    assert r.returncode == 0, r.stderr
    v = json.loads(r.stdout)["verdict"]
    assert v["storage_files_per_s"] is None
    assert "nothing measured" in v["summary"] and "nothing measured" in r.stderr


def test_the_replay_footnote_names_the_pass_that_ran():
    # A replay evicted file by file (not root) has no steady pass; its footnote said
    # "steady: page cache dropped, inodes kept" all the same.
    from types import SimpleNamespace

    from rich.console import Console

    from autotune.cli.tables.probe import _replay_parts
    from autotune.probe.replay import ReplayLevel, ReplayResult

    def footnote(rp: ReplayResult) -> str:
        con = Console(width=200, record=True)
        for part in _replay_parts(SimpleNamespace(replay=rp)):
            con.print(part)
        return [ln for ln in con.export_text().splitlines() if "the storage ceiling" in ln][0]

    lv = ReplayLevel(4, 100, 100 << 16, 1.0, 100.0, 6.25, 1.0, 3.0)
    cold = footnote(ReplayResult(100, 65536.0, "fadvise", [lv]))
    assert "the cold pass (cold: fadvise)" in cold and "page cache dropped" not in cold, cold
    steady = ReplayLevel(4, 100, 100 << 16, 1.0, 300.0, 18.75, 0.5, 1.0)
    rooted = footnote(ReplayResult(100, 65536.0, "drop_caches", [lv], steady=[steady]))
    assert "steady-state pass (steady: page cache dropped, inodes kept" in rooted, rooted
