"""Figures for issue 5 (`autotune convert`), measured side by side in one run:

1. conversion images/s and MB/s of a generated 20,000-image folder, cold source, for
   WebDataset and LMDB with 1 and 2 workers, beside webdataset's ShardWriter used the
   documented way (one process, `with ShardWriter(pattern, maxsize=...) as sink:
   sink.write(sample)`) on the same data;
2. cold read images/s of the loose folder, the WebDataset shards and the LMDB (autotune's
   pread reader, the usual readahead=False idiom, and readahead=True), unthrottled and
   under a cgroup read-IOPS cap, with the I/Os and bytes each image cost (from the
   cgroup's own counters: a figure faster than the disk allows shows up there);
3. with --rss: peak RSS of a conversion of 20,000 and 200,000 tiny files.

Reads go through a DataLoader with 2 workers and batch 16, no decode (bytes only: this
measures storage, not the CPU); map-style sources (folder, LMDB) with shuffle=True, the
WebDataset with its shard shuffle and a 1000-sample buffer. Steady state: the first batch
(worker start-up) is excluded. Needs root (drop_caches, cgroup cap). Run it alone:

    flock /tmp/autotune-bench.lock .venv/bin/python -m scripts.bench_convert \\
        [--dataset /work/data/ds20k] [--iops 300] [--read-seconds 20] [--rss] \\
        [--json out/bench_convert.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

from scripts._common import ROOT, drop_caches, du, start_reader, work_dir, write_json

PY = sys.executable
SELF = [PY, "-m", "scripts.bench_convert"]   # its child modes, from ROOT


# -- child modes (run in fresh processes) -------------------------------------------------

def _child_shardwriter(src: str, dst: str, shard_size: int) -> None:
    """webdataset's ShardWriter, the documented way, on the same (seeded-shuffled) files."""
    import webdataset as wds

    t0 = time.monotonic()
    classes = sorted(e.name for e in os.scandir(src) if e.is_dir())
    files = []
    for label, c in enumerate(classes):
        for e in os.scandir(os.path.join(src, c)):
            files.append((e.path, label))
    random.Random(0).shuffle(files)
    os.makedirs(dst, exist_ok=True)
    nbytes = 0
    with wds.ShardWriter(os.path.join(dst, "shard-%06d.tar"), maxsize=shard_size,
                         verbose=0) as sink:
        for i, (path, label) in enumerate(files):
            with open(path, "rb") as f:
                data = f.read()
            nbytes += len(data)
            sink.write({"__key__": f"{i:08d}", "jpg": data, "cls": label})
    closed = time.monotonic() - t0
    os.sync()  # ShardWriter leaves its shards in the page cache; ours are fsynced
    print(json.dumps({"seconds": closed, "seconds_synced": time.monotonic() - t0,
                      "samples": len(files), "bytes": nbytes}))


def _lens(batch: list) -> list[int]:
    return [len(b[0]) if isinstance(b, tuple) else len(b) for b in batch]


class _Bytes:
    """Map-style dataset of raw sample bytes (no decode)."""

    def __init__(self, source) -> None:
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> bytes:
        return self.source.read(i)[0]


def _child_read(kind: str, path: str, seconds: float) -> None:
    import torch.utils.data

    if kind == "wds":
        from autotune_converters import WdsSource

        ds = WdsSource(path).dataset(None, seed=0, shuffle_buffer=1000)
        loader = torch.utils.data.DataLoader(ds, batch_size=16, num_workers=2, collate_fn=_lens)
    else:
        if kind == "folder":
            from autotune_converters.folder import FolderSource
            src = FolderSource(path)
        else:
            from autotune_converters import LmdbSource
            src = LmdbSource(path, io={"lmdb-pread": "pread", "lmdb-mmap": "mmap",
                                       "lmdb-noreadahead": "mmap-noreadahead"}[kind])
        loader = torch.utils.data.DataLoader(
            _Bytes(src), batch_size=16, num_workers=2, shuffle=True, collate_fn=_lens,
            generator=torch.Generator().manual_seed(0))
    it = iter(loader)  # starts the workers
    # Handshake: the parent reads the cgroup's I/O counters now, so that imports (a cold
    # cache holds torch too) are not charged to the images; the first batch's I/O is.
    print("READY", flush=True)
    sys.stdin.readline()
    first = next(it)
    print("FIRST", flush=True)  # the parent notes the I/O the first batch cost
    sys.stdin.readline()
    t0 = time.monotonic()
    n, nbytes = 0, 0
    for batch in it:
        n += len(batch)
        nbytes += sum(batch)
        if time.monotonic() - t0 > seconds:
            break
    dt = time.monotonic() - t0
    print(json.dumps({"images": n, "bytes": nbytes, "seconds": dt, "first_batch": len(first),
                      "images_per_s": n / dt if dt else 0.0}))


