"""A "too few workers" verdict where no more workers fit /dev/shm says so.

Docker's 64 MiB /dev/shm, 224x224 float batches of 18 MiB: the loader fitted its start
point to 1 worker one batch ahead and refused 2 ("would hold 73 MiB of batches in
/dev/shm, over its budget of 64 MiB"), then its verdict read "loader-configuration-bound:
the 1 worker ...: too few workers" with the advice to raise num_workers, which would have
failed as torch's "unable to allocate shared memory" (a 30-epoch run in a container,
review long-run). Here a 20 MiB /dev/shm holds one worker's 4.6 MiB batches, not two's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

LOOP = r"""
import json, time, torch
from torch.utils.data import Dataset
import autotune

class Decode(Dataset):          # 3x224x224 float32 items after 10 ms of CPU each
    def __len__(self):
        return 160
    def __getitem__(self, i):
        end = time.perf_counter() + 0.01
        while time.perf_counter() < end:
            pass
        return torch.zeros(3, 224, 224)

loader = autotune.DataLoader(Decode(), batch_size=8)
deadline = time.perf_counter() + 60
while loader.verdict is None and time.perf_counter() < deadline:
    for _ in loader:
        pass
loader.close()
v = loader.verdict
print(json.dumps(None if v is None else v.to_dict()))
"""


@pytest.mark.slow
@pytest.mark.alone
def test_too_few_workers_where_no_more_fit_dev_shm_names_dev_shm(tmp_path):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a private /dev/shm")
    from autotune.cpus import usable_cores

    if usable_cores() < 2:
        pytest.skip("one usable core: one worker fills it, the verdict is decode's")
    env = dict(os.environ, AUTOTUNE_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([os.getcwd(), HERE, os.environ.get("PYTHONPATH", "")]))
    cmd = f'mount -t tmpfs -o size=20m tmpfs /dev/shm && exec {sys.executable} -c "$0"'
    out = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", cmd, LOOP],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    v = json.loads(out.stdout.strip().splitlines()[-1])
    assert v is not None, out.stderr[-3000:]
    # 1 worker decoding, an idle loop: the job wants about one core of the two or more this
    # test runs on, whatever a neighbour does (the rule reads the job's own demand).
    assert v["bottleneck"] == "loader" and "too few workers" in v["summary"], v
    assert "more workers do not fit" in v["summary"] and "/dev/shm" in v["summary"], v
    assert "--shm-size" in v["summary"], v
    assert not any("raise num_workers" in a for a in v["advice"]), v["advice"]
