"""The start-point cache (online.json) under jobs that store at once: each read the file
before another wrote, and the later rename dropped the other's entry (a review)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

WRITER = """
import sys, time
from pathlib import Path
from autotune.online import cache
path, who, go = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
while not go.exists():      # all four start storing together
    time.sleep(0.005)
for i in range(50):
    cache.store(f"{who}-{i}", {"num_workers": i}, path)
"""


def test_four_jobs_storing_at_once_lose_no_entry(tmp_path):
    path, go = tmp_path / "online.json", tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), f"job{j}", str(go)])
             for j in range(4)]
    time.sleep(3)           # their imports
    go.touch()
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    data = json.loads(path.read_text())
    assert len(data) == 200, sorted(set(f"job{j}-{i}" for j in range(4) for i in range(50))
                                    - set(data))