# -- parent --------------------------------------------------------------------------------

def _convert(src: Path, dst: Path, fmt: str, workers: int, cold: bool = True) -> dict:
    shutil.rmtree(dst, ignore_errors=True)
    if cold:
        drop_caches()
    t0 = time.monotonic()
    r = subprocess.run([PY, "-m", "autotune", "convert", "-q", str(src), str(dst), "--format",
                        fmt, "--workers", str(workers), "--json", "-"], capture_output=True,
                       text=True, cwd=ROOT)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"convert failed: {r.stderr}")
    d = json.loads(r.stdout)
    return {"tool": f"autotune convert --format {fmt} --workers {workers}", "wall_s": wall,
            "seconds": d["seconds"], "samples": d["samples"], "source_bytes": d["read_bytes"],
            "output_bytes": d["output_bytes"], "shards": d["shards"]}


def _shardwriter(src: Path, dst: Path) -> dict:
    shutil.rmtree(dst, ignore_errors=True)
    drop_caches()
    t0 = time.monotonic()
    r = subprocess.run([*SELF, "_shardwriter", str(src), str(dst), str(64 << 20)],
                       capture_output=True, text=True, cwd=ROOT)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"ShardWriter failed: {r.stderr}")
    d = json.loads(r.stdout.strip().splitlines()[-1])
    base = {"wall_s": wall, "samples": d["samples"], "source_bytes": d["bytes"],
            "output_bytes": du(dst), "shards": len(list(dst.glob("*.tar")))}
    return [{"tool": "webdataset.ShardWriter (1 process), closed", "seconds": d["seconds"],
             **base},
            {"tool": "webdataset.ShardWriter (1 process), closed + sync",
             "seconds": d["seconds_synced"], **base}]


def _read(kind: str, path: Path, iops: int | None, seconds: float,
          cold: str = "drop_caches") -> dict:
    from autotune.emulate import IoThrottle

    if cold == "drop_caches":
        drop_caches()
    else:  # "data": file data evicted, directory and inode caches kept warm
        from autotune.cache import evict_files
        from autotune_converters.folder import FolderSource

        files = list(FolderSource(path).files())
        for f in files:
            f.stat()
        evict_files(files)
    # An effectively unlimited cap for the unthrottled case: the same cgroup, so the same
    # I/O accounting.
    with IoThrottle(path, read_iops=iops or 10_000_000, name="bench-convert") as cap:
        p = cap.popen([*SELF, "_read", kind, str(path), str(seconds)],
                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                      text=True, cwd=ROOT)
        s0, sf = start_reader(p, cap, kind)
        out, err = p.communicate(timeout=seconds * 10 + 300)
        s1 = cap.stats()
    if p.returncode != 0:
        raise SystemExit(f"read {kind} failed: {err[-2000:]}")
    d = json.loads(out.strip().splitlines()[-1])
    n = d["images"] + d["first_batch"]  # the I/O counts include the first batch
    ios, nbytes = s1.read_ios - s0.read_ios, s1.read_bytes - s0.read_bytes
    d.update(kind=kind + ("" if cold == "drop_caches" else " (inodes cached)"), cold=cold,
             cap_iops=iops, read_ios=ios, read_bytes=nbytes,
             ios_per_image=ios / n if n else 0.0, disk_bytes_per_image=nbytes / n if n else 0.0,
             first_batch_ios=sf.read_ios - s0.read_ios,
             first_batch_bytes=sf.read_bytes - s0.read_bytes,
             disk_iops=(s1.read_ios - sf.read_ios) / (d["seconds"] + 1e-9))
    return d


def _tiny_folder(root: Path, n: int) -> Path:
    """n tiny JPEGs in 100 classes (made once; ~700 bytes each)."""
    import io

    from PIL import Image

    if (root / ".complete").exists():
        return root
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (120, 30, 200)).save(buf, format="JPEG")
    data = buf.getvalue()
    for c in range(100):
        (root / f"c{c:03d}").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        with open(root / f"c{i % 100:03d}" / f"{i:07d}.jpg", "wb") as f:
            f.write(data)
    (root / ".complete").write_text("")
    return root


