"""The monitor counts the open files of the job's processes (/proc/PID/fd) and reads the
open-files limit of the one that holds the most (/proc/PID/limits): with torch's default
sharing strategy every tensor of a batch in flight is an open file, and a job past its
`ulimit -n` hangs an epoch or dies with "received 0 items of ancdata"."""

from __future__ import annotations

import resource
import subprocess
import sys
import time

import pytest

from autotune.monitor import ProcessTree
from autotune.monitor.proctree import parse_nofile

# A parent that lowers its soft open-files limit (its child inherits it) and starts a
# child that holds N files open until it is killed.
HOLDER = """
import resource, subprocess, sys
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), hard))
child = subprocess.Popen([sys.executable, "-c",
    "import os, sys, time\\n"
    "fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(int(sys.argv[1]))]\\n"
    "print(os.getpid(), flush=True)\\n"
    "time.sleep(120)\\n", sys.argv[1]], stdout=subprocess.PIPE, text=True)
print(child.stdout.readline().strip(), flush=True)
child.wait()
"""


def test_the_tree_names_the_process_nearest_its_open_files_limit():
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 600:
        pytest.skip(f"the hard open-files limit is {hard}")
    parent = subprocess.Popen([sys.executable, "-c", HOLDER, "300", "400"],
                              stdout=subprocess.PIPE, text=True)
    try:
        holder = int(parent.stdout.readline())
        tree = ProcessTree(parent.pid)
        tree.sample(time.monotonic())
        time.sleep(0.05)
        u = tree.sample(time.monotonic())
        assert u is not None and u.processes == 2, u
        # Its 300 and its standard streams; the parent holds a handful.
        assert u.open_files_pid == holder and 300 <= u.open_files < 320, u
        assert u.open_files_limit == 400, u
        assert u.open_files_hard == (None if hard == resource.RLIM_INFINITY else hard), u
        assert u.to_dict()["open_files"] == u.open_files
    finally:
        subprocess.run(["pkill", "-KILL", "-P", str(parent.pid)], check=False)
        parent.kill()
        parent.wait(timeout=10)


def test_limits_lines_parse_with_unlimited_and_without_the_line():
    text = (b"Limit                     Soft Limit           Hard Limit           Units     \n"
            b"Max processes             95000                95000                processes \n"
            b"Max open files            1024                 1048576              files     \n")
    assert parse_nofile(text) == (1024, 1048576)
    assert parse_nofile(text.replace(b"1048576", b"unlimited")) == (1024, None)
    assert parse_nofile(b"Max processes  1 1 processes\n") is None
    assert parse_nofile(b"Max open files  lots many files\n") is None


def test_before_linux_6_2_the_fd_folder_is_listed(monkeypatch):
    """Linux 6.2 on gives /proc/PID/fd's count as its size (one stat); before, the size is
    0 and the folder is listed. Both count the same files."""
    import os
    from types import SimpleNamespace

    from autotune.monitor import proctree

    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(50)]
    try:
        now = proctree.count_open_files(os.getpid())
        monkeypatch.setattr(proctree.os, "stat", lambda p: SimpleNamespace(st_size=0))
        listed = proctree.count_open_files(os.getpid())
    finally:
        for fd in held:
            os.close(fd)
    assert now is not None and now >= 50
    assert listed is not None and abs(listed - now) <= 1   # the listing's own descriptor
    assert proctree.count_open_files(2**22 + 7) is None    # no such process
