"""A user's Dataset of its own through three loaders, side by side (issue 32, item 4): the
rule of thumb, what `autotune search` recommends for it, and SPDL's thread pipeline.

The Dataset (`user_dataset`): map-style, an ImageFolder-like list of (path, label) (sorted
classes, sorted files); `__getitem__` opens the file, reads it and runs torchvision's
ImageNet training transform (autotune.data.ImagenetTrainTransform, the `resnet50` preset's
code: PIL decode, RandomResizedCrop(224), RandomHorizontalFlip, float32 tensor, Normalize).
Every row runs this same `__getitem__`, in a fresh process, over the same shuffled order
(one seeded permutation), batch --batch, no training step:

- rule of thumb: `DataLoader(num_workers=os.cpu_count(), pin_memory=False)`, default
  prefetch (2), not persistent;
- recommendation: `autotune search DATASET --dataset-factory scripts.bench_spdl:user_dataset
  --batch-size B --compute-ms 0` run once at the start (cold, as the CLI's default; the
  replay probe without fio; --search-trials trials of --search-seconds), then
  `DataLoader(ds, **autotune.loader_kwargs(search.json))`;
- SPDL 0.8 at 2, 4 and 8 threads: `PipelineBuilder().add_source(indices)
  .pipe(ds.__getitem__, concurrency=N).aggregate(B).pipe(collate).add_sink(3)
  .build(num_threads=N)`, collate = torch.stack of the images, a tensor of the labels.

Each row is read warm (every file of the data set locked in the page cache by this
process: another user's drop_caches cannot make it partly cold) and cold (drop_caches
before the reading process starts). Window: the first batch and --warmup seconds of
batches after it excluded (the batches a DataLoader's workers had ready when the first came
would flatter a short window), then --seconds; a pass stops early at the end of its epoch
(a second epoch would be warm), and says so. Figures: images/s
of the window, and images per CPU-second of the reading process tree (user + system of
the process, its live workers and the ones it reaped), which other users' load moves less.
Rounds rotate the order (round k starts at row k) and alternate warm-first and cold-first;
the tables give medians with every round beside them, and /proc/loadavg as each pass began.

Needs root (drop_caches, mlock) and SPDL (`.venv/bin/pip install spdl==0.8.0`: spdl_core
and spdl_io, no torch). Run it alone:

    flock /tmp/autotune-bench.lock .venv/bin/python -m scripts.bench_spdl \\
        --dataset /var/tmp/spdl-ds [--rounds 3] [--seconds 10] [--batch 64] \\
        [--search-trials 6] [--search-seconds 6] [--work DIR] \\
        [--json out/bench_spdl.json] [--md out/bench_spdl.md]

Data set: `python -m scripts.make_dataset /var/tmp/spdl-ds --images 10000 --classes 40`
(82.7 KB a JPEG): a cold pass must not reach its epoch's end, and on 2 cores a DataLoader
reads up to ~600 images/s, ~7,000 in the warm-up and window.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from scripts._common import ROOT, drop_caches, loadavg, log, utc_date, work_dir, write_json

PY = sys.executable
SELF = [PY, "-m", "scripts.bench_spdl"]   # its child modes, from ROOT
ROWS = ("rule of thumb", "recommendation", "SPDL 2 threads", "SPDL 4 threads",
        "SPDL 8 threads")
CONDS = ("warm", "cold")
SEED = 0


# -- the user's Dataset -------------------------------------------------------------------

class UserImageFolder(Dataset):
    """What a user writes: (path, label) as torchvision's ImageFolder lists them, and a
    `__getitem__` that opens the file and runs the training transform."""

    def __init__(self, root: str) -> None:
        from autotune.data import ImagenetTrainTransform

        classes = sorted(e.name for e in os.scandir(root)
                         if e.is_dir() and not e.name.startswith("."))
        self.samples = [(os.path.join(root, c, f), label) for label, c in enumerate(classes)
                        for f in sorted(os.listdir(os.path.join(root, c)))]
        self.transform = ImagenetTrainTransform()   # PIL, exact: torchvision's steps

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        path, label = self.samples[i]
        with open(path, "rb") as f:
            data = f.read()
        return self.transform(data), label


def user_dataset(root: str) -> UserImageFolder:
    """The factory `autotune search --dataset-factory` imports in each measurement."""
    return UserImageFolder(root)


def _order(n: int) -> list[int]:
    """One seeded permutation: every row reads the same images in the same order."""
    import torch

    return torch.randperm(n, generator=torch.Generator().manual_seed(SEED)).tolist()


def _collate(batch: list[tuple[Any, int]]) -> tuple[Any, Any]:
    import torch

    return torch.stack([x for x, _ in batch]), torch.tensor([y for _, y in batch])


# -- a reading child ----------------------------------------------------------------------

def _loader(row: str, root: str, batch: int, kwargs: dict[str, Any]) -> Any:
    """An iterable of (images, labels) batches for `row`."""
    ds = user_dataset(root)
    order = _order(len(ds))
    if row.startswith("SPDL"):
        from spdl.pipeline import PipelineBuilder

        n = int(row.split()[1])
        if kwargs.get("torch_threads"):   # a variant: a DataLoader worker runs torch at 1
            import torch

            torch.set_num_threads(int(kwargs["torch_threads"]))
        return (PipelineBuilder()
                .add_source(order)
                .pipe(ds.__getitem__, concurrency=n)
                .aggregate(batch)
                .pipe(_collate)
                .add_sink(3)
                .build(num_threads=n))
    import torch.utils.data

    kw = {**kwargs, "batch_size": batch}
    return torch.utils.data.DataLoader(ds, sampler=order, **kw)


def _child_read(row: str, root: str, seconds: float, warmup: float, batch: int,
                kwargs: dict[str, Any]) -> None:
    import torch

    from scripts.bench_peers import _tree_cpu   # the process, its workers, the reaped ones

    loader = _loader(row, root, batch, kwargs)
    t_start = time.monotonic()
    it = iter(loader)
    first = next(it)
    first_s = time.monotonic() - t_start
    # The batches that were ready when the first one came (the DataLoader's workers fill
    # prefetch_factor batches each while the first is awaited) would flatter the window:
    # it opens after `warmup` seconds more, when the queues run at the producers' pace.
    skipped, t_w = 0, time.monotonic()
    while time.monotonic() - t_w < warmup:
        skipped += len(next(it)[1])
    c0, t0, n, ended = _tree_cpu(), time.monotonic(), 0, False
    while time.monotonic() - t0 < seconds:
        try:
            images, labels = next(it)
        except StopIteration:
            ended = True
            break
        n += len(labels)
    dt = time.monotonic() - t0
    cpu = _tree_cpu() - c0
    shape = list(first[0].shape)
    if hasattr(loader, "stop"):   # SPDL: its background thread, now
        loader.stop()
    print(json.dumps({"images": n, "seconds": dt, "cpu_s": cpu, "first_batch_s": first_s,
                      "warmup_images": skipped,
                      "images_per_s": n / dt if dt else 0.0,
                      "images_per_cpu_s": n / cpu if cpu else 0.0, "epoch_ended": ended,
                      "batch_shape": shape, "torch_threads": torch.get_num_threads()}))


# -- parent -------------------------------------------------------------------------------


def _child_env() -> dict[str, str]:
    pp = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{pp}" if pp else str(ROOT)}


def rule_of_thumb() -> dict[str, Any]:
    """The folklore: a worker per core, no pinning on a CPU box, the default prefetch."""
    return {"num_workers": os.cpu_count() or 1, "pin_memory": False}


def _search(root: Path, out: Path, a: argparse.Namespace) -> dict[str, Any]:
    """`autotune search` for the user's Dataset, as a user runs it; its loader_kwargs."""
    import autotune

    cmd = [PY, "-m", "autotune", "search", str(root), "--dataset-factory",
           "scripts.bench_spdl:user_dataset", "--batch-size", str(a.batch), "--compute-ms", "0",
           "--trials", str(a.search_trials), "--seconds", str(a.search_seconds), "--no-fio",
           "--out", str(out), "-q"]
    t0 = time.monotonic()
    load = loadavg()
    p = subprocess.run(cmd, cwd=ROOT, env=_child_env(), capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"bench_spdl: {' '.join(cmd)} failed ({p.returncode}): "
                         f"{(p.stderr or p.stdout)[-3000:]}")
    kw = autotune.loader_kwargs(out / "search.json", a.batch, warn=False)
    kw.pop("batch_size", None)
    d = json.loads((out / "search.json").read_text())
    return {"command": " ".join(cmd[2:]), "wall_s": time.monotonic() - t0, "load": load,
            "loader_kwargs": kw, "bottleneck": (d.get("verdict") or {}).get("bottleneck"),
            "ceilings": d.get("ceilings")}


