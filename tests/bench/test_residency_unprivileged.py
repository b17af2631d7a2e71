"""mincore's answer about a file this process may neither write nor own is not an answer.

Since Linux 5.2 the kernel reports every page of such a file mapping resident, whatever
the page cache holds (mm/mincore.c, can_do_mincore). A job that is not root, reading a
dataset another user owns, evicted every file with posix_fadvise and was then told by
each trial of `search` that "100% of the sampled pages stayed cached: the figure may be
partly warm", and by the hit-rate measurement that those pages "cost this limit
nothing", while /proc/PID/io showed every byte read from storage. Real files, a real
eviction, a real process without CAP_FOWNER and CAP_DAC_OVERRIDE (root sees through the
check; the bits then apply as they would to a user of the cluster)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.bench.residency import resident_fraction

pytestmark = [pytest.mark.root]

_CHECK = """
import json, sys
from autotune.bench.residency import resident_fraction
print(json.dumps(resident_fraction(sys.argv[1:])))
"""


def _unprivileged(*args: str) -> subprocess.CompletedProcess:
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed")
    cmd = [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner",
           sys.executable, "-c", _CHECK, *args]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)


def test_residency_of_another_users_evicted_files_is_unknown_not_cached(work_dir):
    files = []
    for i in range(8):
        f = work_dir / f"f{i}.bin"
        f.write_bytes(os.urandom(256 * 1024))
        os.chown(f, 65534, 65534)          # nobody's, as a shared dataset is someone else's
        f.chmod(0o444)
        files.append(str(f))
    os.sync()
    for f in files:
        with open(f, "rb") as fh:
            fh.read()
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    assert resident_fraction(files) == 0.0       # root is told the truth: all evicted
    r = _unprivileged(*files)
    assert r.returncode == 0, r.stderr
    # The kernel would say 1.0 here (every page "resident"): unknown is the true answer.
    assert json.loads(r.stdout) is None, r.stdout
    # Files this process owns are still checked.
    mine = work_dir / "mine.bin"
    mine.write_bytes(os.urandom(64 * 1024))
    r = _unprivileged(str(mine))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == pytest.approx(1.0)   # just written: cached
