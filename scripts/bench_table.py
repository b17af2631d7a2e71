"""images/s, data-wait fraction and AU for workers in {0,1,2,4,8}, cold, on a generated
image folder: unthrottled, under an IOPS cap (cgroup, root) and behind a FUSE delay,
plus the decode-only ceiling (decode + resize from memory with all cores).

    .venv/bin/python -m scripts.bench_table                      # 20,000 images (~2.5 min to make)
    .venv/bin/python -m scripts.bench_table --images 4000 --seconds 8 --json out/bench.json

The step is ResNet-50 on one A100 (the resnet50 preset: 2470 images/s) scaled to the batch
size used here (default 64 -> 26 ms), so AU says how well each storage would feed that
GPU. Prints a markdown table to stdout, progress to stderr, and writes every result as
JSON. Each figure is also checked against what the conditions allow; a figure that
looks too good is flagged in the notes column.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from autotune import report
from autotune.bench import BenchConfig, BenchResult, run_bench
from autotune.data.presets import load_preset, usable_cores
from autotune.errors import AutotuneError
from autotune.synth import make_image_folder
from scripts._common import ROOT, busy_pct, log


def wait_quiet(max_s: float, threshold: float = 15.0) -> float:
    """Wait (up to max_s) until the machine is nearly idle; returns the last busy %."""
    deadline = time.monotonic() + max_s
    busy = busy_pct()
    while busy > threshold and time.monotonic() < deadline:
        log(f"  machine busy ({busy:.0f} % CPU by others): waiting")
        time.sleep(5)
        busy = busy_pct()
    return busy


def _int_list(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def notes(r: BenchResult, *, ceiling: float | None = None, iops: int | None = None,
          ios_per_image: float | None = None) -> str:
    """What the reader must know about a row: failures, shortened windows, too-good figures."""
    out = []
    if r.failed:
        return f"FAILED ({r.failure_kind}): {r.reason}"
    sp = r.images_per_s_spread or {}
    if sp.get("relative", 0) > 0.25:
        out.append(f"unsteady ({sp['min']:.0f}-{sp['max']:.0f})")
    if r.window.get("shortened"):
        out.append(f"window cut at end of pass ({r.window['seconds']:.0f} s)")
    frac = r.window.get("storage_read_fraction")
    if r.cold and frac is not None and frac < 0.9:
        out.append(f"only {frac:.0%} of bytes from storage")
    if ceiling and r.cold and r.images_per_s > 1.05 * ceiling:
        out.append("ABOVE the decode ceiling: check the cache")
    if iops and ios_per_image:
        # reads/image is counted over the whole window, so compare the whole-window rate:
        # the cgroup throttle lets IOs through in bursts, and single windows swing.
        allowed = iops / ios_per_image
        out.append(f"{ios_per_image:.2f} reads/image in the window -> cap allows ~{allowed:.0f}/s")
        if r.images_per_s_overall > 1.1 * allowed:
            out.append("FASTER than the cap allows: check the cache")
    if r.window.get("first_batch_s", 0) and r.window["first_batch_s"] > 3:
        out.append(f"first batch {r.window['first_batch_s']:.1f} s")
    faults = r.window.get("major_faults")
    if any("major page faults" in w for w in r.warnings):
        out.append(f"page-fault stall: {faults:,} major faults (code/memory read back from disk)")
    others = others_cpu(r)
    if others is not None and others > BUSY_OTHERS_PCT:
        out.append(f"BUSY machine: others took ~{others:.0f} % CPU")
    return "; ".join(out)


BUSY_OTHERS_PCT = 25.0


def others_cpu(r: BenchResult) -> float | None:
    """CPU (% of one core) that processes outside the measurement took from it during the
    window: what they used while the machine was saturated (when it was not, they only
    used cycles the measurement left idle). None when not measured."""
    total = ((r.system.get("cpu") or {}).get("total_pct") or {}).get("median")
    cores = r.environment.get("cores") or 1
    if total is None or r.cpu_percent is None:
        return None
    if total < 90.0:
        return 0.0
    return max(0.0, total * cores - r.cpu_percent)


def row(label: str, workers: int | str, r: BenchResult, note: str) -> str:
    sp = r.images_per_s_spread or {}
    ips = "-" if r.images_per_s is None else (
        f"{r.images_per_s:,.0f} ({sp.get('min', 0):,.0f}-{sp.get('max', 0):,.0f}), "
        f"all {r.images_per_s_overall:,.0f}")
    disk = (r.system.get("disk") or {}).get("reads_per_s", {}).get("median")
    return (f"| {label} | {workers} | {ips} | {fmt(r.data_wait_fraction, '.2f')} | "
            f"{fmt(r.au, '.2f')} | {fmt(disk, ',.0f')} | {fmt(r.cpu_percent, '.0f')} | {note} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", help="image folder to use or create (default: data/synth-N in "
                                      "the repository)")
    ap.add_argument("--images", type=int, default=20000, help="images to generate (default 20000)")
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--workers", type=_int_list, default=[0, 1, 2, 4, 8], metavar="LIST")
    ap.add_argument("--seconds", type=float, default=15.0, help="measured window per run (default 15)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--compute-ms", type=float, default=None,
                    help="emulated step (default: the resnet50 preset's rate at this batch size)")
    ap.add_argument("--iops", type=int, default=300, help="read IOPS cap (default 300)")
    ap.add_argument("--memory-images", type=int, default=4000,
                    help="images held in memory for the decode ceiling (default 4000)")
    ap.add_argument("--delay-ms", type=float, default=5.0, help="FUSE delay per request (default 5)")
    ap.add_argument("--skip", default="", help="comma list of: plain, throttle, fuse, ceiling")
    ap.add_argument("--json", default=str(ROOT / "out" / "bench_table.json"), metavar="FILE")
    ap.add_argument("--nice", type=int, default=0,
                    help="run each measurement at this nice level (e.g. -10 as root, on a "
                         "machine shared with other work; stated in the table header)")
    ap.add_argument("--retries", type=int, default=3,
                    help="rerun a configuration measured while other processes used the CPU "
                         "(default 3 reruns)")
    ap.add_argument("--wait-quiet", type=float, default=120.0, metavar="S",
                    help="before each run, wait up to S seconds for other CPU load to stop "
                         "(default 120; 0 = do not wait)")
    a = ap.parse_args()

    preset = load_preset("resnet50")
    rate = preset.batch_size / (preset.compute_ms / 1000.0)  # images/s of the reference GPU
    compute_ms = a.compute_ms if a.compute_ms is not None else round(a.batch_size / rate * 1000, 1)
    skip = {s.strip() for s in a.skip.split(",") if s.strip()}
    ds = Path(a.dataset) if a.dataset else ROOT / "data" / f"synth-{a.images}"
    log(f"dataset {ds}: making/completing {a.images} images")
    made = make_image_folder(ds, a.images, a.classes, seed=0)
    log(f"{made.images} images, {made.bytes / 2**20:,.0f} MiB (mean {made.bytes / made.images / 1e3:.0f} KB)")
    cores = usable_cores()

    def popen(cmd: list[str], **kw):
        # nice(1) execs the command in the same process, so the measurement process is
        # still our direct child; its workers inherit the priority.
        import subprocess

        if a.nice:
            cmd = ["nice", "-n", str(a.nice), *cmd]
        return subprocess.Popen(cmd, **kw)

    def cfg(workers: int, **kw) -> BenchConfig:
        base = dict(num_workers=workers, batch_size=a.batch_size, compute_ms=compute_ms,
                    seconds=a.seconds, pin_memory=False)
        base.update(kw)
        return BenchConfig.from_preset("resnet50", **base)

    results: list[dict] = []
    lines: list[str] = []

    def quiet() -> None:
        if a.wait_quiet > 0:
            wait_quiet(a.wait_quiet)

    def measure(run) -> BenchResult:
        """run() on a quiet machine; rerun when others used the CPU during the window."""
        for attempt in range(a.retries + 1):
            quiet()
            r = run()
            others = others_cpu(r)
            disturbed = any("pages were evicted" in w or "major page faults" in w
                            for w in r.warnings)
            busy = others is not None and others > BUSY_OTHERS_PCT
            if r.failed or not (busy or disturbed) or attempt == a.retries:
                return r
            why = "pages evicted under the run" if disturbed else f"others took ~{others:.0f} % CPU"
            log(f"  {why}: measuring again")
        raise AssertionError("unreachable")

    def record(label: str, workers: int | str, r: BenchResult, **nk) -> None:
        n = notes(r, **nk)
        lines.append(row(label, workers, r, n))
        results.append({"storage": label, "workers": workers, "notes": n, **nk,
                        "result": r.to_dict()})
        log(f"  {label} w={workers}: {fmt(r.images_per_s, ',.0f')} images/s, wait "
            f"{fmt(r.data_wait_fraction, '.2f')}, AU {fmt(r.au, '.2f')} {n}")

    ceiling = None
    if "ceiling" not in skip:
        log(f"decode-only ceiling: {a.memory_images} images held in memory, {cores} workers, "
            "no step")
        # From memory, not from the page cache: on a shared machine another process may
        # drop the cache (or the kernel reclaim it) under a "warm" run.
        c = BenchConfig.from_preset("decode-only", num_workers=cores, batch_size=a.batch_size,
                                    seconds=a.seconds, cold=False, persistent_workers=True,
                                    in_memory=a.memory_images)
        r = measure(lambda: run_bench(ds, c, popen=popen))
        ceiling = r.images_per_s
        record(f"decode-only ceiling (FROM MEMORY, {a.memory_images} images)", cores, r)

    if "plain" not in skip:
        for w in a.workers:
            log(f"unthrottled, cold, workers={w}")
            record("local disk, cold", w, measure(lambda: run_bench(ds, cfg(w), popen=popen)),
                   ceiling=ceiling)

    if "throttle" not in skip:
        try:
            from autotune.emulate import IoThrottle

            with IoThrottle(ds, read_iops=a.iops, name="bench-table") as cap:
                for w in a.workers:
                    log(f"{a.iops}-IOPS cap, cold, workers={w}")
                    marks: dict[str, int] = {}

                    def at(msg: str) -> None:
                        # The cgroup's reads are the measurement's own: count them from
                        # the start of the window to the end (plus the last prefetches).
                        if msg.startswith("measuring"):
                            marks["start"] = cap.stats().read_ios
                        elif msg.startswith("stopping"):
                            marks["end"] = cap.stats().read_ios

                    r = measure(lambda: run_bench(ds, cfg(w), throttle=cap, progress=at,
                                                  popen=popen))
                    seen = r.window.get("samples") or 0
                    per = ((marks["end"] - marks["start"]) / seen
                           if seen and {"start", "end"} <= set(marks) else None)
                    record(f"{a.iops}-IOPS cap, cold", w, r, ceiling=ceiling, iops=a.iops,
                           ios_per_image=per)
        except AutotuneError as e:
            log(f"throttle skipped: {e}")
            lines.append(f"| {a.iops}-IOPS cap | - | not measured: {e} | | | | | |")

    if "fuse" not in skip:
        try:
            from autotune.emulate import SlowMount

            with tempfile.TemporaryDirectory(prefix="bench-table-mnt-") as tmp, \
                    SlowMount(ds, Path(tmp) / "mnt", delay_ms=a.delay_ms) as m:
                if a.nice and m.proc is not None:
                    # The FUSE server serves every read: give it the same priority
                    # (PRIO_PGRP reaches all its threads; it runs in its own session).
                    os.setpriority(os.PRIO_PGRP, m.proc.pid, a.nice)
                for w in a.workers:
                    log(f"FUSE {a.delay_ms:g} ms delay, cold, workers={w}")
                    r = measure(lambda: run_bench(m.mnt, cfg(w), monitor_path=ds, popen=popen))
                    record(f"FUSE +{a.delay_ms:g} ms, cold", w, r, ceiling=ceiling)
        except AutotuneError as e:
            log(f"FUSE skipped: {e}")
            lines.append(f"| FUSE +{a.delay_ms:g} ms | - | not measured: {e} | | | | | |")

    head = (f"{made.images:,} images ({made.bytes / made.images / 1e3:.0f} KB mean), batch "
            f"{a.batch_size}, emulated step {compute_ms:g} ms (ResNet-50 on one A100 at "
            f"{rate:,.0f} images/s), {a.seconds:g} s windows, {cores} cores, cold = drop_caches "
            "before each run" + (f", measured at nice {a.nice} (shared machine)" if a.nice else ""))
    print(head)
    print()
    print("| storage | workers | images/s: median of 5 windows (min-max), whole window | data-wait | AU | disk r/s | CPU % (tree) | notes |")
    print("|---|---|---|---|---|---|---|---|")
    for ln in lines:
        print(ln)
    out = Path(a.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    report.write_json(out, {"header": head, "rows": results})
    log(f"JSON: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
