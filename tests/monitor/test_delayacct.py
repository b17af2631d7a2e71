"""--delayacct's shared switch: the first holder switches on, the last one out restores, a
dead holder does not count. On a stand-in sysctl file (any user) and on the real one (root)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autotune.monitor.delayacct import DelayacctHold
from autotune.monitor.tasks import DELAYACCT_SYSCTL


@pytest.fixture
def switch(tmp_path: Path) -> tuple[Path, Path]:
    sysctl = tmp_path / "task_delayacct"
    sysctl.write_text("0\n")
    return tmp_path / "run", sysctl


def test_two_holders_the_first_to_leave_does_not_switch_off(switch: tuple[Path, Path]) -> None:
    run, sysctl = switch
    a = DelayacctHold(str(run), str(sysctl))
    b = DelayacctHold(str(run), str(sysctl))
    a.acquire()
    assert sysctl.read_text().strip() == "1"
    assert a.since is not None
    b.acquire()
    assert b.since == a.since            # switched on once, at a's time
    a.release()
    assert sysctl.read_text().strip() == "1"   # b still holds it
    b.release()
    assert sysctl.read_text().strip() == "0"   # the last one out restores
    assert not list(run.glob("holder-*"))


def test_on_before_any_holder_stays_on(switch: tuple[Path, Path]) -> None:
    run, sysctl = switch
    sysctl.write_text("1\n")
    with DelayacctHold(str(run), str(sysctl)) as h:
        assert h.since is None           # on for every process alike
    assert sysctl.read_text().strip() == "1"


def test_a_holder_in_another_process_keeps_it_on_until_it_dies(
        switch: tuple[Path, Path]) -> None:
    run, sysctl = switch
    code = f"""
        import sys, time
        from autotune.monitor.delayacct import DelayacctHold
        h = DelayacctHold({str(run)!r}, {str(sysctl)!r}); h.acquire()
        print("held", flush=True)
        sys.stdin.read()                 # killed here: it never releases
    """
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == b"held"
        mine = DelayacctHold(str(run), str(sysctl))
        mine.acquire()
        mine.release()
        assert sysctl.read_text().strip() == "1"   # the other run still holds it
        p.kill()
        p.wait()
        # The dead holder's file is unlocked: the next one out restores.
        mine = DelayacctHold(str(run), str(sysctl))
        mine.acquire()
        mine.release()
        assert sysctl.read_text().strip() == "0"
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()


@pytest.mark.root
def test_real_switch_counts_blkio_of_a_process_started_after(tmp_path: Path) -> None:
    if os.geteuid() != 0 or not os.path.exists(DELAYACCT_SYSCTL):
        pytest.skip(f"needs root and {DELAYACCT_SYSCTL}")
    before = Path(DELAYACCT_SYSCTL).read_text().strip()
    with DelayacctHold(str(tmp_path / "run")) as h:
        assert Path(DELAYACCT_SYSCTL).read_text().strip() == "1"
        if before == "0":
            assert h.since is not None
    assert Path(DELAYACCT_SYSCTL).read_text().strip() == before


def test_without_root_it_is_a_usage_error(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import autotune.monitor.delayacct as da
    from autotune.errors import UsageError

    monkeypatch.setattr(da.os, "geteuid", lambda: 1000)   # as a user (the venv is root's)
    with pytest.raises(UsageError, match="--delayacct needs root"):
        DelayacctHold(str(tmp_path / "run")).acquire()
    assert not (tmp_path / "run").exists()


def test_read_only_proc_sys_is_a_usage_error_of_monitor(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture) -> None:
    """A container's read-only /proc/sys: the write fails with EROFS. `autotune monitor
    --delayacct` cannot honour the option there: exit 2 (its usage error, as its exit-status
    table says), one line naming the file and the fix, and the command is never started."""
    import errno

    import autotune.monitor.delayacct as da
    from autotune.cli import exits, main

    sysctl = tmp_path / "task_delayacct"
    sysctl.write_text("0\n")

    class ReadOnlySysctl(type(Path())):   # type: ignore[misc]
        def write_text(self, *a: object, **k: object) -> int:  # type: ignore[override]
            if str(self) == str(sysctl):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
            return super().write_text(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(da, "Path", ReadOnlySysctl)
    monkeypatch.setattr(da.DelayacctHold.__init__, "__defaults__",
                        (str(tmp_path / "run"), str(sysctl)))
    started = tmp_path / "started"
    code = main(["monitor", "--delayacct", "--no-analysis", "--out", str(tmp_path / "out"),
                 "--", sys.executable, "-c", f"open({str(started)!r}, 'w')"])
    err = capsys.readouterr().err
    assert code == exits.USAGE == 2, err
    assert code in exits.BY_COMMAND["monitor"]
    assert str(sysctl) in err and "Read-only file system" in err
    assert "without --delayacct" in err
    assert not started.exists()
    assert sysctl.read_text() == "0\n"


def test_no_switch_in_the_kernel_is_a_usage_error(tmp_path: Path) -> None:
    from autotune.errors import UsageError

    with pytest.raises(UsageError, match="no such file.*run without --delayacct"):
        DelayacctHold(str(tmp_path / "run"), str(tmp_path / "absent")).acquire()
