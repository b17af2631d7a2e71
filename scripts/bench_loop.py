"""The closed loop's target (issue 6): a generated image folder on slow storage ->
search -> convert -> stage -> search again, before and after side by side, per set-up.

    .venv/bin/python -m scripts.bench_loop --dataset /work/data/bench20k
        [--setups hdd,nfs] [--iops 100] [--delay-ms 5] [--trials 6] [--seconds 8]

hdd: a cgroup read cap of --iops on the dataset's disk (about what a 7200 rpm disk serves
at random); the storage probe, the conversion's reads of the source and every trial read
under it, from just after torch is imported (a job's libraries live on local disk).
nfs: a --delay-ms FUSE delay on every open and read of the dataset.
The stage directory is on the root disk (the local disk: uncapped, and cold after a
cache drop, unlike a tmpfs). Needs root. The workload: a step of 250 ms per batch of 64
(demand 256 images/s, what 2 cores can decode for the resnet50 preset), cold cache.
Targets: after the loop, AU >= 0.90 and >= 3.5x the rule-of-thumb baseline (hdd); for nfs,
whatever the search on the source found, and whether converting and staging still paid.
Run it on a quiet machine (another process dropping the page cache disturbs it).
"""

from __future__ import annotations

import argparse
import shutil
import time
from contextlib import ExitStack
from pathlib import Path

from autotune.emulate.setups import enter_setup, own_disk, scratch_dir
from autotune.search import SearchOptions
from autotune.search.loop import run_loop
from scripts._common import ROOT, config_label, workload_args, write_json


def _fig(t: dict | None, key: str, fmt: str) -> str:
    v = (t or {}).get(key)
    return "-" if v is None else format(v, fmt)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True, help="an image folder (DATASET/CLASS/IMAGE.jpg)")
    ap.add_argument("--setups", default="hdd,nfs")
    workload_args(ap, trials=6, compute_ms=250.0, space="small", iops=100)
    ap.add_argument("--out", default=str(ROOT / "out" / "bench_loop"))
    ap.add_argument("--tmp-dir", default=None,
                    help="where scratch folders are made (default $TMPDIR, else /var/tmp)")
    a = ap.parse_args()
    ds = Path(a.dataset).absolute()
    n = sum(1 for _ in ds.rglob("*.jpg"))
    rows = []
    for setup in a.setups.split(","):
        out = Path(a.out) / setup
        shutil.rmtree(out, ignore_errors=True)
        with ExitStack() as st:
            work = scratch_dir(f"autotune-bench-loop-{setup}-", a.tmp_dir)
            st.callback(shutil.rmtree, work, True)
            stage = work / "stage"   # the root disk: local, uncapped, cold after a drop
            # hdd: the dataset on a loop disk of its own, so that the cap slows it alone.
            src = own_disk(st, ds, work) if setup in ("hdd", "cap") else ds
            path, mon, cap = enter_setup(st, setup, src, iops=a.iops, delay_ms=a.delay_ms,
                                         name="bench-loop")
            t = time.monotonic()
            opts = SearchOptions(preset="resnet50", batch_size=a.batch_size,
                                 compute_ms=a.compute_ms, seconds=a.seconds, space=a.space,
                                 trials=a.trials, out=str(out), probe_fio=False,
                                 monitor_path=mon, throttle=cap)
            # nfs: converted and staged whatever the verdict, to show whether it still pays.
            loop = run_loop(path, opts, convert="auto", stage_dir=stage, always=setup == "nfs",
                            progress=lambda m, s=setup: print(f"[{s}] {m}", flush=True))
            d = loop.to_dict()
            rows.append({"setup": setup, "seconds": time.monotonic() - t, "decision": loop.decision,
                         "gain": loop.gain, "before": d["before"], "after": d["after"],
                         "converted": d["converted"], "staged": d["staged"],
                         "commands": d["commands"]})
    print(f"\ndataset: {ds} ({n} images); step {a.compute_ms:g} ms per batch of {a.batch_size} "
          f"(demand {a.batch_size / a.compute_ms * 1000:.0f} images/s); {a.seconds:g} s windows; "
          f"space {a.space}; {a.trials} trials per search; cold; stage on the root disk\n")
    print("| set-up | baseline img/s (AU) | before: recommended, img/s (AU) | verdict | "
          "convert s | stage MiB/s | after: recommended, img/s (AU) | after / baseline |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        b, af = r["before"], r["after"] or {}
        conv = r["converted"] or {}
        print(f"| {r['setup']} | {_fig(b['baseline'], 'images_per_s', ',.0f')} "
              f"({_fig(b['baseline'], 'au', '.2f')}) | {config_label((b['recommended'] or {}).get('config'))}, "
              f"{_fig(b['recommended'], 'images_per_s', ',.0f')} ({_fig(b['recommended'], 'au', '.2f')}) | "
              f"{(b.get('verdict') or {}).get('bottleneck')} | "
              f"{conv.get('format', '-')} {_fig(conv, 'seconds', ',.0f')} | "
              f"{_fig(r['staged'], 'mib_per_s', ',.0f')} | {config_label((af.get('recommended') or {}).get('config'))}, "
              f"{_fig(af.get('recommended'), 'images_per_s', ',.0f')} "
              f"({_fig(af.get('recommended'), 'au', '.2f')}) | "
              f"{'-' if r['gain'] is None else format(r['gain'], '.2f') + 'x'} |")
    for r in rows:
        print(f"\n{r['setup']}: {r['decision']} ({r['seconds']:.0f} s)")
        for c in r["commands"]:
            print(f"  {c}")
    write_json(Path(a.out) / "bench_loop.json", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
