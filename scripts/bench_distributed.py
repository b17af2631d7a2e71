"""Figures for issue 15 (conversion beyond one machine), measured side by side in one run:

1. `autotune convert --format wds` of one image folder, cold source (caches dropped before
   each run), as 1 process (--workers 1 and --workers 2), as 2 ranks (RANK/WORLD_SIZE,
   --workers 1 each, plain processes started together; the last one publishes the
   manifest), and on a local two-node Ray cluster (ray.cluster_utils, one CPU per node;
   its start-up is not counted, the driver's connection is): wall seconds and images/s,
   and whether each output is byte-identical to the 1-process one (every shard's sha256
   and the manifest without "created");
2. kill -9 of rank 1 while it writes a unit (its temporary shard exists), rank 0 left to
   finish, rank 1 rerun: identical or not;
3. scan + plan + plan hash of the folder (what rank 0 does before anyone writes), to
   extrapolate: 1.28 M images on N nodes = scan/plan (scaled by file count) + 1.28 M /
   (N x this node's rate), assuming the source filesystem keeps up (it is the limit a big
   job meets first; this machine cannot measure that).

Times: `wall` from process start to exit (interpreter start and imports included, the
ranks started together), `convert` as each run reports it (from convert() to its end;
for ranks the slower rank, for Ray the driver's connection included). Each variant runs
--rounds times, alternating; medians.

Needs root for drop_caches (else the runs are warm, and say so). Run it alone:

    .venv/bin/python -m scripts.make_dataset /var/tmp/img4k --images 4000 --classes 40
    flock /tmp/autotune-bench.lock .venv/bin/python -m scripts.bench_distributed \\
        /var/tmp/img4k [--work /var/tmp/bench-dist] [--json out/bench_distributed.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from scripts._common import ROOT, drop_caches

PY = sys.executable
COMMON = ["--format", "wds", "--shard-size", "4MiB", "--readers", "8"]


def _cold() -> bool:
    if os.geteuid() != 0:
        return False
    drop_caches()
    return True


def _env(**extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items()
         if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "RAY_ADDRESS")}
    e["PYTHONPATH"] = str(ROOT)
    e.update(extra)
    return e


def _cmd(src: Path, dst: Path, *extra: str) -> list[str]:
    return [PY, "-m", "autotune", "convert", "-q", str(src), str(dst), *COMMON, *extra,
            "--json", "-"]


def digest(dst: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(dst.iterdir()):
        if p.name == "manifest.json":
            m = json.loads(p.read_text())
            m.pop("created")
            h.update(json.dumps(m, sort_keys=True).encode())
        elif p.is_file():
            h.update(p.name.encode() + hashlib.sha256(p.read_bytes()).digest())
        else:
            h.update(p.name.encode() + b"/")
    return h.hexdigest()


def one_process(src: Path, dst: Path, workers: int) -> dict:
    cold = _cold()
    t0 = time.monotonic()
    r = subprocess.run(_cmd(src, dst, "--workers", str(workers)), env=_env(),
                       capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    if r.returncode:
        raise SystemExit(r.stderr)
    d = json.loads(r.stdout)
    return {"wall_s": wall, "convert_s": d["seconds"], "samples": d["samples"], "cold": cold}


def ranks(src: Path, dst: Path, world: int) -> dict:
    cold = _cold()
    t0 = time.monotonic()
    ps = [subprocess.Popen(_cmd(src, dst, "--workers", "1"), env=_env(RANK=str(r),
                                                                     WORLD_SIZE=str(world)),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for r in range(world)]
    while any(p.poll() is None for p in ps):
        if any(p.poll() for p in ps):  # one failed: the others would wait for it
            for q in ps:
                q.kill()
            break
        time.sleep(0.01)
    wall = time.monotonic() - t0
    outs = [p.communicate() for p in ps]
    for p, (_, err) in zip(ps, outs):
        if p.returncode:
            raise SystemExit(err)
    ds = [json.loads(o) for o, _ in outs]
    return {"wall_s": wall, "convert_s": max(d["seconds"] for d in ds),
            "samples": sum(d["samples"] for d in ds), "cold": cold,
            "per_rank_units": [d["units_written"] for d in ds],
            "finalized_by": [d["rank"] for d in ds if d["finalized"]]}


def on_ray(src: Path, dst: Path, address: str) -> dict:
    cold = _cold()
    t0 = time.monotonic()
    r = subprocess.run(_cmd(src, dst, "--engine", "ray", "--ray-address", address),
                       env=_env(), capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    if r.returncode:
        raise SystemExit(r.stderr)
    d = json.loads(r.stdout)
    return {"wall_s": wall, "convert_s": d["seconds"], "samples": d["samples"], "cold": cold}


def kill_a_rank(src: Path, dst: Path) -> dict:
    """Rank 1 SIGKILLed inside a unit, rank 0 finishes, rank 1 rerun."""
    p1 = subprocess.Popen(_cmd(src, dst, "--workers", "1"), env=_env(RANK="1", WORLD_SIZE="2"),
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    p0 = subprocess.Popen(_cmd(src, dst, "--workers", "1"), env=_env(RANK="0", WORLD_SIZE="2"),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tmp = dst / ".autotune-convert" / "ranks" / "1" / "tmp"
    done = dst / ".autotune-convert" / "done"
    deadline = time.monotonic() + 300
    caught = None
    while time.monotonic() < deadline and p1.poll() is None:
        try:
            n_done = sum(1 for x in os.listdir(done) if int(x[5:11]) % 2 == 1)  # rank 1's
            partial = [x for x in os.listdir(tmp) if ".tar." in x]
        except (FileNotFoundError, ValueError):
            n_done, partial = 0, []
        if partial and n_done >= 10:  # mid-way through rank 1's units, inside one
            caught = partial[0]
            break
        time.sleep(0.002)
    p1.send_signal(signal.SIGKILL)
    p1.wait()
    out0, err0 = p0.communicate()
    if p0.returncode:
        raise SystemExit(err0)
    waiting = json.loads(out0)["waiting_for"]
    r = subprocess.run(_cmd(src, dst, "--workers", "1"), env=_env(RANK="1", WORLD_SIZE="2"),
                       capture_output=True, text=True, check=False)
    if r.returncode:
        raise SystemExit(r.stderr)
    d = json.loads(r.stdout)
    return {"killed_inside": caught, "rank0_waiting_for": waiting,
            "rerun_resumed_units": d["resumed_units"], "rerun_wrote_units": d["units_written"],
            "rerun_finalized": d["finalized"]}


def scan_plan(src: Path, work: Path) -> dict:
    from autotune_converters.conversion import ConvertOptions, scan_into

    opts = ConvertOptions(format="wds", shard_size=4 << 20, readers=8)
    root = os.path.abspath(src)
    _cold()
    t0 = time.monotonic()
    plan = scan_into(src, work / "plan", opts, opts.fingerprint(root), root, None, t0)
    t1 = time.monotonic()
    plan.content_hash()
    t2 = time.monotonic()
    n = plan.num_entries
    plan.close()
    shutil.rmtree(work / "plan", ignore_errors=True)
    return {"files": n, "scan_plan_s": t1 - t0, "hash_s": t2 - t1}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path, help="image folder (scripts/make_dataset.py)")
    ap.add_argument("--work", type=Path, default=None,
                    help="scratch outputs, this folder itself (created; what it holds is kept; "
                         "default: a new folder under --tmp-dir, removed at the end)")
    ap.add_argument("--tmp-dir", default=None,
                    help="where the new scratch folder is made (default $TMPDIR, else /var/tmp)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--rounds", type=int, default=3, help="each variant this many times, "
                    "alternating (medians reported)")
    a = ap.parse_args()
    # Never a fixed shared name, never a folder emptied before use: a new folder of our own
    # (or the one given, whose contents are left alone).
    own = a.work is None
    if own:
        from autotune.emulate.setups import scratch_dir

        a.work = scratch_dir("autotune-bench-dist-", a.tmp_dir)
    a.work.mkdir(parents=True, exist_ok=True)
    res: dict = {"src": str(a.src), "rounds": a.rounds}
    runs: dict[str, list[dict]] = {}
    cluster = None
    try:
        if not a.no_ray:
            from ray.cluster_utils import Cluster

            os.environ["PYTHONPATH"] = str(ROOT)
            cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1,
                                                                    "include_dashboard": False})
            cluster.add_node(num_cpus=1)
            cluster.wait_for_nodes()
            res["ray_nodes"] = len(cluster.list_all_nodes())
        ref = None
        for i in range(a.rounds):  # the variants alternate, round after round
            todo = {"one_w1": lambda d: one_process(a.src, d, 1),
                    "one_w2": lambda d: one_process(a.src, d, 2),
                    "ranks2": lambda d: ranks(a.src, d, 2)}
            if cluster is not None:
                todo["ray2"] = lambda d: on_ray(a.src, d, cluster.address)
            for k, fn in todo.items():
                d = a.work / f"{k}-{i}"
                r = fn(d)
                if ref is None:
                    ref = digest(d)
                r["identical"] = digest(d) == ref
                runs.setdefault(k, []).append(r)
                shutil.rmtree(d, ignore_errors=True)
        res["kill9_rank"] = kill_a_rank(a.src, a.work / "kill9")
        res["kill9_rank"]["identical"] = digest(a.work / "kill9") == ref
        res["scan"] = scan_plan(a.src, a.work)
    finally:
        if cluster is not None:
            cluster.shutdown()
        for d in a.work.iterdir():   # what this run made in --work, by its names
            if d.is_dir() and not d.is_symlink() and (
                    d.name in ("kill9", "plan") or d.name.split("-")[0] in
                    ("one_w1", "one_w2", "ranks2", "ray2")):
                shutil.rmtree(d, ignore_errors=True)
        if own:
            shutil.rmtree(a.work, ignore_errors=True)

    def med(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2]

    n = runs["one_w1"][0]["samples"]
    base_wall = med([r["wall_s"] for r in runs["one_w1"]])
    base_conv = med([r["convert_s"] for r in runs["one_w1"]])
    for k, rs in runs.items():
        wall, conv = med([r["wall_s"] for r in rs]), med([r["convert_s"] for r in rs])
        res[k] = {"wall_s": [round(r["wall_s"], 2) for r in rs],
                  "convert_s": [round(r["convert_s"], 2) for r in rs],
                  "images_per_s_wall": n / wall, "images_per_s_convert": n / conv,
                  "vs_one_w1_wall": base_wall / wall, "vs_one_w1_convert": base_conv / conv,
                  "identical": all(r["identical"] for r in rs), "cold": rs[0]["cold"],
                  **({"finalized_by": [r["finalized_by"] for r in rs]} if k == "ranks2" else {})}
    node_rate = max(res[k]["images_per_s_convert"] for k in ("one_w2", "ranks2"))
    per_file_scan = (res["scan"]["scan_plan_s"] + res["scan"]["hash_s"]) / res["scan"]["files"]
    big = 1_281_167
    res["extrapolation_1_28M"] = {
        "node_images_per_s": node_rate, "scan_plan_hash_s": per_file_scan * big,
        "minutes_by_nodes": {str(k): (per_file_scan * big + big / (k * node_rate)) / 60
                             for k in (1, 2, 4, 8, 16, 32)}}
    text = json.dumps(res, indent=1)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
