"""Conversion by ranks (issue 15): real processes (plain, and under torchrun) converting one
DST together; byte-identical to one process; kill -9 of a rank mid-unit, a killed
finalizer; and the bad input: ranks that see different files, two processes with one
rank, a missing rank 0, LMDB with several writers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["--format", "wds", "--shard-size", "256KiB", "--readers", "2", "--workers", "1",
        "--verify", "decode"]  # decode: units take long enough to be killed inside one


def _rank(src: Path, dst: Path, rank: int | None, world: int | None, *extra: str,
          env: dict[str, str] | None = None) -> subprocess.Popen:
    e = {**os.environ, **(env or {})}
    for k in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID"):
        if env is None or k not in env:
            e.pop(k, None)
    if rank is not None:
        e["RANK"], e["WORLD_SIZE"] = str(rank), str(world)
    return subprocess.Popen([sys.executable, "-m", "autotune", "convert", "-q", str(src),
                             str(dst), *ARGS, *extra, "--json", "-"], cwd=ROOT, env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(p: subprocess.Popen, timeout: float = 120) -> tuple[int, dict, str]:
    out, err = p.communicate(timeout=timeout)
    try:
        d = json.loads(out) if out.strip() else {}
    except ValueError:
        d = {}
    return p.returncode, d, err


@pytest.fixture(scope="module")
def reference(img_src, tmp_path_factory) -> Path:
    """One process, the same options: what every distributed run must equal."""
    ref = tmp_path_factory.mktemp("ref") / "one"
    rc, _, err = _finish(_rank(img_src, ref, None, None))
    assert rc == 0, err
    return ref


def test_two_ranks_equal_one_process_and_the_last_publishes(img_src, reference, work_dir,
                                                            tree_digest):
    dst = work_dir / "ranks"
    ps = [_rank(img_src, dst, r, 2) for r in (1, 0)]  # rank 1 first: it must wait for 0
    outs = [_finish(p) for p in ps]
    for rc, d, err in outs:
        assert rc == 0, err
        assert d["world_size"] == 2 and d["units_written"] > 0
    assert sorted(d["rank"] for _, d, _ in outs) == [0, 1]
    assert sum(d["units_written"] for _, d, _ in outs) == \
        len(json.loads((reference / "manifest.json").read_text())["shards"])
    assert [d["finalized"] for _, d, _ in outs].count(True) >= 1
    assert not (dst / ".autotune-convert").exists()  # removed with the manifest written
    assert tree_digest(dst) == tree_digest(reference)


def test_slurm_variables_inside_an_srun_step_make_ranks(img_src, reference, work_dir,
                                                       tree_digest):
    dst = work_dir / "slurm"
    ps = [_rank(img_src, dst, None, None, env={"SLURM_PROCID": str(r), "SLURM_NTASKS": "2",
                                                "SLURM_STEP_ID": "0"}) for r in (0, 1)]
    outs = [_finish(p) for p in ps]
    assert all(rc == 0 for rc, _, _ in outs), [e for _, _, e in outs]
    assert sorted(d["rank"] for _, d, _ in outs) == [0, 1]
    assert tree_digest(dst) == tree_digest(reference)


def test_ranks_from_env_rules():
    from autotune_converters.ranks import ranks_from_env

    assert ranks_from_env({}) is None
    assert ranks_from_env({"RANK": "3", "WORLD_SIZE": "4"}) == (3, 4, "RANK/WORLD_SIZE")
    # a batch script holds SLURM_NTASKS too, but it is not one of the ranks
    assert ranks_from_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}) is None
    assert ranks_from_env({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_STEP_ID": "0"}) \
        == (5, 8, "SLURM_PROCID/SLURM_NTASKS")
    assert ranks_from_env({"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "7",
                           "SLURM_NTASKS": "8", "SLURM_STEP_ID": "0"})[:2] == (1, 2)


@pytest.mark.skipif(not shutil.which("torchrun", path=os.path.dirname(sys.executable)),
                    reason="torchrun is not installed next to this Python")
def test_under_torchrun_nproc_per_node_2(img_src, reference, work_dir, tree_digest):
    dst = work_dir / "torchrun"
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    r = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "-m", "autotune",
                        "convert", "-q", str(img_src), str(dst), *ARGS], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert tree_digest(dst) == tree_digest(reference)


def _tmp_files(d: Path) -> list[Path]:
    try:
        return [p for p in d.iterdir() if ".tar." in p.name]
    except FileNotFoundError:
        return []


def _assert_final_files_whole(dst: Path) -> None:
    import hashlib

    for shard in dst.glob("shard-*.tar"):
        rec = dst / ".autotune-convert" / "done" / f"unit-{int(shard.stem[6:]):06d}.json"
        want = json.loads(rec.read_text())["shard"]["sha256"]
        assert hashlib.sha256(shard.read_bytes()).hexdigest() == want, shard


@pytest.mark.slow
def test_kill9_of_a_rank_mid_unit_then_rerun_is_identical_and_finalize_checks(
        img_src, reference, work_dir, tree_digest):
    dst = work_dir / "killed"
    slow: list[str] = []
    p1 = _rank(img_src, dst, 1, 2, *slow)
    p0 = _rank(img_src, dst, 0, 2, *slow)
    tmp1 = dst / ".autotune-convert" / "ranks" / "1" / "tmp"
    deadline = time.monotonic() + 60
    caught = []
    while time.monotonic() < deadline and p1.poll() is None and not caught:
        caught = _tmp_files(tmp1)  # rank 1 is inside a unit: its shard is half written
        time.sleep(0.001)
    assert caught, "rank 1 finished before it could be killed mid-unit"
    p1.send_signal(signal.SIGKILL)
    p1.wait()
    rc0, d0, err0 = _finish(p0)
    assert rc0 == 0, err0
    assert d0["finalized"] is False and d0["waiting_for"] == [1]
    assert not (dst / "manifest.json").exists()
    _assert_final_files_whole(dst)
    assert _tmp_files(tmp1)  # the killed rank's half shard, under a temporary name only

    # --finalize now: refused, naming the rank whose units are missing (no --world-size)
    r = subprocess.run([sys.executable, "-m", "autotune", "convert", "-q", str(img_src),
                        str(dst), "--finalize"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "rank 1" in r.stderr and "of 2" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1

    rc1, d1, err1 = _finish(_rank(img_src, dst, 1, 2, *slow))  # the rerun resumes, publishes
    assert rc1 == 0, err1
    assert d1["finalized"] is True and d1["resumed_units"] >= 0
    assert tree_digest(dst) == tree_digest(reference)

    # --finalize on a published conversion: nothing to do, success
    r = subprocess.run([sys.executable, "-m", "autotune", "convert", "-q", str(img_src),
                        str(dst), "--finalize", "--json", "-"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["already_complete"] is True
    assert tree_digest(dst) == tree_digest(reference)


def test_the_finalizer_leaves_the_work_folder_to_a_rank_still_inside(img_src, reference,
                                                                     work_dir, tree_digest):
    """The last unit recorded is not the last write: a rank still syncing its records and
    state when another publishes found `.autotune-convert/done` gone (seen in CI: "done: No
    such file or directory"). The finalizer leaves the folder while another rank holds its
    lock; the last rank out removes it."""
    from autotune_converters import ConvertOptions, convert
    from autotune_base.errors import ConvertError
    from autotune_base.fsutil import PidLock
    from autotune_converters.workdir import WorkDir

    opts = dict(format="wds", shard_size=256 << 10, readers=2, workers=1, verify="decode")
    dst = work_dir / "inside"
    convert(img_src, dst, ConvertOptions(**opts, rank=0, world_size=2))
    rank0 = PidLock(WorkDir(dst).rank_dir(0) / "lock", ConvertError).acquire()  # still inside
    try:
        res = convert(img_src, dst, ConvertOptions(**opts, rank=1, world_size=2))
        assert res.finalized and (dst / "manifest.json").exists()
        assert (dst / ".autotune-convert" / "done").is_dir()  # rank 0 may still write there
    finally:
        rank0.release()
    assert WorkDir(dst).remove_stale()  # what rank 0 does as it leaves
    assert not (dst / ".autotune-convert").exists()
    assert tree_digest(dst) == tree_digest(reference)


def test_a_killed_finalizer_is_resumed_by_finalize(img_src, reference, work_dir, tree_digest,
                                                   monkeypatch):
    """Death inside the finalizer, before and after manifest.json: `--finalize` (a real
    process) completes it. The deaths are simulated in-process (on top of the kill -9
    test above, which cannot time a kill inside a few milliseconds of finalizing)."""
    from autotune_converters import ConvertOptions, convert
    from autotune_converters import ranks as ranks_mod
    from autotune_converters.workdir import WorkDir

    opts = dict(format="wds", shard_size=256 << 10, readers=2, workers=1, verify="decode")
    dst = work_dir / "fin"
    convert(img_src, dst, ConvertOptions(**opts, rank=0, world_size=2))

    def die(*a, **k):
        raise KeyboardInterrupt  # the process dies here: nothing after it runs

    monkeypatch.setattr(ranks_mod, "finalize_if_complete", die)
    with pytest.raises(KeyboardInterrupt):
        convert(img_src, dst, ConvertOptions(**opts, rank=1, world_size=2))
    monkeypatch.undo()
    assert not (dst / "manifest.json").exists()
    r = subprocess.run([sys.executable, "-m", "autotune", "convert", "-q", str(img_src),
                        str(dst), "--finalize"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert tree_digest(dst) == tree_digest(reference)

    # killed after the manifest, before the work directory was removed
    dst2 = work_dir / "fin2"
    convert(img_src, dst2, ConvertOptions(**opts, rank=0, world_size=2))
    monkeypatch.setattr(WorkDir, "remove", die)
    with pytest.raises(KeyboardInterrupt):
        convert(img_src, dst2, ConvertOptions(**opts, rank=1, world_size=2))
    monkeypatch.undo()
    assert (dst2 / "manifest.json").exists() and (dst2 / ".autotune-convert").exists()
    r = subprocess.run([sys.executable, "-m", "autotune", "convert", "-q", str(img_src),
                        str(dst2), "--finalize"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert not (dst2 / ".autotune-convert").exists()
    assert tree_digest(dst2) == tree_digest(reference)


def test_a_single_process_finishes_what_dead_ranks_left(img_src, reference, work_dir,
                                                        tree_digest):
    dst = work_dir / "takeover"
    rc, d, err = _finish(_rank(img_src, dst, 0, 2))
    assert rc == 0 and d["finalized"] is False, err
    rc, d, err = _finish(_rank(img_src, dst, None, None))  # no ranks: takes over
    assert rc == 0, err
    assert tree_digest(dst) == tree_digest(reference)


def test_a_rank_creating_the_work_directory_does_not_make_dst_foreign(img_src, work_dir,
                                                                      monkeypatch):
    """Rank 0's checks ran while rank 1 created DST/.autotune-convert (a race seen in
    scripts/bench_distributed.py): a DST holding only the work directory is ours."""
    from autotune_converters import conversion
    from autotune_converters.workdir import WorkDir

    dst = work_dir / "race"
    (dst / ".autotune-convert" / "ranks" / "1").mkdir(parents=True)
    monkeypatch.setattr(WorkDir, "exists", lambda self: False)  # looked before rank 1 made it
    opts = conversion.ConvertOptions(format="wds", rank=0, world_size=2)
    assert conversion.prepare(img_src, dst, opts)[-1] is None  # no "not empty" refusal
    (dst / "mine.txt").write_text("x")
    with pytest.raises(conversion.UsageError, match="not empty and not an autotune conversion"):
        conversion.prepare(img_src, dst, opts)


# -- bad input ---------------------------------------------------------------------------

def test_ranks_that_see_different_files_are_refused_naming_both_plan_hashes(img_src,
                                                                            work_dir):
    src = work_dir / "src"
    shutil.copytree(img_src, src)
    dst = work_dir / "out"
    rc, d, err = _finish(_rank(src, dst, 0, 2))
    assert rc == 0 and d["finalized"] is False, err
    published = json.loads((dst / ".autotune-convert" / "dist.json").read_text())["plan"]
    cls = sorted(p for p in src.iterdir() if p.is_dir())[0]
    shutil.copy(next(cls.iterdir()), cls / "added-later.jpg")  # SRC changes between ranks
    rc, d, err = _finish(_rank(src, dst, 1, 2))
    assert rc == 1, err
    assert published[:12] in err and "rank 0 published plan" in err
    mine = err.split("plans ", 1)[1][:12]
    assert mine != published[:12] and len(err.strip().splitlines()) == 1
    assert not (dst / "manifest.json").exists()


def test_a_second_process_with_the_same_rank_is_refused_with_the_holders_pid(img_src,
                                                                             work_dir):
    dst = work_dir / "twice"
    first = _rank(img_src, dst, 1, 2)  # waits for rank 0, holding rank 1's lock
    try:
        lock = dst / ".autotune-convert" / "ranks" / "1" / "lock"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (lock.exists() and lock.read_text()):
            time.sleep(0.05)
        rc, _, err = _finish(_rank(img_src, dst, 1, 2))
        assert rc == 1
        assert f"pid {first.pid}" in err and "rank 1" in err, err
    finally:
        first.kill()
        first.wait()


def test_a_rank_without_rank_0_times_out_naming_rank_0(img_src, work_dir):
    rc, _, err = _finish(_rank(img_src, work_dir / "alone", 1, 2, "--plan-timeout", "1"))
    assert rc == 1
    assert "rank 0" in err and "--plan-timeout" in err and "waited 1 s" in err, err


def test_lmdb_refuses_several_ranks_with_a_clear_message(img_src, work_dir):
    r = subprocess.run([sys.executable, "-m", "autotune", "convert", "-q", str(img_src),
                        str(work_dir / "l"), "--format", "lmdb", "--rank", "0",
                        "--world-size", "2"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2
    assert "one writer" in r.stderr and "--world-size" in r.stderr, r.stderr
    assert not (work_dir / "l").exists()


def test_ray_not_installed_is_one_line_with_the_pip_command(img_src, work_dir, tmp_path):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "ray.py").write_text("raise ImportError(\"No module named 'ray'\")\n")
    env = {**os.environ, "PYTHONPATH": f"{shim}:{ROOT}"}
    r = subprocess.run([sys.executable, "-m", "autotune", "convert", "-q", str(img_src),
                        str(work_dir / "r"), *ARGS, "--engine", "ray"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0
    assert "pip install 'autotune-loader[ray]'" in r.stderr, r.stderr
