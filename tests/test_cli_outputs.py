"""What a command writes goes where it says, and a place it cannot write is refused before
the work: a `--json`/`--timeline` file under a file or in a read-only folder, a DST or
`--out` that is a file (missing folders are made). With `--json -` stdout is the JSON
alone, whatever else the run prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _autotune(*args: str, cwd: Path | None = None, timeout: float = 300,
              user: int | None = None) -> subprocess.CompletedProcess[str]:
    pre = {}
    if user is not None:
        pre["preexec_fn"] = lambda: (os.setgroups([]), os.setresgid(user, user, user),
                                     os.setresuid(user, user, user))
    return subprocess.run([sys.executable, "-m", "autotune", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, **pre)


def _one_line(r: subprocess.CompletedProcess[str], *says: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, (r.returncode, r.stderr)
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr
    for s in says:
        assert s in lines[0], lines[0]


def test_a_json_file_under_a_file_is_refused_before_the_command_runs(tmp_path):
    ran, afile = tmp_path / "ran", tmp_path / "afile"
    afile.write_text("")
    cmd = ["--", sys.executable, "-c", f"open({str(ran)!r}, 'w')"]
    r = _autotune("monitor", "--out", str(tmp_path / "m"), "--no-gpu", "--json",
                  str(afile / "a.json"), *cmd)
    _one_line(r, "--json", f"{afile} is a file, not a folder")
    assert not ran.exists()                       # the training command never started
    # A folder that does not exist yet is made (`--out run --json run/a.json`).
    r = _autotune("monitor", "--out", str(tmp_path / "m"), "--no-gpu", "--json",
                  str(tmp_path / "m" / "sub" / "a.json"), *cmd)
    assert r.returncode == 0 and ran.exists(), r.stderr


def test_a_json_path_that_is_a_folder_or_empty_is_refused(tmp_path, small_dataset):
    dst = tmp_path / "dst"
    _one_line(_autotune("convert", str(small_dataset), str(dst), "--format", "wds",
                        "--json", str(tmp_path)), "--json", "a directory")
    _one_line(_autotune("convert", str(small_dataset), str(dst), "--format", "wds",
                        "--json", ""), "--json needs a file name")
    assert not dst.exists()                       # refused before anything was written
    (tmp_path / "afile").write_text("")
    _one_line(_autotune("bench", str(small_dataset), "--timeline",
                        str(tmp_path / "afile" / "t.jsonl")), "--timeline", "not a folder")


@pytest.mark.root
def test_a_json_file_in_a_folder_the_user_cannot_write_is_refused(tmp_path):
    """As `nobody`, in a folder root owns: the check the CLI runs before any command (the
    CLI itself cannot run as nobody here: the interpreter's library may sit in root's home;
    the missing-folder test above runs the whole CLI)."""
    import argparse

    from autotune.cli.args import check_output_files
    from autotune.errors import UsageError

    import tempfile

    top = Path(tempfile.mkdtemp(dir="/var/tmp"))   # pytest's tmp_path is root's alone (700)
    top.chmod(0o755)
    ro = top / "ro"
    ro.mkdir(mode=0o755)
    hidden = top / "hidden"
    hidden.mkdir(mode=0o700)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nobody; what the check said, into the pipe
        said = ""
        try:
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            for name in (str(ro / "a.json"), str(hidden / "sub" / "a.json"), "a.json"):
                os.chdir(ro)   # the last a name in the folder the command runs in
                try:
                    check_output_files(argparse.Namespace(json=name, timeline=None))
                    said += "; no error"
                except UsageError as e:
                    said += f"; {e}"
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            said = f"{type(e).__name__}: {e}"
        finally:
            os.write(wfd, said.encode())
            os._exit(0)
    os.close(wfd)
    with os.fdopen(rfd) as f:
        said = f.read()
    os.waitpid(pid, 0)
    try:
        got = said.split("; --json ")
        assert len(got) == 4, said
        assert got[1].startswith(f"{ro / 'a.json'}: {ro} cannot be written"), said
        assert got[2].startswith(f"{hidden / 'sub' / 'a.json'}: {hidden}"), said
        assert "cannot be written" in got[2], said
        # The folder by its whole path, not "." (where the command ran was not said).
        assert got[3].startswith(f"a.json: {ro} cannot be written"), said
        # root may write there: the same check passes for it
        check_output_files(argparse.Namespace(json=str(ro / "a.json"), timeline=None))
    finally:
        import shutil

        shutil.rmtree(top)


def test_json_to_stdout_is_only_the_json_when_the_users_factory_prints(tmp_path, small_dataset):
    mod = tmp_path / "chatty.py"
    mod.write_text("import torch\nprint('factory imported')\n"
                   "class DS(torch.utils.data.Dataset):\n"
                   "    def __len__(self):\n        return 256\n"
                   "    def __getitem__(self, i):\n        return torch.zeros(3, 8, 8), i % 4\n"
                   "def make(path):\n    print('factory called')\n    return DS()\n")
    r = _autotune("bench", str(small_dataset), "--dataset-factory", f"{mod}:make",
                  "--seconds", "2", "--workers", "1", "--batch-size", "8", "--warm",
                  "--json", "-")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["config"]["batch_size"] == 8   # stdout: one JSON document
    assert "factory called" in r.stderr


def test_stage_and_search_refuse_an_output_that_is_a_file(tmp_path, small_dataset):
    afile = tmp_path / "afile"
    afile.write_text("")
    _one_line(_autotune("stage", str(small_dataset), str(afile)), str(afile), "not a folder")
    _one_line(_autotune("stage", str(small_dataset), str(tmp_path / "none"), "--verify-only"),
              str(tmp_path / "none"), "stage SRC there first")
    _one_line(_autotune("search", str(small_dataset), "--out", str(afile / "out"),
                        "--trials", "1"), "is a file, not a folder", "--out")
    _one_line(_autotune("search", str(small_dataset), "--storage", "foo://bar",
                        "--trials", "1", "--out", str(tmp_path / "s")),
              "foo://bar: not a storage URL", "sqlite:///FILE")
    assert not (tmp_path / "s").exists()


def test_stage_probe_without_a_fio_figure_says_so(tmp_path, small_dataset):
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"path": str(small_dataset), "fio": None, "replay": {}}))
    _one_line(_autotune("stage", str(small_dataset), str(tmp_path / "dst"), "--probe",
                        str(probe)), str(probe), "fio was not run", "leave --probe out")
    assert not (tmp_path / "dst").exists()


def test_analyze_names_a_damaged_gzip(tmp_path):
    log = ROOT / "tests" / "analyze" / "data" / "timm.log"
    import gzip

    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(gzip.compress(log.read_bytes())[:20])
    _one_line(_autotune("analyze", str(cut)), str(cut), "not a readable gzip file")


def test_a_yaml_file_that_does_not_parse_is_named_in_one_line(tmp_path, small_dataset):
    bad = tmp_path / "preset.yaml"
    bad.write_text("batch_size: [1, 2\nworkers: 3\n")
    _one_line(_autotune("bench", str(small_dataset), "--preset", str(bad)),
              str(bad), "not valid YAML at line 2, column 8")


def test_timeline_may_be_a_stream_and_json_never_replaces_a_link(tmp_path):
    import argparse

    from autotune.cli.args import check_output_files
    from autotune.errors import UsageError

    check_output_files(argparse.Namespace(json=None, timeline="/dev/stderr"))  # written in place
    link = tmp_path / "out.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    for v in ("/dev/stdout", str(link)):   # renamed into place, the rename would replace it
        with pytest.raises(UsageError, match="a link or a device, not a file; '--json -'"):
            check_output_files(argparse.Namespace(json=v, timeline=None))
