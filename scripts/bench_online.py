"""autotune.DataLoader in a plain training loop (scripts/online_train.py), started cold,
against torch's DataLoader with the user's settings (num_workers=0) and against the best
fixed configuration `autotune search` finds for the same job (run here: the same dataset
through the same factory, the same step, the same batch size).

    sudo PYTHONPATH=$PWD .venv/bin/python -m scripts.bench_online [--scenarios a,b,c,d,e]
        [--minutes 1] [--seconds 30] [--rounds 1] [--search-trials 4] [--search-seconds S]
        [--json out/bench_online.json]

    a  default settings, fast disk, 250 ms step per 64: samples over the first --minutes
       (exploration included), the rate over the run's second half, time to settle, AU
       (the issue's run: --minutes 3, 180 s an arm)
    b  the same with a 100 ms step (decode-bound on 2 cores): the verdict said once
    c  NFS-like latency: a FUSE delay of --delay-ms per request, 250 ms step
    d  an already good configuration (this dataset's settings cached from (a)'s best
       fixed one): the loader's own time as a share of the wall time, switches after
       settling, and next()'s added cost (a microbenchmark, num_workers=0 both sides)
    e  behind a --iops read-IOPS cap (a loop disk of its own, cgroup blkio; root): switches,
       then the storage verdict once (the table says when: "storage at 23 s")

b, c and e run --seconds per arm; a runs --minutes. Each arm is a fresh process; the
dataset's pages are evicted before each (posix_fadvise per file: this dataset only, never
the machine's page cache), and the search evicts the same way. Root for c (FUSE) and e
(the cap); without it they are skipped, said so. Prints a table, writes --json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from autotune.emulate.setups import enter_setup, own_disk
from scripts._common import ROOT, log, write_json

TRAIN = ROOT / "scripts" / "online_train.py"   # run as a file: the user's own script
FACTORY = f"{TRAIN}:files_dataset"
STEPS = {"a": 250.0, "b": 100.0, "c": 250.0, "d": 250.0, "e": 250.0}
SETUP = {"a": "unthrottled", "b": "unthrottled", "c": "fuse", "d": "unthrottled", "e": "cap"}


def make_files(root: Path, n: int, size: int = 16384) -> Path:
    """n files of `size` random bytes in 10 folders (kept when there already)."""
    for i in range(n):
        p = root / f"c{i % 10}" / f"f{i:05d}.bin"
        if not p.is_file():
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(os.urandom(size))
    return root


def evict(ds: Path) -> None:
    from autotune.cache import evict_files

    evict_files(p for p in ds.rglob("*") if p.is_file())


def arm(path: Path, loader: str, a: argparse.Namespace, step_ms: float, seconds: float,
        env: dict[str, str], cap: Any, real: Path) -> dict[str, Any]:
    """One training run in a fresh process (inside the cap's cgroup under e)."""
    evict(real)
    cmd = [sys.executable, str(TRAIN), "--data", str(path), "--loader", loader,
           "--step-ms", str(step_ms), "--cost-ms", str(a.cost_ms), "--batch-size",
           str(a.batch_size), "--seconds", str(seconds)]
    kw = dict(env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p = cap.popen(cmd, **kw) if cap is not None else subprocess.Popen(cmd, **kw)
    out, err = p.communicate(timeout=seconds * 3 + 120)
    if p.returncode:
        raise SystemExit(f"{loader}: exit {p.returncode}: {err[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])


def figures(r: dict[str, Any], seconds: float) -> dict[str, Any]:
    """Samples, the rate and AU over the second half, settling, switches, verdicts."""
    marks, waits, bs = r["marks"], r["waits"], r["batch_size"]
    half = [i for i, m in enumerate(marks) if m >= seconds / 2]
    span = marks[half[-1]] - marks[half[0]] if len(half) > 1 else 0.0
    ev = r.get("events", [])
    settle = [e["t"] for e in ev if e["event"] == "settle"]
    out = {"loader": r["loader"], "samples": len(marks) * bs,
           "rate": (len(half) - 1) * bs / span if span else None,
           "au": 1 - sum(waits[i] for i in half[1:]) / span if span else None,
           "settled_s": settle[0] if settle else None,
           "switches": sum(e["event"] == "switched" for e in ev),
           "switches_after_settle": sum(e["event"] == "switched" and bool(settle) and
                                        e["t"] > settle[0] for e in ev),
           "retunes": sum(e["event"] == "retune" for e in ev),
           "verdicts": [e["bottleneck"] for e in ev if e["event"] == "verdict"],
           "verdict_s": next((e["t"] for e in ev if e["event"] == "verdict"), None),
           "verdict_msgs": [e["msg"] for e in ev if e["event"] == "verdict"],
           "tuned": r.get("tuned"), "summary": r.get("summary"),
           "events": [f"{e['t']:.1f} s {e['event']}: {e['msg']}" for e in ev],
           "overhead_share": r["overhead_s"] / r["wall_s"] if "overhead_s" in r else None,
           "main_cpu_s": r["main_cpu_s"], "wall_s": r["wall_s"]}
    return out


def search_best(path: Path, a: argparse.Namespace, step_ms: float, cap: Any, mon: str | None,
                out: Path) -> tuple[str, dict[str, Any], float]:
    """`autotune search` on the same job: its recommended configuration as W:P."""
    import autotune.bench.runner as runner
    from autotune.cache import evict_files
    from autotune.search.study import SearchOptions, run_search

    # Cold by evicting this dataset's files only: never the machine's page cache.
    runner.make_cold = lambda paths=None, keep_inodes=False: (evict_files(paths or []),
                                                              "fadvise")[1]
    t = time.monotonic()
    res = run_search(path, SearchOptions(
        dataset_factory=FACTORY, compute_ms=step_ms, batch_size=a.batch_size,
        seconds=a.search_seconds, out=str(out), probe=False,
        trials=a.search_trials_fuse if cap is None and mon else a.search_trials,
        probe_fio=False, monitor_path=mon, throttle=cap, confirm=1, baseline=False),
        progress=lambda m: log(f"  search: {m}"))
    rec = res.recommended or res.best
    if rec is None:
        raise SystemExit(f"search found no configuration: {res.stop_reason}")
    p = rec.params
    w = int(p.get("num_workers", 0))
    return f"{w}:{int(p.get('prefetch_factor') or 2)}", p, time.monotonic() - t


def scenario(name: str, ds: Path, a: argparse.Namespace, work: Path,
             cached: dict[str, Any] | None) -> dict[str, Any]:
    step = STEPS[name]
    seconds = a.minutes * 60 if name == "a" else a.seconds
    env = dict(os.environ, ONLINE_COST_MS=str(a.cost_ms),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    with ExitStack() as st:
        if SETUP[name] == "cap":
            (work / f"disk-{name}").mkdir()
            src = own_disk(st, ds, work / f"disk-{name}")
        else:
            src = ds
        path, mon, cap = enter_setup(st, SETUP[name], src, iops=a.iops, delay_ms=a.delay_ms,
                                     name="bench-online")
        res: dict[str, Any] = {"scenario": name, "step_ms": step, "seconds": seconds,
                               "setup": SETUP[name]}
        cache_dir = tempfile.mkdtemp(prefix="online-cache-", dir=work)
        env["AUTOTUNE_CACHE_DIR"] = cache_dir
        if name == "d":
            best = cached or {"arm": "2:2"}
            res["best"] = best["arm"]
            w, p = (int(x) for x in best["arm"].split(":"))
            seed = {"num_workers": w, "prefetch_factor": p}
            from autotune.cpus import usable_cores
            from autotune.online import cache
            from scripts.online_train import files_dataset
            key = cache.dataset_key(files_dataset(str(path)), None, a.batch_size,
                                    usable_cores())
            cache.store(key, seed, Path(cache_dir) / "online.json")
            log(f"d: online, cache seeded with {seed}")
            res["arms"] = [figures(arm(path, "online", a, step, seconds, env, cap, src),
                                   seconds)]
            m = subprocess.run([sys.executable, str(TRAIN), "--micro", "20000"], env=env,
                               capture_output=True, text=True, check=True)
            res["micro"] = json.loads(m.stdout.strip().splitlines()[-1])
            return res
        log(f"{name}: search ({SETUP[name]}, {step:g} ms step)")
        best, params, took = search_best(path, a, step, cap, mon, work / f"search-{name}")
        res.update(best=best, best_params=params, search_s=took)
        rows = []
        arms = ["plain", "online", best]
        for rnd in range(a.rounds):
            # Each round in another order: on a shared machine the load drifts over minutes,
            # and an arm always run last would always meet the same part of the drift.
            for loader in arms[rnd % 3:] + arms[:rnd % 3]:
                log(f"{name}: {loader}, {seconds:g} s" + (f" (round {rnd + 1} of {a.rounds})"
                                                          if a.rounds > 1 else ""))
                fig = figures(arm(path, loader, a, step, seconds, env, cap, src), seconds)
                fig["round"] = rnd
                rows.append(fig)
        res["arms"] = rows
        return res


def _round_rows(r: dict[str, Any], arms: list[dict[str, Any]], label: str) -> list[str]:
    best = next((x for x in arms if x["loader"] == r.get("best")), None)
    lines = []
    for x in arms:
        vs = f"{x['samples'] / best['samples']:.2f}x" if best else "-"
        vr = (f"{x['rate'] / best['rate']:.2f}x" if best and best["rate"] and x["rate"]
              else "-")
        st = f"{x['settled_s']:.0f} s" if x["settled_s"] is not None else "-"
        name = x["loader"] + (" (best fixed)" if x is best else "") + label
        verdict = ", ".join(x["verdicts"]) or "-"
        if x.get("verdict_s") is not None:
            verdict += f" at {x['verdict_s']:.0f} s"
        lines.append(f"| {r['scenario']} ({r['step_ms']:g} ms, {r['setup']}) | {name} | "
                     f"{x['samples']:,} | {vs} | {x['rate'] or 0:,.0f} | {vr} | "
                     f"{x['au'] or 0:.2f} | {st} | "
                     f"{x['switches'] if x['loader'] == 'online' else '-'} | {verdict} |")
    return lines


def _ratio(r: dict[str, Any], arms: list[dict[str, Any]]) -> tuple[float, float] | None:
    """online vs best fixed in one round: samples, rate."""
    best = next((x for x in arms if x["loader"] == r.get("best")), None)
    on = next((x for x in arms if x["loader"] == "online"), None)
    if best and on and best["samples"] and best["rate"] and on["rate"]:
        return on["samples"] / best["samples"], on["rate"] / best["rate"]
    return None


def table(results: list[dict[str, Any]]) -> str:
    import statistics

    lines = ["| scenario | arm | samples | vs best | rate/s (2nd half) | vs best | AU | "
             "settled | switches | verdict |", "|---|---|---|---|---|---|---|---|---|---|"]
    medians = []
    for r in results:
        rounds = sorted({x.get("round", 0) for x in r["arms"]})
        ratios = []
        for rnd in rounds:
            arms = [x for x in r["arms"] if x.get("round", 0) == rnd]
            lines += _round_rows(r, arms, f", round {rnd + 1}" if len(rounds) > 1 else "")
            q = _ratio(r, arms)
            if q:
                ratios.append(q)
        if "micro" in r:
            o = r["arms"][0]
            lines.append(f"| d | online: own time {100 * o['overhead_share']:.2f} % of wall, "
                         f"main process CPU {100 * o['main_cpu_s'] / o['wall_s']:.1f} %, "
                         f"switches after settling {o['switches_after_settle']} "
                         f"(retunes {o['retunes']}); next() +{r['micro']['added_us']:.1f} us "
                         "| | | | | | | | |")
        if len(ratios) > 1:
            medians.append(
                f"{r['scenario']}: online vs best fixed over {len(ratios)} rounds, median "
                f"{statistics.median(q[0] for q in ratios):.2f}x samples, "
                f"{statistics.median(q[1] for q in ratios):.2f}x rate (each round: "
                + ", ".join(f"{q[0]:.2f}x/{q[1]:.2f}x" for q in ratios) + ")")
    return "\n".join(lines + ([""] + medians if medians else []))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default="a,b,c,d,e")
    ap.add_argument("--minutes", type=float, default=1.0, help="(a)'s run (the issue: 3)")
    ap.add_argument("--seconds", type=float, default=30.0, help="b, c, d and e's runs")
    ap.add_argument("--cost-ms", type=float, default=2.4)
    ap.add_argument("--rounds", type=int, default=1,
                    help="b, c and e: run the three arms this many times, each round in "
                         "another order, and give the median of the rounds' ratios")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--delay-ms", type=float, default=5.0)
    ap.add_argument("--iops", type=int, default=100)
    ap.add_argument("--images", type=int, default=8000)
    ap.add_argument("--search-trials", type=int, default=4)
    ap.add_argument("--search-trials-fuse", type=int, default=6,
                    help="c's search: more workers than cores take a few trials to reach")
    ap.add_argument("--search-seconds", type=float, default=None,
                    help="each trial's window (default: what the step needs)")
    ap.add_argument("--dir", default="/var/tmp/online-bench", help="where the dataset goes")
    ap.add_argument("--json", default=str(ROOT / "out" / "bench_online.json"))
    a = ap.parse_args()
    ds = make_files(Path(a.dir) / "files", a.images)
    results = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-online-", dir="/var/tmp") as work:
        for name in a.scenarios.split(","):
            if SETUP[name] != "unthrottled" and os.geteuid() != 0:
                log(f"{name}: skipped ({SETUP[name]} needs root)")
                continue
            a_best = next((r for r in results if r["scenario"] == "a"), None)
            cached = {"arm": a_best["best"]} if a_best else None
            results.append(scenario(name, ds, a, Path(work), cached))
            print(table(results[-1:]), flush=True)
            write_json(a.json, results)  # so far: a crash keeps them
    out = table(results)
    print(out)
    print(f"\n(total {time.monotonic() - t0:.0f} s)")
    write_json(a.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