def _read(row: str, cond: str, root: Path, kwargs: dict[str, Any],
          a: argparse.Namespace) -> dict[str, Any]:
    if cond == "cold":
        drop_caches()
    load = loadavg()
    cmd = [*SELF, "_read", row, str(root), str(a.seconds), str(a.warmup), str(a.batch),
           json.dumps(kwargs)]
    p = subprocess.run(cmd, cwd=ROOT, env=_child_env(), capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"bench_spdl: {row} ({cond}) failed ({p.returncode}): "
                         f"{p.stderr[-3000:]}")
    d = json.loads(p.stdout.strip().splitlines()[-1])
    d.update(row=row, cond=cond, load=load)
    return d


def rotated(rows: list[str], k: int) -> list[str]:
    """Round k's order: it starts at row k (mod the rows)."""
    k %= len(rows)
    return rows[k:] + rows[:k]


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def markdown(out: dict[str, Any]) -> str:
    """The tables: images/s and images per CPU-second, medians with every round (and its
    load average) beside them, then the ratio of the recommendation to SPDL's best."""
    reads = out["reads"]
    rounds = sorted({d["round"] for d in reads})
    L = [f"{out['images']:,} JPEGs (mean {out['mean_kb']:.1f} KB), {out['cpus']} CPUs, batch "
         f"{out['batch']}, no step, first batch and {out['warmup']:g} s excluded, "
         f"{out['seconds']:g} s windows; "
         + (f"recommendation: {out['search']['label']} (`autotune search`, "
            f"{out['search']['wall_s']:.0f} s, load {out['search']['load']}); "
            if out.get("search") else "")
         + f"rule of thumb: {out['rule_label']}"
         + (f"; SPDL rows with torch.set_num_threads({out['spdl_torch_threads']})"
            if out.get("spdl_torch_threads") else "") + ".\n"]
    for key, unit, fmt in (("images_per_s", "images/s", "{:,.0f}"),
                           ("images_per_cpu_s", "images per CPU-second", "{:,.1f}")):
        L.append(f"{unit}, median of {len(rounds)} rounds (each round: figure @ load average "
                 "1/5/15 min as the pass began):\n")
        L.append("| row | warm | cold | warm rounds | cold rounds |")
        L.append("|---|---|---|---|---|")
        for row in [r for r in ROWS if any(d["row"] == r for d in reads)]:
            cells, each = [], []
            for cond in CONDS:
                ds = sorted((d for d in reads if (d["row"], d["cond"]) == (row, cond)),
                            key=lambda d: d["round"])
                cells.append(fmt.format(_med([d[key] for d in ds])) if ds else "-")
                each.append(" / ".join(f"{fmt.format(d[key])} @ {d['load']}" for d in ds))
            L.append(f"| {row} | {cells[0]} | {cells[1]} | {each[0]} | {each[1]} |")
        L.append("")
    for cond in CONDS:
        med = {row: _med([d["images_per_s"] for d in reads
                          if (d["row"], d["cond"]) == (row, cond)]) for row in ROWS}
        spdl = max((r for r in ROWS if r.startswith("SPDL")), key=lambda r: med[r])
        if any(v != v for v in (med[spdl], med["recommendation"], med["rule of thumb"])):
            continue   # a partial run (--rows, --conds): no ratio
        L.append(f"{cond}: recommendation / SPDL's best ({spdl}) = "
                 f"{med['recommendation'] / med[spdl]:.2f}x; recommendation / rule of thumb = "
                 f"{med['recommendation'] / med['rule of thumb']:.2f}x; SPDL's best / rule of "
                 f"thumb = {med[spdl] / med['rule of thumb']:.2f}x.")
    L.append(f"\nLoad average before / after: {out['load_before']} / {out['load_after']}.")
    return "\n".join(L) + "\n"


