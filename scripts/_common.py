"""What the scripts share: the checkout's root, a timestamped progress line, a DataLoader
configuration's short label, the options the loop and search benchmarks share, a reading
child's handshake, and small figures and files (how busy the machine is, a folder's bytes,
a cold cache, copied images, a JSON file, the date).

Run the scripts from the repository root as modules: `python -m scripts.NAME`.

Nothing heavy is imported here at module level (autotune, torch: inside the functions):
children that must import no autotune (the plain boto3 loop of scripts.s3_probe_check,
scripts.bench_s3_clients' import timing) import their script, and so this module.
The storage set-ups (a disk of its own, the cap, the FUSE delay) and scratch folders are
library code: `autotune.emulate.setups`.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]   # the checkout: its autotune, tests, out/


def log(msg: str) -> None:
    """A progress line on stderr, with the time (stdout carries the results)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def config_label(params: dict | None) -> str:
    """'w4 pf2 persistent' for a DataLoader configuration (autotune.params.label); '-'."""
    from autotune.params import label

    return label(params) if params else "-"


def workload_args(ap: Any, *, trials: int, compute_ms: float, space: str, iops: int) -> None:
    """The options the loop and search benchmarks share: the slow storage, the search,
    the workload (a step per batch of 64)."""
    ap.add_argument("--iops", type=int, default=iops)
    ap.add_argument("--delay-ms", type=float, default=5.0)
    ap.add_argument("--trials", type=int, default=trials)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--space", default=space)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--compute-ms", type=float, default=compute_ms)


def expect_line(p: Any, word: str, kind: str) -> None:
    """A reading child's next line must be `word` (READY, FIRST); else it failed, and its
    stderr says why."""
    line = p.stdout.readline()
    if line.strip() != word:
        p.kill()
        raise SystemExit(f"read {kind} failed: {line}{p.stderr.read()[-3000:]}")


def go(p: Any) -> None:
    """Let a reading child past its handshake."""
    p.stdin.write("GO\n")
    p.stdin.flush()


def start_reader(p: Any, cap: Any, kind: str) -> tuple[Any, Any]:
    """Through a reading child's handshake: (the cgroup's I/O counters before its first
    batch, at its first batch); the child then reads its window."""
    expect_line(p, "READY", kind)
    before = cap.stats()
    go(p)
    expect_line(p, "FIRST", kind)
    first = cap.stats()
    go(p)
    return before, first


def busy_pct(seconds: float = 2.0) -> float:
    """CPU busy % of the whole machine over `seconds` (other people's work shows here)."""
    from autotune.monitor import cpu_usage, read_cpu_times

    a = read_cpu_times()
    time.sleep(seconds)
    return cpu_usage(a, read_cpu_times()).total_pct


def work_dir(name: str, a: Any) -> Path | None:
    """The outputs folder of a benchmark with --work, --tmp-dir and --skip-convert: the
    one given, else a new one of its own under --tmp-dir (said on stderr); None, said why,
    when --skip-convert has no earlier run's folder to reuse."""
    if a.skip_convert and not a.work:
        print(f"{name}: --skip-convert reuses the outputs of an earlier run: give its "
              "--work folder", file=sys.stderr)
        return None
    from autotune.emulate.setups import scratch_dir

    work = Path(a.work) if a.work else scratch_dir(f"autotune-{name.replace('_', '-')}-",
                                                   a.tmp_dir)
    work.mkdir(parents=True, exist_ok=True)
    print(f"{name}: outputs in {work} (--work {work} --skip-convert reuses them)",
          file=sys.stderr)
    return work


def loadavg() -> str:
    """The machine's load average, 1/5/15 min, as a benchmark writes it beside a figure."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def du(path: Path) -> int:
    """Bytes of the files under `path`."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def drop_caches() -> None:
    """The machine's page cache dropped (autotune.cache.drop_caches; root), imported here
    only when called: a timed child that imports its script pays nothing for it."""
    from autotune.cache import drop_caches as drop

    drop()


def copy_images(files: Iterable[Path], dst: Path) -> None:
    """Each image copied to dst/CLASS/NAME (CLASS: its folder's name), times kept."""
    for f in files:
        d = dst / f.parent.name
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, d / f.name)


def write_json(path: str | Path, data: Any, *, indent: int = 1, default: Any = None) -> None:
    """`data` as JSON at `path`, its folder made first."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=indent, default=default))


def utc_date() -> str:
    """Now, as the results' "date" field: '2026-12-01 14:05 UTC'."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
