"""A container's CPU quota seen by `bench` and `search`, end to end: the commands run inside
a cgroup v1 cpu cgroup with a 0.5-CPU quota (the command and its measurement processes in
it, as in a `docker run --cpus 0.5` container), over generated JPEGs decoded by the
resnet50 pipeline. A review saw search's verdict there read "decode-bound (CPU) ... N
wanted of 1" with no word of the quota its own header named: bench's window never read the
cgroup's throttling.

What noise cannot move: 2 workers (or 1 and the main process) that decode without pause
want more than a CPU, the quota gives half of one, so it runs out in nearly every period
(the verdict's line is half of them). The control runs the same bench in a cgroup without a
quota: nothing is throttled, and neither the table nor the verdict names a quota (which
verdict it gives is the machine's).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.alone, pytest.mark.slow, pytest.mark.root]
REPO = Path(__file__).resolve().parents[2]
JOB = ("--batch-size", "8", "--compute-ms", "10", "--warm", "-q")


@pytest.fixture(scope="module")
def decode_dataset() -> Iterator[Path]:
    """256 ImageNet-like JPEGs (~80 KB) in 8 classes on the root disk."""
    from autotune.synth import make_image_folder

    root = Path(tempfile.mkdtemp(prefix="autotune-quota-", dir="/var/tmp"))
    make_image_folder(root / "train", 256, 8, seed=5)
    yield root / "train"
    shutil.rmtree(root, ignore_errors=True)


def _autotune_in(cg: Path, *args: str) -> str:
    """`autotune ARGS` started inside cgroup `cg`; its output (wide: one line a line)."""
    cmd = ["sh", "-c", f'echo $$ > "{cg}/cgroup.procs" && exec "$@"', "sh",
           sys.executable, "-m", "autotune", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO,
                       env=dict(os.environ, COLUMNS="400"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def _said(v) -> str:
    return f"{v.bottleneck}: {v.summary}\n" + "\n".join(v.evidence)


# Without a quota (None): extended; the quota sampler that reads none is the one the
# analyze and autotune.DataLoader tests without a quota run in CI.
@pytest.mark.parametrize("cores", [0.5, pytest.param(None, marks=pytest.mark.extended)])
def test_bench_reads_the_quota_of_its_window(cpu_cgroup, decode_dataset, tmp_path, cores):
    """bench's system figures carry the quota's throttling over the measured window, its
    table says it, and search's verdict of that window (the function search calls on its
    recommendation) names the quota; without a quota none of them does."""
    from autotune.search.ceilings import Ceilings
    from autotune.search.records import TrialRecord
    from autotune.search.verdict import decide

    base, make = cpu_cgroup
    cg = make(base, cores)
    out = tmp_path / "bench.json"
    table = _autotune_in(cg, "bench", str(decode_dataset), "--workers", "2", "--seconds", "4",
                         *JOB, "--json", str(out))
    d = json.loads(out.read_text())
    q = d["system"]["figures"]["cpu_quota"]
    rec = TrialRecord.from_bench(0, {"num_workers": 2, "prefetch_factor": 2, "batch_size": 8}, d)
    v = decide(rec, rec, Ceilings(storage=None, decode=None, demand=None, cores=2))
    print(table, _said(v), q, sep="\n")   # shown with -s, and on a failure
    if cores is None:
        assert (q or {}).get("cores") is None and not (q or {}).get("throttled"), q
        assert "CPU quota" not in table
        assert "quota" not in v.summary.lower(), _said(v)
        assert not any("CPU quota" in e for e in v.evidence), _said(v)
        return
    assert q is not None, f"bench's window read no CPU quota\n{_said(v)}"
    assert q["cores"] == pytest.approx(0.5) and q["quota_file"] == f"{cg}/cpu.cfs_quota_us", q
    assert q["periods"] > 0 and q["throttled_share"] >= 0.5, q
    assert f"CPU quota: the job's cgroup allows 0.5 CPU ({cg}/cpu.cfs_quota_us" in table, table
    assert v.bottleneck == "decode", _said(v)
    assert v.summary.startswith("decode-bound (a CPU quota): the job's cgroup allows 0.5 CPU "
                                f"({cg}/cpu.cfs_quota_us)"), _said(v)


def test_search_names_the_quota_in_its_verdict(cpu_cgroup, decode_dataset, tmp_path):
    """A short search under the quota: its verdict (the recommendation's own window) names
    the quota and its fix, not the cores."""
    base, make = cpu_cgroup
    cg = make(base, 0.5)
    out = tmp_path / "search.json"
    _autotune_in(cg, "search", str(decode_dataset), "--trials", "1", "--confirm", "0",
                 "--no-probe", "--seconds", "3", *JOB, "--out", str(tmp_path / "out"),
                 "--json", str(out))
    v = json.loads(out.read_text())["verdict"]
    said = f"{v['bottleneck']}: {v['summary']}\n" + "\n".join(v["evidence"])
    print(said)
    assert v["bottleneck"] == "decode", said
    assert ("decode-bound (a CPU quota): the job's cgroup allows 0.5 CPU "
            f"({cg}/cpu.cfs_quota_us) and was throttled in") in v["summary"], said
    assert any("docker run --cpus" in a for a in v["advice"]), v["advice"]