def _rounds(rows: list[str], conds: list[str], files: list[Path], root: Path,
            kwargs: dict[str, dict[str, Any]], a: argparse.Namespace) -> list[dict[str, Any]]:
    """Every pass of every round: round k starts at row k, and alternates whether the warm
    or the cold passes come first; warm passes with every file locked in memory."""
    from scripts.bench_peers import _Pinned

    reads: list[dict[str, Any]] = []
    for r in range(a.rounds):
        for cond in (conds if r % 2 == 0 else conds[::-1]):
            pinned = _Pinned(files) if cond == "warm" else None
            if pinned:
                pinned.__enter__()
            try:
                for row in rotated(rows, r):
                    d = _read(row, cond, root, kwargs.get(row, {}), a)
                    d["round"] = r
                    reads.append(d)
                    log(f"round {r + 1} {cond:4s} {row:15s} {d['images_per_s']:6.0f} img/s "
                        f"{d['images_per_cpu_s']:6.1f} img/CPU-s (load {d['load']})"
                        + (" (epoch ended)" if d["epoch_ended"] else ""))
            finally:
                if pinned:
                    pinned.__exit__(None, None, None)
    return reads


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="/var/tmp/spdl-ds")
    ap.add_argument("--work", default=None, help="the search's outputs (default: a new folder "
                    "under --tmp-dir)")
    ap.add_argument("--tmp-dir", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10.0, help="each pass's window")
    ap.add_argument("--warmup", type=float, default=1.5, help="seconds of batches after "
                    "the first one, before the window opens")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--search-trials", type=int, default=6)
    ap.add_argument("--search-seconds", type=float, default=6.0)
    ap.add_argument("--rows", default="", help="comma-separated substrings: only the matching "
                    "rows (no search unless 'recommendation' is one)")
    ap.add_argument("--conds", default="warm,cold")
    ap.add_argument("--spdl-torch-threads", type=int, default=None, help="a variant: "
                    "torch.set_num_threads(N) in the SPDL rows' process (default: torch's "
                    "own, as a user gets it; a DataLoader worker runs torch at 1)")
    ap.add_argument("--json", default=str(ROOT / "out" / "bench_spdl.json"))
    ap.add_argument("--md", default=str(ROOT / "out" / "bench_spdl.md"))
    return ap


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_read":
        row, root, seconds, warmup, batch, kw = sys.argv[2:8]
        _child_read(row, root, float(seconds), float(warmup), int(batch), json.loads(kw))
        return 0
    a = _parser().parse_args()
    a.skip_convert = False   # work_dir's option; nothing here is converted
    if os.geteuid() != 0:
        print("bench_spdl needs root (drop_caches, mlock)", file=sys.stderr)
        return 2
    import importlib.util

    if importlib.util.find_spec("spdl") is None:
        print("bench_spdl: SPDL is not installed: .venv/bin/pip install spdl==0.8.0",
              file=sys.stderr)
        return 2
    from importlib.metadata import version

    from autotune.params import label

    rows = [r for r in ROWS if not a.rows or any(x and x in r for x in a.rows.split(","))]
    conds = [c for c in CONDS if c in a.conds.split(",")]
    root = Path(a.dataset)
    files = [p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")]
    size = sum(p.stat().st_size for p in files)
    out: dict[str, Any] = {"date": utc_date(), "dataset": str(root), "images": len(files),
                           "mean_kb": size / len(files) / 1e3, "cpus": os.cpu_count(),
                           "spdl": version("spdl"), "batch": a.batch, "seconds": a.seconds,
                           "warmup": a.warmup, "rounds": a.rounds, "load_before": loadavg(),
                           "spdl_torch_threads": a.spdl_torch_threads,
                           "command": " ".join(["python -m scripts.bench_spdl", *sys.argv[1:]])}
    log(f"{root}: {len(files)} images, mean {out['mean_kb']:.1f} KB; load {out['load_before']}")
    rule = rule_of_thumb()
    out["rule_label"] = label({**rule, "prefetch_factor": 2})
    kwargs: dict[str, dict[str, Any]] = {"rule of thumb": rule}
    if a.spdl_torch_threads:
        kwargs.update({r: {"torch_threads": a.spdl_torch_threads} for r in ROWS
                       if r.startswith("SPDL")})
    if "recommendation" in rows:
        work = work_dir("bench_spdl", a)
        if work is None:
            return 2
        search = _search(root, work / "search", a)
        search["label"] = label(search["loader_kwargs"])
        out["search"] = search
        kwargs["recommendation"] = search["loader_kwargs"]
        log(f"recommended {search['loader_kwargs']} ({search['bottleneck']}) in "
            f"{search['wall_s']:.0f} s")
    out["reads"] = _rounds(rows, conds, files, root, kwargs, a)
    out["load_after"] = loadavg()
    md = markdown(out)
    print(md)
    write_json(a.json, out)
    Path(a.md).parent.mkdir(parents=True, exist_ok=True)
    Path(a.md).write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