def _rss_main(src: Path, dst: Path, fmt: str, workers: int) -> dict:
    """Peak RSS of the converting process itself (wait4's rusage) and of its workers."""
    import psutil

    shutil.rmtree(dst, ignore_errors=True)
    pid = os.fork()
    if pid == 0:
        os.chdir(ROOT)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.execv(PY, [PY, "-m", "autotune", "convert", "-q", str(src), str(dst), "--format",
                      fmt, "--workers", str(workers)])
    worker_peak = 0
    proc = psutil.Process(pid)
    t0 = time.monotonic()
    while True:
        done, status, ru = os.wait4(pid, os.WNOHANG)
        if done:
            break
        try:
            for c in proc.children(recursive=True):
                try:
                    worker_peak = max(worker_peak, c.memory_info().rss)
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
        time.sleep(0.05)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"convert of {src} failed")
    return {"format": fmt, "workers": workers, "files": sum(1 for _ in src.rglob("*.jpg")),
            "wall_s": time.monotonic() - t0, "main_peak_rss": ru.ru_maxrss * 1024,
            "worker_peak_rss": worker_peak}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_shardwriter":
        _child_shardwriter(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "_read":
        _child_read(sys.argv[2], sys.argv[3], float(sys.argv[4]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="/work/data/ds20k")
    ap.add_argument("--work", default=None,
                    help="where outputs are written, this folder itself (same disk as the "
                         "dataset; default: a new folder under --tmp-dir)")
    ap.add_argument("--tmp-dir", default=None,
                    help="where the new output folder is made (default $TMPDIR, else /var/tmp)")
    ap.add_argument("--iops", type=int, default=300)
    ap.add_argument("--read-seconds", type=float, default=20.0)
    ap.add_argument("--skip-convert", action="store_true")
    ap.add_argument("--skip-read", action="store_true")
    ap.add_argument("--rss", action="store_true", help="also measure peak RSS at 20k/200k files")
    ap.add_argument("--keep", action="store_true", help="keep the outputs")
    ap.add_argument("--json", default=str(ROOT / "out" / "bench_convert.json"))
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_convert needs root (drop_caches, cgroup IOPS cap)", file=sys.stderr)
        return 2
    work = work_dir("bench_convert", a)
    if work is None:
        return 2
    src = Path(a.dataset)
    from autotune.blockdev import block_device_for

    out: dict = {"dataset": str(src), "cpus": os.cpu_count()}
    dev = block_device_for(src)
    if dev is not None:  # readahead decides what an mmap fault or a sequential read costs
        q = Path(f"/sys/dev/block/{dev.majmin}/queue")
        if not q.exists():
            q = Path(f"/sys/dev/block/{dev.majmin}/../queue")
        for k in ("read_ahead_kb", "max_sectors_kb", "rotational"):
            try:
                out[k] = int((q / k).read_text())
            except (OSError, ValueError):
                pass
    src_bytes = du(src)
    n_src = sum(1 for _ in src.rglob("*.jpg"))
    out["images"], out["source_bytes"] = n_src, src_bytes
    print(f"dataset {src}: {n_src} images, {src_bytes / 2**20:.0f} MiB, "
          f"mean {src_bytes / n_src / 1e3:.1f} KB; {os.cpu_count()} CPUs; device "
          f"read_ahead_kb={out.get('read_ahead_kb')} max_sectors_kb={out.get('max_sectors_kb')}"
          "\n", flush=True)

    if not a.skip_convert:
        rows = _shardwriter(src, work / "shardwriter")
        for fmt in ("wds", "lmdb"):
            for w in (1, 2):
                rows.append(_convert(src, work / f"{fmt}-w{w}", fmt, w))
        # The same conversions from a warm page cache: the CPU-bound rate, to show
        # whether the cold figures are bound by the source disk or by Python.
        for f in src.rglob("*.jpg"):
            f.read_bytes()
        for fmt in ("wds", "lmdb"):
            for w in (1, 2):
                r = _convert(src, work / f"{fmt}-w{w}-warm", fmt, w, cold=False)
                r["tool"] += " (warm source)"
                rows.append(r)
                shutil.rmtree(work / f"{fmt}-w{w}-warm", ignore_errors=True)
        out["convert"] = rows
        print("conversion (cold source unless said; seconds include the scan, shuffle, checks, "
              "fsync):")
        print("| tool | samples | seconds | images/s | MB/s | output | vs ShardWriter + sync |")
        print("|---|---|---|---|---|---|---|")
        base = rows[1]["samples"] / rows[1]["seconds"]
        for r in rows:
            ips = r["samples"] / r["seconds"]
            print(f"| {r['tool']} | {r['samples']} | {r['seconds']:.1f} | {ips:,.0f} | "
                  f"{r['source_bytes'] / 1e6 / r['seconds']:,.1f} | {r['shards']} files, "
                  f"{r['output_bytes'] / 2**20:,.0f} MiB | {ips / base:.2f}x |")
        print(flush=True)
        # Make sure the read targets exist even when shards were made by another run.
    for fmt in ("wds", "lmdb"):
        if not (work / f"{fmt}-w2" / "manifest.json").exists():
            _convert(src, work / f"{fmt}-w2", fmt, 2)

    if not a.skip_read:
        targets = [("folder", src, "drop_caches"), ("folder", src, "data"),
                   ("wds", work / "wds-w2", "drop_caches"),
                   ("lmdb-pread", work / "lmdb-w2", "drop_caches"),
                   ("lmdb-noreadahead", work / "lmdb-w2", "drop_caches"),
                   ("lmdb-mmap", work / "lmdb-w2", "drop_caches")]
        reads = []
        for iops in (None, a.iops):
            for kind, path, cold in targets:
                d = _read(kind, path, iops, a.read_seconds, cold)
                reads.append(d)
                print(f"  read {d['kind']:24s} cap={iops or '-':>5}: {d['images_per_s']:8.1f} "
                      f"img/s, {d['ios_per_image']:.2f} I/Os and "
                      f"{d['disk_bytes_per_image'] / 1e3:.0f} KB from disk per image "
                      f"({d['images']} images in {d['seconds']:.1f} s; first batch "
                      f"{d['first_batch_ios']} I/Os, {d['first_batch_bytes'] / 2**20:.1f} MiB)",
                      flush=True)
        out["read"] = reads
        print("\ncold reads (DataLoader, 2 workers, batch 16, bytes only; img/s excludes the "
              "first batch, I/Os and KB per image include it):")
        print(f"| source | unthrottled img/s | I/Os per img | {a.iops}-IOPS cap img/s | "
              "I/Os per img | KB from disk per img (cap) | first batch of 32 (cap) | "
              "vs folder (cap) |")
        print("|---|---|---|---|---|---|---|---|")
        by = {(d["kind"], d["cap_iops"]): d for d in reads}
        f_cap = by[("folder", a.iops)]["images_per_s"]
        for kind in dict.fromkeys(d["kind"] for d in reads):
            u, c = by[(kind, None)], by[(kind, a.iops)]
            print(f"| {kind} | {u['images_per_s']:,.0f} | {u['ios_per_image']:.2f} | "
                  f"{c['images_per_s']:,.1f} | {c['ios_per_image']:.2f} | "
                  f"{c['disk_bytes_per_image'] / 1e3:,.0f} | {c['first_batch_ios']} I/Os, "
                  f"{c['first_batch_bytes'] / 2**20:,.1f} MiB | {c['images_per_s'] / f_cap:.2f}x |")
        print(flush=True)

    if a.rss:
        rss = []
        for n in (20_000, 200_000):
            tiny = _tiny_folder(work / f"tiny{n // 1000}k", n)
            for fmt in ("wds", "lmdb"):
                d = _rss_main(tiny, work / f"tiny-out-{fmt}", fmt, 2)
                rss.append(d)
                print(f"  rss {n:>7} files {fmt:4s}: main {d['main_peak_rss'] / 2**20:.0f} MiB, "
                      f"workers {d['worker_peak_rss'] / 2**20:.0f} MiB, {d['wall_s']:.1f} s",
                      flush=True)
                shutil.rmtree(work / f"tiny-out-{fmt}", ignore_errors=True)
        out["rss"] = rss
        print("\n| files | format | peak RSS converter | peak RSS per worker | seconds |")
        print("|---|---|---|---|---|")
        for d in rss:
            print(f"| {d['files']:,} | {d['format']} | {d['main_peak_rss'] / 2**20:.0f} MiB | "
                  f"{d['worker_peak_rss'] / 2**20:.0f} MiB | {d['wall_s']:.1f} |")

    write_json(a.json, out)
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
