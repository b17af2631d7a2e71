"""`autotune bench` on the command line: help, usage errors (exit 2), a real run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_help_says_what_is_measured(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for text in ("data-wait fraction", "AU ", "input-bound < 0.90", "cold", "--warm",
                 "resnet50", "decode-only", "heavy-augment", "examples:", "exit status:",
                 "--prefetch-factor", "--step FILE.py:FUNCTION", "--timeline", "--json"):
        assert text in out, text
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "bench" in capsys.readouterr().out


@pytest.mark.parametrize("argv, msg", [
    (["--prefetch-factor", "0"], "--prefetch-factor must be at least 1, but got 0."),
    (["--workers", "-1"], "--workers must be at least 0, but got -1."),
    # The library names the settings; the CLI adds the options that set them.
    (["--workers", "0", "--prefetch-factor", "2"],
     ("prefetch_factor=2 needs num_workers > 0", "(options --prefetch-factor, --workers)")),
    (["--workers", "0", "--persistent-workers"],
     ("persistent_workers needs num_workers > 0", "(options --persistent-workers, --workers)")),
    (["--compute-ms", "5", "--step", "m:f"], "not allowed with argument"),
    (["--cold", "--warm"], "not allowed with argument"),
    (["--seconds", "0"], "--seconds must be positive, but got 0."),
    (["--preset", "nope"], "unknown preset 'nope'"),
    (["--format", "lmdb"], "format lmdb needs the manifest.json that `autotune convert` writes"),
    (["--step", "nocolon"], "step must be 'module:function'"),
    # A window that cannot hold the batches a figure needs at a long step's demand rate.
    (["--compute-ms", "3000", "--batch-size", "64", "--workers", "2", "--seconds", "10"],
     ("--seconds 10 is too short for a 3000 ms step per batch of 64", "give --seconds 45 or more")),
])
def test_bad_arguments_exit_2(small_dataset: Path, capsys: pytest.CaptureFixture[str],
                              argv: list[str], msg: str | tuple[str, ...]) -> None:
    try:
        rc = main(["-q", "bench", str(small_dataset), *argv])
    except SystemExit as e:
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err
    for part in ([msg] if isinstance(msg, str) else msg):
        assert part in err


def test_missing_dataset_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-q", "bench", str(tmp_path / "nope")]) == 2
    assert "no such file or directory" in capsys.readouterr().err


def test_real_run_json_to_stdout(small_dataset: Path, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    tl = tmp_path / "tl.jsonl"
    rc = main(["-q", "bench", str(small_dataset), "--preset", "decode-only", "--warm",
               "--workers", "1", "--batch-size", "4", "--seconds", "1", "--warmup-batches", "2",
               "--pin-memory", "--json", "-", "--timeline", str(tl)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    d = json.loads(cap.out)  # only JSON on stdout; the table went to stderr
    assert d["failed"] is False and d["images_per_s"] > 0 and d["cold"] is False
    assert d["config"]["num_workers"] == 1 and d["config"]["preset"] == "decode-only"
    assert "images/s" in cap.err and "WARM" in cap.err and "pin_memory=True has no effect" in cap.err
    assert tl.read_text().count("\n") >= 1


def test_failed_measurement_exits_1_with_reason(small_dataset: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    rc = main(["-q", "bench", str(small_dataset), "--preset", "decode-only", "--workers", "1",
               "--batch-size", "16", "--json", str(out)])
    cap = capsys.readouterr()
    assert rc == 1
    assert "FAILED (no_batches)" in cap.out and "--warm" in cap.out
    d = json.loads(out.read_text())
    assert d["failed"] and d["reason"] and d["hint"] and d["images_per_s"] is None


# -- the user's module fails at import: a usage error naming the file ------------------------

@pytest.mark.parametrize("body, says", [
    ('raise RuntimeError("boom at import")\n', "raised RuntimeError while it was imported: boom"),
    ("import sys\nsys.exit(3)\n", "called sys.exit(3) while it was imported"),
])
def test_a_factory_that_raises_or_exits_at_import_is_a_usage_error(
        small_dataset: Path, tmp_path: Path, body: str, says: str) -> None:
    mod = tmp_path / "badfactory.py"
    mod.write_text(body + "def make(path):\n    return None\n")
    r = subprocess.run([sys.executable, "-m", "autotune", "bench", str(small_dataset),
                        "--dataset-factory", f"{mod}:make", "--seconds", "3"],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(mod) in lines[0] and says in lines[0], r.stderr
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr



def test_a_fast_preset_without_simplejpeg_names_the_install_before_measuring(
        small_dataset: Path, tmp_path: Path) -> None:
    # Installed without the `fast` extra: the measurement process met it at start-up and
    # said "FAILED (startup) ... check the dataset path and format", exit 1, after a
    # system table of a run that never began. A module that cannot be imported hides the
    # installed simplejpeg, as a pip install without the extra has none.
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "simplejpeg.py").write_text('raise ImportError("No module named simplejpeg")\n')
    r = subprocess.run([sys.executable, "-m", "autotune", "bench", str(small_dataset),
                        "--preset", "resnet50-fast", "--batch-size", "8", "--warm"],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": f"{hide}{os.pathsep}{ROOT}"})
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'autotune-loader[fast]'" in lines[0], r.stderr
    assert "FAILED" not in r.stdout and "Traceback" not in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("body, says", [
    ('raise RuntimeError("boom at import")\n', "RuntimeError: boom at import"),
    ("import sys\nsys.exit(3)\n", "called sys.exit(3) while it was imported"),
])
def test_a_step_that_raises_or_exits_at_import_is_a_usage_error(
        small_dataset: Path, tmp_path: Path, body: str, says: str) -> None:
    mod = tmp_path / "badstep.py"
    mod.write_text(body + "def step(batch):\n    return None\n")
    r = subprocess.run([sys.executable, "-m", "autotune", "bench", str(small_dataset),
                        "--step", f"{mod}:step", "--seconds", "1", "--workers", "0"],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(mod) in lines[0] and says in lines[0], r.stderr


# -- the benchmark scripts' scratch folders ------------------------------------------------

def test_the_bench_scripts_use_no_fixed_scratch_folder() -> None:
    """A fixed /var/tmp/autotune-bench-* is shared by every user and run of the machine
    (another's files reused or removed, a symlink planted there followed)."""
    fixed = [f"{p.name}:{i}" for p in sorted((ROOT / "scripts").glob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if "/var/tmp/autotune-bench" in line or 'dir="/var/tmp"' in line
             and "autotune-bench" in line]
    assert fixed == []


def test_scratch_dir_is_new_private_and_under_tmpdir(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.emulate.setups import scratch_dir

    monkeypatch.setenv("TMPDIR", str(tmp_path / "t"))
    a, b = scratch_dir("autotune-bench-x-"), scratch_dir("autotune-bench-x-")
    assert a != b and a.parent == b.parent == tmp_path / "t"
    assert (a.stat().st_mode & 0o777) == 0o700
    given = scratch_dir("autotune-bench-x-", str(tmp_path / "opt"))
    assert given.parent == tmp_path / "opt" and given.name.startswith("autotune-bench-x-")


def test_the_cpu_row_names_a_fractional_quota_not_the_whole_cores() -> None:
    """Under a 0.5-core quota the tree's 49 % of one core is the whole quota: the row says
    0.5 core(s) usable and where that came from, not the worker count's rounded-up 1."""
    from rich.console import Console

    from autotune.bench.result import BenchResult
    from autotune.cli.tables.bench import _measured

    quota = ("cgroup CPU quota /sys/fs/cgroup/cpu/job/cpu.cfs_quota_us = 50000 "
             "(period 100000) (0.5 core(s))")
    r = BenchResult(dataset={"path": "/data"}, config={}, cpu_percent=49.0, images_per_s=239.0,
                    window={"seconds": 1.5, "batches": 45, "samples": 360, "windows": 5},
                    environment={"cores": 1, "cpu": {"cores": 0.5, "whole": 1,
                                                     "source": quota}})
    con = Console(width=300, record=True)
    con.print(_measured(r))
    row = next(ln for ln in con.export_text().splitlines() if "CPU (process tree)" in ln)
    assert "0.5 core(s) usable" in row and "CPU quota" in row and "1 cores" not in row, row
