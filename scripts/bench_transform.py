"""Per-image cost of the sample transform (issue 13 item 6, issue 16 item 4), measured side
by side in one run on the same images:

- `resnet50`: our preset, torchvision's standard training transform step for step;
- `resnet50-fast`: our fast preset (simplejpeg, DCT-domain downscale, fewer copies);
- `torchvision` (with --torchvision-python): torchvision's v2 pipeline itself,
  `RandomResizedCrop(224)` + `RandomHorizontalFlip` + `ToImage` +
  `ToDtype(float32, scale=True)` + `Normalize(ImageNet)` on `Image.open(f).convert("RGB")`
  (ImageFolder's pil_loader), run in that interpreter (a venv with torchvision).

    .venv/bin/python -m scripts.bench_transform DATASET [--images 600] [--rounds 7] \\
        [--torchvision-python /work/tv-venv/bin/python] [--json out.json]

Each pipeline runs in its own process with one torch thread (as in a DataLoader worker),
fed the same files; every round reseeds torch, so all pipelines draw the same crop boxes
and flips. Two measurements, in alternating rounds (the order rotates each round), medians:

1. ms/image from bytes in memory (no I/O): the decode ceiling per core is 1000 / CPU ms,
   what `autotune search` computes;
2. images/s through a DataLoader with 0 workers (batch 64): files read (page cache warm),
   transformed and collated in the main process.

Before timing, every pipeline's output for the first images (seed = index) is compared:
resnet50 against torchvision (exact: should be 0) and resnet50-fast against resnet50 (the
fast preset's tolerance, mean |difference| in levels of 255). Prints a Markdown table and
the JSON (also to --json).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts._common import ROOT, log

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
OURS = ("resnet50", "resnet50-fast")
EXTS = (".jpg", ".jpeg", ".png")


# -- worker (a separate process per pipeline; the torchvision one imports no autotune) ---

def _pipeline(kind: str):
    """(bytes -> tensor, path -> tensor) for `kind`."""
    import io

    import torch

    if kind == "torchvision":
        from PIL import Image
        from torchvision.transforms import v2

        tf = v2.Compose([v2.RandomResizedCrop(224), v2.RandomHorizontalFlip(), v2.ToImage(),
                         v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean=MEAN, std=STD)])

        def from_bytes(b: bytes):
            return tf(Image.open(io.BytesIO(b)).convert("RGB"))

        def from_path(p: str):  # ImageFolder: pil_loader, then the transform
            with open(p, "rb") as f:
                return tf(Image.open(f).convert("RGB"))
        return from_bytes, from_path
    from autotune.data import build_transform, load_preset

    t = build_transform(load_preset(kind).transform)
    return t, t  # our transform takes bytes or a path


def _worker(kind: str, files_json: str, threads: int, batch: int) -> None:
    import torch
    import torch.utils.data

    torch.set_num_threads(threads)
    files = json.loads(Path(files_json).read_text())
    from_bytes, from_path = _pipeline(kind)
    blobs = [Path(f).read_bytes() for f in files]

    class Files(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(files)

        def __getitem__(self, i: int):
            return from_path(files[i]), i

    from_bytes(blobs[0])  # imports and first-call set-up are not per-image cost
    for line in sys.stdin:
        cmd, *args = line.split()
        seed = int(args[0]) if args else 0
        if cmd == "ms":
            torch.manual_seed(seed)
            c0, w0 = time.process_time(), time.perf_counter()
            for b in blobs:
                from_bytes(b)
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            reply = {"ms": wall * 1e3 / len(blobs), "cpu_ms": cpu * 1e3 / len(blobs)}
        elif cmd == "loader":
            torch.manual_seed(seed)
            loader = torch.utils.data.DataLoader(Files(), batch_size=batch, num_workers=0)
            n, w0 = 0, time.perf_counter()
            for x, _ in loader:
                n += len(x)
            reply = {"images_per_s": n / (time.perf_counter() - w0)}
        elif cmd == "outputs":  # outputs of the first images, seed = index, to a file
            m, out = int(args[1]), args[2]
            xs = []
            for i, b in enumerate(blobs[:m]):
                torch.manual_seed(i)
                xs.append(torch.as_tensor(from_bytes(b)).as_subclass(torch.Tensor).contiguous())
            torch.save(torch.stack(xs), out)
            reply = {"saved": out}
        else:
            reply = {"error": f"unknown command {cmd!r}"}
        print(json.dumps(reply), flush=True)


# -- parent -------------------------------------------------------------------------------

class Worker:
    def __init__(self, kind: str, python: str, files_json: str, threads: int, batch: int) -> None:
        self.kind = kind
        # This checkout on the path: the torchvision worker runs in another interpreter.
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        self.p = subprocess.Popen(
            [python, "-m", "scripts.bench_transform", "--worker", kind, "--files", files_json,
             "--threads", str(threads), "--batch", str(batch)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": path})

    def ask(self, *cmd: object) -> dict:
        assert self.p.stdin and self.p.stdout
        self.p.stdin.write(" ".join(str(c) for c in cmd) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise SystemExit(f"bench_transform: the {self.kind} worker exited "
                             f"(code {self.p.wait()}); see its error above")
        return json.loads(line)

    def close(self) -> None:
        if self.p.stdin:
            self.p.stdin.close()
        self.p.wait(timeout=60)


def _levels(a, b):
    """Mean |a - b| per value in levels of 255, for normalised tensors [N, 3, H, W]."""
    import torch

    std = torch.tensor(STD).view(1, 3, 1, 1)
    return ((a - b).abs() * std * 255).mean(dim=(1, 2, 3))


def _compare(workers: dict[str, Worker], m: int, tmp: str) -> dict:
    import torch

    from autotune.data import geometry, load_preset
    from autotune.data.decode import open_image

    outs = {}
    for kind, w in workers.items():
        path = os.path.join(tmp, f"{kind}.pt")
        w.ask("outputs", 0, m, path)
        outs[kind] = torch.load(path)
    res: dict = {"images": m}
    d = _levels(outs["resnet50-fast"], outs["resnet50"])
    # Which of those images the fast preset decoded at reduced scale (same draws).
    spec = load_preset("resnet50-fast").transform
    files = json.loads(Path(os.path.join(tmp, "files.json")).read_text())[:m]
    scaled = []
    for i, f in enumerate(files):
        torch.manual_seed(i)
        op = open_image(Path(f).read_bytes(), "pil")
        scaled.append(geometry.plan(spec, *op.size).reduction() > 1)
    full = [float(v) for v, s in zip(d, scaled) if not s]
    dct = [float(v) for v, s in zip(d, scaled) if s]
    res["fast_vs_resnet50_levels"] = {
        "mean": float(d.mean()), "max_image": float(d.max()),
        "dct_scaled_images": len(dct),
        "full_scale_max_image": max(full, default=None),
        "dct_scaled_max_image": max(dct, default=None)}
    if "torchvision" in outs:
        diff = (outs["resnet50"] - outs["torchvision"]).abs()
        res["resnet50_vs_torchvision"] = {"max_abs": float(diff.max()),
                                          "mean_levels": float(_levels(outs["resnet50"], outs["torchvision"]).mean())}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset", nargs="?", help="image folder (CLASS/IMAGE.jpg)")
    ap.add_argument("--images", type=int, default=600, help="images used (seeded sample; default 600)")
    ap.add_argument("--rounds", type=int, default=7, help="alternating rounds per measurement (default 7)")
    ap.add_argument("--loader-rounds", type=int, default=5, help="rounds of the 0-worker DataLoader (default 5)")
    ap.add_argument("--torchvision-python", metavar="PY", help="interpreter with torchvision (a separate venv)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per pipeline (default 1)")
    ap.add_argument("--batch", type=int, default=64, help="DataLoader batch size (default 64)")
    ap.add_argument("--compare", type=int, default=64, help="images whose outputs are compared (default 64)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="FILE", help="also write the JSON here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--files", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        _worker(a.worker, a.files, a.threads, a.batch)
        return 0
    if not a.dataset:
        ap.error("DATASET is required")
    files = sorted(str(p) for p in Path(a.dataset).rglob("*") if p.suffix.lower() in EXTS)
    if not files:
        raise SystemExit(f"bench_transform: no images under {a.dataset}")
    files = sorted(random.Random(a.seed).sample(files, min(a.images, len(files))))
    sizes = [os.path.getsize(f) for f in files]
    kinds = list(OURS) + (["torchvision"] if a.torchvision_python else [])
    with tempfile.TemporaryDirectory() as tmp:
        fj = os.path.join(tmp, "files.json")
        Path(fj).write_text(json.dumps(files))
        workers = {k: Worker(k, a.torchvision_python if k == "torchvision" else sys.executable,
                             fj, a.threads, a.batch) for k in kinds}
        try:
            log(f"{len(files)} images, mean {statistics.mean(sizes) / 1e3:.1f} KB; comparing outputs")
            check = _compare(workers, min(a.compare, len(files)), tmp)
            ms: dict[str, list[float]] = {k: [] for k in kinds}
            cpu: dict[str, list[float]] = {k: [] for k in kinds}
            ips: dict[str, list[float]] = {k: [] for k in kinds}
            for r in range(a.rounds):
                for k in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
                    rep = workers[k].ask("ms", a.seed + r)
                    ms[k].append(rep["ms"])
                    cpu[k].append(rep["cpu_ms"])
                log(f"per-image round {r + 1}/{a.rounds}: "
                     + ", ".join(f"{k} {ms[k][-1]:.2f} ms" for k in kinds))
            for r in range(a.loader_rounds):
                for k in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
                    ips[k].append(workers[k].ask("loader", a.seed + r)["images_per_s"])
                log(f"DataLoader round {r + 1}/{a.loader_rounds}: "
                     + ", ".join(f"{k} {ips[k][-1]:.0f}/s" for k in kinds))
        finally:
            for w in workers.values():
                w.close()
    med = {k: {"ms_per_image": statistics.median(ms[k]), "cpu_ms_per_image": statistics.median(cpu[k]),
               "decode_ceiling_per_core": 1e3 / statistics.median(cpu[k]),
               "loader0_images_per_s": statistics.median(ips[k]),
               "rounds_ms": ms[k], "rounds_loader0": ips[k]} for k in kinds}
    def paired(a: list[float], b: list[float]) -> float:
        """Median over rounds of a[r] / b[r]: each ratio from measurements made side by
        side, so a change of load on a shared machine between rounds cancels out."""
        return statistics.median(x / y for x, y in zip(a, b))

    # Ceiling ratios from CPU time (what autotune's decode ceiling uses), paired by round.
    ratios = {"fast_over_resnet50_decode_ceiling": paired(cpu["resnet50"], cpu["resnet50-fast"]),
              "fast_over_resnet50_loader0": paired(ips["resnet50-fast"], ips["resnet50"])}
    if "torchvision" in med:
        ratios["resnet50_over_torchvision_loader0"] = paired(ips["resnet50"], ips["torchvision"])
        ratios["torchvision_over_resnet50_ms"] = paired(ms["torchvision"], ms["resnet50"])
        ratios["torchvision_over_resnet50_cpu_ms"] = paired(cpu["torchvision"], cpu["resnet50"])
    out = {"dataset": os.path.abspath(a.dataset), "images": len(files),
           "mean_kb": statistics.mean(sizes) / 1e3, "threads": a.threads, "batch": a.batch,
           "rounds": a.rounds, "loader_rounds": a.loader_rounds, "pipelines": med,
           "ratios": ratios, "outputs": check, "command": " ".join(sys.argv)}
    print(f"{len(files)} images from {a.dataset} (mean {out['mean_kb']:.1f} KB), {a.threads} "
          f"torch thread(s), medians of {a.rounds} / {a.loader_rounds} alternating rounds; "
          "ratios are medians of per-round ratios\n")
    print("| pipeline | ms/image | CPU ms/image | decode ceiling/core | 0-worker DataLoader images/s |")
    print("|---|---:|---:|---:|---:|")
    for k in kinds:
        m = med[k]
        print(f"| {k} | {m['ms_per_image']:.2f} | {m['cpu_ms_per_image']:.2f} | "
              f"{m['decode_ceiling_per_core']:.0f}/s | {m['loader0_images_per_s']:.0f} |")
    print(f"\nresnet50-fast / resnet50 decode ceiling: {ratios['fast_over_resnet50_decode_ceiling']:.2f}x "
          f"(0-worker DataLoader: {ratios['fast_over_resnet50_loader0']:.2f}x)")
    if "torchvision" in med:
        print(f"resnet50 / torchvision, 0-worker DataLoader images/s: "
              f"{ratios['resnet50_over_torchvision_loader0']:.3f} (target 0.9-1.1); per image: "
              f"torchvision ms / resnet50 ms {ratios['torchvision_over_resnet50_ms']:.3f} (wall), "
              f"{ratios['torchvision_over_resnet50_cpu_ms']:.3f} (CPU)")
    fv = check["fast_vs_resnet50_levels"]
    print(f"\nresnet50-fast vs resnet50 on {check['images']} images (same crops): mean |diff| "
          f"{fv['mean']:.3f} levels of 255, worst image {fv['max_image']:.3f}; "
          f"{fv['dct_scaled_images']} decoded at reduced scale")
    if "resnet50_vs_torchvision" in check:
        tv = check["resnet50_vs_torchvision"]
        print(f"resnet50 vs torchvision (same seeds): max |diff| {tv['max_abs']:.3g} "
              f"(normalised units), mean {tv['mean_levels']:.3g} levels")
    print("\n" + json.dumps(out, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
