"""`autotune convert` as a user runs it: a real process, its summary, JSON and exit codes."""

from __future__ import annotations

import json

import pytest


def test_help_lists_the_options_and_exit_codes(run_cli):
    r = run_cli("--help")
    assert r.returncode == 0
    for opt in ("--format", "--shard-size", "--workers", "--seed", "--max-side", "--quality",
                "--on-error", "--verify", "--file-list", "--readers", "--json", "exit status"):
        assert opt in r.stdout, opt


def test_json_to_stdout_and_the_summary_to_stderr(img_src, work_dir, run_cli):
    r = run_cli(img_src, work_dir / "out", "--format", "wds", "--readers", "2", "--json", "-")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)  # stdout is pure JSON
    assert d["samples"] == 96 and d["format"] == "wds" and d["skipped"] == []
    assert d["images_per_s"] > 0 and d["mb_per_s"] > 0 and d["seconds"] > 0
    assert "samples" in r.stderr and "96 in 4 classes" in r.stderr


def test_summary_counts_skipped_by_reason(bad_src, work_dir, run_cli):
    out = work_dir / "r.json"
    r = run_cli(bad_src, work_dir / "out", "--format", "lmdb", "--json", out)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    assert d["skipped_by_kind"]["empty file"] == 1 and d["skipped_by_kind"]["directory loop"] == 2
    for kind in ("truncated JPEG", "empty file", "not an image", "decompression bomb"):
        assert kind in r.stdout, kind


@pytest.mark.parametrize("args, says", [
    (["--format", "tar"], "invalid choice"),
    (["--format", "wds", "--shard-size", "12parsecs"], "--shard-size must be a size"),
    (["--format", "wds", "--workers", "0"], "--workers must be at least 1"),
])
def test_usage_errors_exit_2(img_src, work_dir, run_cli, args, says):
    r = run_cli(img_src, work_dir / "out", *args)
    assert r.returncode == 2 and says in r.stderr


def test_a_foreign_dst_is_refused_in_one_line(img_src, work_dir, run_cli):
    (work_dir / "mine.txt").write_text("x")
    r = run_cli(img_src, work_dir, "--format", "wds")
    assert r.returncode == 2
    assert r.stderr.strip() == (f"autotune convert: error: {work_dir}: not empty and not an "
                                "autotune conversion; choose an empty or new DST.")


@pytest.mark.skipif(not __import__("shutil").which("script"), reason="needs script(1) for a tty")
def test_progress_bar_on_a_terminal_shows_rates_and_eta(img_src, work_dir):
    import subprocess
    import sys

    # Full decodes and a re-encode per image: the header-checked conversion of 96 images
    # is over before the bar's first refresh.
    cmd = (f"{sys.executable} -m autotune convert {img_src} {work_dir / 'out'} --format wds "
           "--readers 2 --workers 2 --verify decode --max-side 48")
    log = work_dir / "typescript"
    r = subprocess.run(["script", "-qec", cmd, str(log)], capture_output=True, timeout=120,
                       cwd=__import__("pathlib").Path(__file__).resolve().parents[2])
    out = log.read_bytes().decode(errors="replace")
    assert r.returncode == 0, out[-2000:]
    # A fast run can be past its last unit by the bar's first refresh: then "publishing".
    assert ("converting" in out or "publishing" in out), out[-2000:]
    assert "img/s" in out and "MB/s" in out and "ETA" in out
    assert "Traceback" not in out


def _file_list(img_src, path, labels):
    files = sorted(p.relative_to(img_src) for p in img_src.rglob("*.jpg"))[:len(labels)]
    path.write_text("".join(f"{f},{lab}\n" for f, lab in zip(files, labels)))
    return path


@pytest.mark.parametrize("labels, says", [
    (["0", "1", "99999999999"], "label 99999999999 is above 1,000,000"),   # a range: OOM
    (["0", "1", "\u00b2"], "label '²' is not a decimal number"),            # isdigit() only
])
def test_file_list_labels_that_would_break_the_scan_exit_2(img_src, work_dir, run_cli, labels,
                                                           says):
    csv = _file_list(img_src, work_dir / "list.csv", labels)
    r = run_cli(img_src, work_dir / "out", "--format", "wds", "--file-list", csv)
    assert r.returncode == 2, r.stderr[-2000:]
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and f"{csv}:3: {says}" in err, err
    assert not (work_dir / "out").exists()


def test_file_list_names_and_numbers_mixed_are_names(img_src, work_dir, run_cli):
    csv = _file_list(img_src, work_dir / "list.csv", ["cat", "99999999999", "\u00b2"])
    r = run_cli(img_src, work_dir / "out", "--format", "wds", "--file-list", csv, "--json", "-")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["samples"] == 3


def test_file_names_with_control_characters_are_printed_escaped(img_src, work_dir, run_cli):
    import shutil

    src = work_dir / "src"
    shutil.copytree(img_src, src)
    evil = "evil\x1b[31mRED\x1b[0m\r[bold]x"
    (src / "class_0000" / f"{evil}.jpg").write_bytes(b"not a jpeg")
    dst = work_dir / f"out\x1b[32mGREEN"
    r = run_cli(src, dst, "--format", "wds")
    assert r.returncode == 0, r.stderr[-2000:]
    both = r.stdout + r.stderr
    assert "\x1b" not in both and "\r" not in both, repr(both[-2000:])
    flat = "".join(both.split())   # rich wraps long names at the terminal's width
    assert "evil\\x1b[31mRED\\x1b[0m\\x0d[bold]x.jpg" in flat, both[-2000:]
    assert "out\\x1b[32mGREEN" in flat, both[-2000:]


def test_printable_escapes_controls_and_markup():
    from autotune.cli.tables import printable

    assert printable("a\x1b[31mb\x07\u202ec\td") == "a\\x1b[31mb\\x07\\u202ec\\x09d"
    assert printable("[red]x", markup=True) == "\\[red]x" and printable("[red]x") == "[red]x"
    assert printable("Ünïcode/train 2024") == "Ünïcode/train 2024"
