"""autotune against its peers, side by side in one run (issue 16): same files, same
machine, alternating rounds, medians.

1. Conversion, cold source, each tool timed as a whole process as the user waits for it
   (start, scan, write, final fsync of every output file): `autotune convert --format wds`
   and `--format lmdb` (default --workers), webdataset's `ShardWriter` (one process, as
   documented, seeded shuffle first as its docs advise for training shards), a plain LMDB
   bulk write (one process, ImageFolder order, `pickle.dumps((bytes, label))` values, one
   transaction per 1,000 puts), and `litdata.optimize` (2 workers, 64 MB chunks).
2. The decode ceiling: the same pipeline (preset transform, DataLoader with --workers
   workers, batch --batch) over encoded bytes held in memory (a random 2,000 of them).
3. Reading, decode included (the `resnet50` preset): autotune's WebDataset and LMDB readers,
   `webdataset.WebDataset` (shard shuffle and a 1,000-sample buffer, as ours), the usual
   LMDB idiom (`readahead=False`, `txn.get`, `pickle.loads`) on the plain bulk write's
   output, LitData's `StreamingDataset` on litdata.optimize's output, and the loose files
   (map-style, shuffled) - warm (the reader's files locked in the page cache, so that
   another user's drop_caches cannot make it partly cold), cold (drop_caches),
   and cold behind a --iops read-IOPS cap (a real cgroup: autotune.emulate.IoThrottle);
   plus bytes only (no decode), cold and unthrottled. Every reader runs in a fresh process
   in the same cgroup kind, whose own counters give the I/Os and bytes each image cost.
   The first batch (worker start-up) is excluded; a pass stops at the end of its epoch
   (a second epoch would be warm).
4. With --rss: peak RSS of `autotune convert` of 200,000 tiny files, both formats.

The peers install into the project's venv without touching torch (litdata's metadata pulls
torchvision, hence --no-deps; check with --dry-run first):

    .venv/bin/pip install --no-deps litdata lightning-utilities && .venv/bin/pip install boto3 requests

Conversions are also tabled per round: each LMDB conversion against that round's plain
LMDB write, with the load average as each started. `--baseline CHECKOUT` adds that
checkout's `convert --format lmdb` to every round (before and after a change, same run).
Only conversions, ours against the plain write, interleaved (litdata not needed then):

    .venv/bin/python -m scripts.bench_peers --dataset /var/tmp/ds20k --skip-read \
        --tools "format lmdb,plain LMDB" --rounds 5 [--baseline /path/to/old/checkout]

Needs root (drop_caches, the cgroup cap). Run it alone, and say how loaded the machine was:

    flock /tmp/autotune-bench.lock .venv/bin/python -m scripts.bench_peers \\
        --dataset /var/tmp/ds20k [--rounds 3] [--iops 300] [--read-seconds 12] [--rss] \\
        [--json out/bench_peers.json] [--md out/bench_peers.md]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import shutil
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from scripts._common import ROOT, drop_caches, du, loadavg, start_reader, work_dir, write_json

PY = sys.executable
SELF = [PY, "-m", "scripts.bench_peers"]   # its child modes, from ROOT
SHARD_BYTES = 64 << 20


# -- peers' conversions (child processes) ------------------------------------------------

def _image_folder(src: str) -> list[tuple[str, int]]:
    """(path, label) as torchvision's ImageFolder lists them: sorted classes, sorted files."""
    classes = sorted(e.name for e in os.scandir(src) if e.is_dir() and not e.name.startswith("."))
    out = []
    for label, c in enumerate(classes):
        for name in sorted(os.listdir(os.path.join(src, c))):
            out.append((os.path.join(src, c, name), label))
    return out


def _fsync_tree(dst: str) -> None:
    """The final sync a user's job needs before the data counts as written: every output
    file and directory fsynced (not os.sync(), which would also wait for other users)."""
    for d, _, files in os.walk(dst):
        for f in files:
            fd = os.open(os.path.join(d, f), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(fd)
        os.close(fd)


def _child_shardwriter(src: str, dst: str) -> None:
    import webdataset as wds

    files = _image_folder(src)
    random.Random(0).shuffle(files)  # training shards are written shuffled
    os.makedirs(dst, exist_ok=True)
    with wds.ShardWriter(os.path.join(dst, "shard-%06d.tar"), maxsize=SHARD_BYTES,
                         verbose=0) as sink:
        for i, (path, label) in enumerate(files):
            with open(path, "rb") as f:
                data = f.read()
            sink.write({"__key__": f"{i:08d}", "jpg": data, "cls": label})
    _fsync_tree(dst)


def _child_plain_lmdb(src: str, dst: str) -> None:
    import lmdb

    files = _image_folder(src)
    total = sum(os.path.getsize(p) for p, _ in files)
    env = lmdb.open(dst, map_size=2 * total + (1 << 30))
    txn = env.begin(write=True)
    for i, (path, label) in enumerate(files):
        with open(path, "rb") as f:
            data = f.read()
        txn.put(b"%08d" % i, pickle.dumps((data, label), protocol=pickle.HIGHEST_PROTOCOL))
        if (i + 1) % 1000 == 0:
            txn.commit()
            txn = env.begin(write=True)
    txn.commit()
    env.sync(True)
    env.close()
    _fsync_tree(dst)


def _litdata_item(item: tuple[str, int]) -> dict[str, Any]:
    path, label = item
    with open(path, "rb") as f:
        return {"image": f.read(), "label": label}


def _child_litdata(src: str, dst: str) -> None:
    from litdata import optimize

    optimize(fn=_litdata_item, inputs=_image_folder(src), output_dir=dst, num_workers=2,
             chunk_bytes="64MB", verbose=False)
    _fsync_tree(dst)


# -- readers (child processes) ------------------------------------------------------------

class _MapBytes:
    """Map-style dataset over a source's read(i) -> (bytes, label), transform applied."""

    def __init__(self, read, n: int, transform) -> None:
        self.read, self.n, self.transform = read, n, transform

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        data, label = self.read(i)
        return (self.transform(data) if self.transform else len(data)), label


class _LmdbIdiom:
    """The usual LMDB reader: env opened lazily per process, readahead=False, get + unpickle."""

    def __init__(self, path: str) -> None:
        import lmdb

        self.path = path
        env = lmdb.open(path, readonly=True, lock=False, readahead=False, meminit=False)
        self.n = env.stat()["entries"]
        env.close()
        self.env = None

    def read(self, i: int):
        import lmdb

        if self.env is None:
            self.env = lmdb.open(self.path, readonly=True, lock=False, readahead=False,
                                 meminit=False)
        with self.env.begin(write=False) as txn:
            return pickle.loads(txn.get(b"%08d" % i))

    def __getstate__(self):
        d = self.__dict__.copy()
        d["env"] = None
        return d


def _collate_bytes(batch):
    return [x if isinstance(x, int) else len(x) for x, _ in batch], [y for _, y in batch]


class _LitTransform:
    def __init__(self, transform) -> None:
        self.transform = transform

    def __call__(self, item):
        data = item["image"]
        return (self.transform(data) if self.transform else len(data)), int(item["label"])


def _loader(kind: str, path: str, preset: str, batch: int, workers: int):
    import torch.utils.data

    transform = None
    if preset != "none":
        from autotune.data.presets import load_preset
        from autotune.data.transforms import build_transform

        transform = build_transform(load_preset(preset).transform)
    collate = _collate_bytes if transform is None else None
    kw: dict[str, Any] = dict(batch_size=batch, num_workers=workers, collate_fn=collate)
    g = torch.Generator().manual_seed(0)
    if kind == "autotune-wds":
        from autotune_converters import WdsSource

        src = WdsSource(path)
        ds = src.dataset(transform, seed=0, shuffle_buffer=1000)
        return torch.utils.data.DataLoader(ds, **kw), len(src)
    if kind == "webdataset":
        import webdataset as wds

        urls = sorted(str(p) for p in Path(path).glob("shard-*.tar"))
        ds = (wds.WebDataset(urls, shardshuffle=len(urls), seed=0, empty_check=False)
              .shuffle(1000).to_tuple("jpg;jpeg;png;webp", "cls")
              .map_tuple(transform if transform else len, int))
        n = json.loads((Path(path) / "manifest.json").read_text())["num_samples"]
        return torch.utils.data.DataLoader(ds, **kw), n
    if kind == "litdata":
        from litdata import StreamingDataLoader, StreamingDataset

        ds = StreamingDataset(input_dir=path, shuffle=True, seed=0,
                              transform=_LitTransform(transform))
        return StreamingDataLoader(ds, **kw), len(ds)
    if kind == "memory":  # the decode ceiling: the same pipeline from encoded bytes in RAM
        from autotune_converters.folder import FolderSource
        from autotune_converters.source import MemorySource

        src = MemorySource(FolderSource(path), 2000, seed=0)
        ds = _MapBytes(src.read, len(src), transform)

        class _Forever(torch.utils.data.Sampler):
            def __iter__(self):
                r = random.Random(0)
                while True:
                    yield r.randrange(len(src))

        return torch.utils.data.DataLoader(ds, sampler=_Forever(), **kw), 10**9
    if kind == "autotune-lmdb":
        from autotune_converters import LmdbSource

        src = LmdbSource(path)
        ds = _MapBytes(src.read, len(src), transform)
    elif kind == "lmdb-idiom":
        idiom = _LmdbIdiom(path)
        ds = _MapBytes(idiom.read, idiom.n, transform)
    elif kind == "folder":
        from autotune_converters.folder import FolderSource

        src = FolderSource(path)
        ds = _MapBytes(src.read, len(src), transform)
    else:
        raise SystemExit(f"unknown reader {kind}")
    return torch.utils.data.DataLoader(ds, shuffle=True, generator=g, **kw), len(ds)


def _tree_cpu() -> float:
    """CPU seconds (user + system) of this process, its live children (the DataLoader
    workers) and the children it reaped (workers that ended with the epoch: without them
    a pass that ends in the window came out negative): images per CPU second is the
    figure another user's load does not move."""
    import resource

    import psutil

    me = psutil.Process()
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = reaped.ru_utime + reaped.ru_stime
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def _child_read(kind: str, path: str, preset: str, seconds: float, batch: int,
                workers: int) -> None:
    loader, _ = _loader(kind, path, preset, batch, workers)
    it = iter(loader)  # starts the workers
    print("READY", flush=True)  # the parent reads the cgroup's counters now
    sys.stdin.readline()
    first = next(it)
    print("FIRST", flush=True)
    sys.stdin.readline()
    c0 = _tree_cpu()
    t0 = time.monotonic()
    n = 0
    ended = False
    while True:
        try:
            b = next(it)
        except StopIteration:
            ended = True
            break
        n += len(b[1])
        if time.monotonic() - t0 > seconds:
            break
    dt = time.monotonic() - t0
    cpu = _tree_cpu() - c0
    del it
    print(json.dumps({"images": n, "seconds": dt, "first_batch": len(first[1]), "cpu_s": cpu,
                      "images_per_cpu_s": n / cpu if cpu else 0.0,
                      "epoch_ended": ended, "images_per_s": n / dt if dt else 0.0}))


# -- parent -------------------------------------------------------------------------------

class _Pinned:
    """The files' pages read into the page cache and locked there (mmap with MAP_POPULATE |
    MAP_LOCKED, then mlock) for a warm measurement: on a shared machine another user's
    drop_caches would otherwise make a "warm" run partly cold (seen: 1 I/O per image)."""

    def __init__(self, files: list[Path]) -> None:
        import ctypes

        self.files = files
        self.libc = ctypes.CDLL("libc.so.6", use_errno=True)
        self.libc.mmap.restype = ctypes.c_void_p
        self.libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                   ctypes.c_int, ctypes.c_long]
        self.libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.maps: list[tuple[int, int]] = []

    def __enter__(self) -> _Pinned:
        import ctypes

        for f in self.files:
            size = f.stat().st_size
            if not size:
                continue
            fd = os.open(f, os.O_RDONLY)
            try:  # PROT_READ, MAP_SHARED | MAP_POPULATE | MAP_LOCKED
                addr = self.libc.mmap(None, size, 1, 0x01 | 0x8000 | 0x2000, fd, 0)
            finally:
                os.close(fd)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), f"{f}: cannot map it to pin it in memory")
            self.maps.append((addr, size))
            if self.libc.mlock(addr, size) != 0:
                raise OSError(ctypes.get_errno(), f"{f}: cannot lock it in memory")
        return self

    def __exit__(self, *exc: object) -> None:
        for addr, size in self.maps:
            self.libc.munmap(addr, size)
        self.maps = []


def _files(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()]


def _run_timed(cmd: list[str], root: Path = ROOT) -> dict[str, Any]:
    """Wall seconds, CPU seconds and peak RSS of one whole process, as the user waits.

    Through /usr/bin/time: Linux carries a process's RSS high-water mark across exec, so
    a child forked from this (larger) process would report at least this process's RSS."""
    import tempfile

    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        full = ["/usr/bin/time", "-f", "%M %U %S", "-o", tf.name, *cmd]
        t0 = time.monotonic()
        p = subprocess.run(full, cwd=root, capture_output=True,
                           env={**os.environ, "PYTHONPATH": str(root)})
        wall = time.monotonic() - t0
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): "
                             f"{p.stderr.decode(errors='replace')[-3000:]}")
        kb, user, sys_s = tf.read().split()[-3:]
    # CPU of the process and every descendant it reaped (its workers): the cost that
    # another user's load on the machine does not change, unlike the wall time.
    return {"wall_s": wall, "peak_rss": int(kb) * 1024, "cpu_s": float(user) + float(sys_s)}


CONVERTERS = {
    "autotune convert --format wds": lambda s, d: [PY, "-m", "autotune", "convert", "-q", s, d,
                                                   "--format", "wds"],
    "autotune convert --format lmdb": lambda s, d: [PY, "-m", "autotune", "convert", "-q", s, d,
                                                    "--format", "lmdb"],
    "webdataset ShardWriter (1 process)": lambda s, d: [*SELF, "_shardwriter", s, d],
    "plain LMDB bulk write (txn per 1,000 puts)": lambda s, d: [*SELF, "_plain_lmdb", s, d],
    "litdata.optimize (2 workers)": lambda s, d: [*SELF, "_litdata", s, d],
}


BASELINE = "autotune convert --format lmdb, --baseline checkout"


def _disk_seq_write(work: Path, size_mib: int = 2048) -> dict[str, Any]:
    """The disk's own sequential write, the limit of any conversion onto it: fio writing a
    scratch file of its own in `work` (1 MiB blocks, through the page cache as the tools
    write, fsync at the end: the tools' whole-process figures include their final fsync
    too), deleted after. {"mib_per_s", "size_mib", "load"}, or {"error"} without fio."""
    scratch = work / "fio-seq-write.scratch"  # ours alone: fio overwrites what it is given
    load = loadavg()
    drop_caches()
    try:
        r = subprocess.run(["fio", "--name=seqwrite", f"--filename={scratch}", "--rw=write",
                            "--bs=1M", f"--size={size_mib}M", "--ioengine=psync",
                            "--end_fsync=1", "--output-format=json"],
                           capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": f"fio did not run: {e}"}
    finally:
        scratch.unlink(missing_ok=True)
    if r.returncode != 0:
        return {"error": f"fio exited {r.returncode}: {r.stderr.strip()[-300:]}"}
    job = json.loads(r.stdout)["jobs"][0]
    # bw_bytes over the job's runtime, which includes the end fsync
    return {"mib_per_s": job["write"]["bw_bytes"] / 2**20, "size_mib": size_mib, "load": load}


def _convert_round(src: Path, work: Path, tools: list[str], n: int, src_bytes: int,
                   keep: dict[str, Path], rnd: int = 0,
                   baseline: str | None = None) -> list[dict[str, Any]]:
    rows = []
    for tool in tools:
        dst = work / ("conv-" + "".join(c if c.isalnum() else "-" for c in tool)[:40])
        shutil.rmtree(dst, ignore_errors=True)
        drop_caches()
        load = loadavg()
        if tool == BASELINE:  # the same command run from another checkout (before a change)
            r = _run_timed(CONVERTERS["autotune convert --format lmdb"](str(src), str(dst)),
                           root=Path(baseline))
        else:
            r = _run_timed(CONVERTERS[tool](str(src), str(dst)))
        r.update(tool=tool, images_per_s=n / r["wall_s"], mb_per_s=src_bytes / 1e6 / r["wall_s"],
                 output_bytes=du(dst), round=rnd, load=load)
        rows.append(r)
        print(f"  convert {tool:45s} {r['wall_s']:6.2f} s  {r['images_per_s']:7,.0f} img/s  "
              f"CPU {r['cpu_s']:6.1f} s  peak RSS {r['peak_rss'] / 2**20:5.0f} MiB  "
              f"load {load}", flush=True)
        keep_as = keep.get(tool)
        if keep_as is not None:
            shutil.rmtree(keep_as, ignore_errors=True)
            dst.rename(keep_as)
        else:
            shutil.rmtree(dst, ignore_errors=True)
    return rows


def _read(kind: str, path: Path, preset: str, cond: str, a: argparse.Namespace,
          files: list[Path]) -> dict[str, Any]:
    from autotune.emulate import IoThrottle

    import contextlib

    pin = _Pinned(files) if cond == "warm" else contextlib.nullcontext()
    if cond != "warm":
        drop_caches()
    load = loadavg()
    iops = a.iops if cond == "cold-capped" else 10_000_000  # same cgroup kind either way
    with pin, IoThrottle(path, read_iops=iops, name="bench-peers") as cap:
        p = cap.popen([*SELF, "_read", kind, str(path), preset, str(a.read_seconds),
                       str(a.batch), str(a.workers)], stdin=subprocess.PIPE,
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                      env={**os.environ, "PYTHONPATH": str(ROOT)})
        s0, s1 = start_reader(p, cap, kind)
        out, err = p.communicate(timeout=a.read_seconds * 10 + 600)
        s2 = cap.stats()
    if p.returncode != 0:
        raise SystemExit(f"read {kind} failed: {err[-3000:]}")
    d = json.loads(out.strip().splitlines()[-1])
    n = d["images"]
    d.update(kind=kind, preset=preset, cond=cond, cap_iops=a.iops if cond == "cold-capped" else None,
             ios_per_image=(s2.read_ios - s1.read_ios) / n if n else 0.0,
             disk_kb_per_image=(s2.read_bytes - s1.read_bytes) / 1e3 / n if n else 0.0,
             first_batch_ios=s1.read_ios - s0.read_ios, load=load,
             read_ahead_kb=int(_read_ahead_file(path).read_text()) if path.exists() else None)
    return d


READERS = ("autotune-wds", "autotune-lmdb", "webdataset", "lmdb-idiom", "litdata", "folder")
CONDS = ("warm", "cold", "cold-capped", "bytes")


def _read_ahead_file(path: Path) -> Path:
    from autotune.blockdev import block_device_for

    dev = block_device_for(str(path))
    if dev is None:
        raise SystemExit(f"{path}: not on a block device; its read-ahead cannot be set")
    return Path(f"/sys/block/{dev.name}/queue/read_ahead_kb")


def _set_read_ahead(stack: ExitStack, path: Path, kb: int) -> None:
    """The read-ahead of `path`'s disk set to `kb` until `stack` closes (then restored)."""
    f = _read_ahead_file(path)
    old = f.read_text().strip()
    f.write_text(str(kb))
    stack.callback(f.write_text, old)


def _read_rounds(stack: ExitStack, a: argparse.Namespace, work: Path, src: Path,
                 src_files: list[Path], presets: list[str], readers: list[str]
                 ) -> list[dict[str, Any]]:
    """Every (reader, preset, condition) of the plan, --rounds times, the order reversed
    every other round; with --own-disk each reader's files are read from a loop disk of
    their own (copied once), whose read-ahead --read-ahead-kb sets."""
    from autotune.emulate.setups import own_disk, scratch_dir

    targets = {"autotune-wds": work / "wds", "autotune-lmdb": work / "lmdb",
               "webdataset": work / "wds", "lmdb-idiom": work / "plain-lmdb",
               "litdata": work / "litdata", "folder": src}
    unknown = [r for r in readers if r not in (*READERS, "memory")]
    conds = [c for c in a.conds.split(",") if c] or list(CONDS)
    if unknown or any(c not in CONDS for c in conds):
        raise SystemExit(f"bench_peers: unknown reader or condition in --readers "
                         f"{a.readers!r} --conds {a.conds!r}; readers: memory, "
                         f"{', '.join(READERS)}; conditions: {', '.join(CONDS)}")
    if readers:
        targets = {k: v for k, v in targets.items() if k in readers}
    if a.own_disk:
        disks = scratch_dir("bench-peers-disks-", a.tmp_dir)
        stack.callback(shutil.rmtree, disks, True)
        copies: dict[Path, Path] = {}
        for k, v in targets.items():
            if v not in copies:
                (disks / k).mkdir()
                copies[v] = own_disk(stack, v, disks / k)
                if a.read_ahead_kb is not None:
                    _set_read_ahead(stack, copies[v], a.read_ahead_kb)
            targets[k] = copies[v]
    files = {k: _files(v) if v != src else src_files for k, v in targets.items()}
    plan = [("memory", src, p, "warm") for p in presets if not readers or "memory" in readers]
    for cond in ("warm", "cold", "cold-capped"):
        if cond in conds:
            plan += [(k, v, "resnet50", cond) for k, v in targets.items()]
    if "bytes" in conds:
        plan += [(k, v, "none", "cold") for k, v in targets.items()]
    reads: list[dict[str, Any]] = []
    for r in range(a.rounds):
        print(f"read round {r + 1}/{a.rounds} (load {loadavg()})", flush=True)
        order = plan if r % 2 == 0 else plan[::-1]
        for kind, path, preset, cond in order:
            d = _read(kind, path, preset, cond, a, files.get(kind, []))
            d["round"] = r
            reads.append(d)
            print(f"  {kind:14s} {preset:10s} {cond:12s} {d['images_per_s']:8,.0f} img/s  "
                  f"{d['images_per_cpu_s']:6,.0f} img/CPU-s  "
                  f"{d['ios_per_image']:6.2f} I/Os, {d['disk_kb_per_image']:6.0f} KB/img "
                  f"from disk, read-ahead {d['read_ahead_kb']} KB, load {d['load']}"
                  f"{' (epoch ended)' if d['epoch_ended'] else ''}", flush=True)
    return reads


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")



def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        mode, args = sys.argv[1], sys.argv[2:]
        if mode == "_shardwriter":
            _child_shardwriter(*args)
        elif mode == "_plain_lmdb":
            _child_plain_lmdb(*args)
        elif mode == "_litdata":
            _child_litdata(*args)
        elif mode == "_read":
            _child_read(args[0], args[1], args[2], float(args[3]), int(args[4]), int(args[5]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="/var/tmp/ds20k")
    ap.add_argument("--work", default=None,
                    help="outputs, this folder itself (same disk as the dataset, not RAM-backed; "
                         "default: a new folder under --tmp-dir)")
    ap.add_argument("--tmp-dir", default=None,
                    help="where the new output folder is made (default $TMPDIR, else /var/tmp)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iops", type=int, default=300)
    ap.add_argument("--read-seconds", type=float, default=12.0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers of every reader")
    ap.add_argument("--skip-convert", action="store_true", help="reuse the outputs in --work")
    ap.add_argument("--skip-read", action="store_true")
    ap.add_argument("--tools", default="", help="comma-separated substrings: convert only "
                    "the matching tools (development)")
    ap.add_argument("--readers", default="", help="comma-separated reader kinds to read "
                    "with (default all: memory, autotune-wds, autotune-lmdb, webdataset, "
                    "lmdb-idiom, litdata, folder)")
    ap.add_argument("--conds", default="", help="comma-separated read conditions (default "
                    "all: warm, cold, cold-capped, bytes)")
    ap.add_argument("--own-disk", action="store_true", help="read each reader's files from "
                    "a copy on a loop disk of its own (its read-ahead can then be set "
                    "without touching the machine's disk)")
    ap.add_argument("--read-ahead-kb", type=int, default=None, help="the read disk's "
                    "read_ahead_kb while reading (restored after; needs --own-disk): 128 is "
                    "Linux's default for most disks")
    ap.add_argument("--rss", action="store_true", help="peak RSS at 200,000 tiny files")
    ap.add_argument("--baseline", default=None, help="another checkout (its root, with the "
                    "autotune_converters and autotune_base links) whose `convert --format "
                    "lmdb` runs as one more tool in every round: before and after a change")
    ap.add_argument("--json", default=str(ROOT / "out" / "bench_peers.json"))
    ap.add_argument("--md", default=str(ROOT / "out" / "bench_peers.md"))
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_peers needs root (drop_caches, the cgroup IOPS cap)", file=sys.stderr)
        return 2
    if a.read_ahead_kb is not None and not a.own_disk:
        print("bench_peers: --read-ahead-kb needs --own-disk (it would change the read-ahead "
              "of the machine's own disk for every other job)", file=sys.stderr)
        return 2
    from autotune.data.presets import list_presets

    import importlib.util

    readers = [r for r in a.readers.split(",") if r]
    wants_litdata = not a.skip_convert and (not a.tools or "litdata" in a.tools) \
        or not a.skip_read and (not readers or "litdata" in readers)
    if wants_litdata and importlib.util.find_spec("litdata") is None:  # see _run_timed
        print("bench_peers: litdata is not installed; install it as the module doc says",
              file=sys.stderr)
        return 2
    work = work_dir("bench_peers", a)
    if work is None:
        return 2
    src = Path(a.dataset)
    src_files = [p for p in src.rglob("*") if p.is_file() and not p.name.startswith(".")]
    n_src, src_bytes = len(src_files), sum(p.stat().st_size for p in src_files)
    out: dict[str, Any] = {"dataset": str(src), "images": n_src, "source_bytes": src_bytes,
                           "mean_kb": src_bytes / n_src / 1e3, "cpus": os.cpu_count(),
                           "rounds": a.rounds, "iops_cap": a.iops, "batch": a.batch,
                           "workers": a.workers, "read_seconds": a.read_seconds,
                           "load_before": loadavg(), "presets": list_presets()}
    print(f"dataset {src}: {n_src} images, mean {out['mean_kb']:.1f} KB; {os.cpu_count()} CPUs; "
          f"load {out['load_before']}", flush=True)
    outs = {"autotune convert --format wds": work / "wds",
            "autotune convert --format lmdb": work / "lmdb",
            "plain LMDB bulk write (txn per 1,000 puts)": work / "plain-lmdb",
            "litdata.optimize (2 workers)": work / "litdata",
            "webdataset ShardWriter (1 process)": None}

    if not a.skip_convert:
        out["disk_write"] = _disk_seq_write(work)
        print(f"disk's sequential write (fio, 1 MiB blocks, end fsync): {out['disk_write']}",
              flush=True)
        tools = [t for t in CONVERTERS
                 if not a.tools or any(x and x in t for x in a.tools.split(","))]
        if a.baseline:
            tools.append(BASELINE)
        conv: list[dict[str, Any]] = []
        for r in range(a.rounds):
            order = tools[r % len(tools):] + tools[:r % len(tools)]  # alternate who goes first
            print(f"conversion round {r + 1}/{a.rounds} (load {loadavg()})", flush=True)
            keep = outs if r == a.rounds - 1 else {}
            conv += _convert_round(src, work, order, n_src, src_bytes, keep, r, a.baseline)
        out["convert"] = conv
    else:
        out["convert"] = json.loads(Path(a.json).read_text()).get("convert", []) \
            if Path(a.json).exists() else []

    presets = ["resnet50"] + [p for p in out["presets"] if p != "resnet50" and "fast" in p]
    reads: list[dict[str, Any]] = []
    if not a.skip_read:
        with ExitStack() as stack:
            reads = _read_rounds(stack, a, work, src, src_files, presets, readers)
        out["read"] = reads
        out["read_ahead_kb"] = sorted({d["read_ahead_kb"] for d in reads
                                       if d.get("read_ahead_kb") is not None})

    if a.rss:
        from scripts.bench_convert import _rss_main, _tiny_folder

        tiny = _tiny_folder(work / "tiny200k", 200_000)
        rss = []
        for fmt in ("wds", "lmdb"):
            d = _rss_main(tiny, work / f"tiny-out-{fmt}", fmt, a.workers)
            rss.append(d)
            shutil.rmtree(work / f"tiny-out-{fmt}", ignore_errors=True)
            print(f"  rss 200,000 files {fmt}: main {d['main_peak_rss'] / 2**20:.0f} MiB, "
                  f"workers {d['worker_peak_rss'] / 2**20:.0f} MiB, {d['wall_s']:.1f} s",
                  flush=True)
        out["rss"] = rss
    out["load_after"] = loadavg()
    md = _markdown(out, presets, a)
    print("\n" + md)
    write_json(a.json, out)
    Path(a.md).write_text(md)
    return 0


def _per_round(conv: list[dict[str, Any]]) -> list[str]:
    """Each round's LMDB conversions against that round's plain LMDB write, with the load
    average when each started (rounds rotate which tool goes first)."""
    plain_t = "plain LMDB bulk write (txn per 1,000 puts)"
    ours = [t for t in ("autotune convert --format lmdb", BASELINE, "autotune convert --format wds")
            if any(r["tool"] == t for r in conv)]
    rounds = sorted({r.get("round", 0) for r in conv})
    if not ours or not any(r["tool"] == plain_t for r in conv):
        return []
    L = ["Per round, against that round's plain LMDB write (wall seconds; load average, "
         "1/5/15 min, as each started):\n",
         "| round | plain LMDB | " + " | ".join(ours) + " |",
         "|---|---|" + "---|" * len(ours)]
    for k in rounds:
        row = {r["tool"]: r for r in conv if r.get("round", 0) == k}
        p = row.get(plain_t)
        if p is None:
            continue
        cells = [f"{p['wall_s']:.2f} s (load {p.get('load', '?')})"]
        for t in ours:
            r = row.get(t)
            cells.append(f"{r['wall_s']:.2f} s: **{p['wall_s'] / r['wall_s']:.2f}x** "
                         f"(load {r.get('load', '?')})" if r else "-")
        L.append(f"| {k + 1} | " + " | ".join(cells) + " |")
    L.append("")
    return L


def _capped_rounds(reads: list[dict[str, Any]], a: argparse.Namespace) -> list[str]:
    """Each round's capped, decoded read of our shards against webdataset's over the same
    shards: the comparison must hold in every round, not only in the median."""
    def one(kind: str, r: int) -> dict[str, Any] | None:
        return next((d for d in reads if (d["kind"], d["preset"], d["cond"], d["round"])
                     == (kind, "resnet50", "cold-capped", r)), None)

    rounds = sorted({d["round"] for d in reads})
    pairs = [(r, one("autotune-wds", r), one("webdataset", r)) for r in rounds]
    pairs = [(r, o, w) for r, o, w in pairs if o and w]
    if not pairs:
        return []
    L = [f"Cold behind {a.iops} read IOPS, decode, each round (images/s; I/Os per image; "
         "KB a disk read; load average as each started):\n",
         "| round | autotune WdsSource | webdataset.WebDataset | ours / theirs |",
         "|---|---|---|---|"]

    def cell(d: dict[str, Any]) -> str:
        kb = d["disk_kb_per_image"] / d["ios_per_image"] if d["ios_per_image"] else 0.0
        return (f"{d['images_per_s']:,.0f} ({d['ios_per_image']:.3f} I/Os, {kb:,.0f} KB a "
                f"read; load {d.get('load', '?')})")

    for r, o, w in pairs:
        L.append(f"| {r + 1} | {cell(o)} | {cell(w)} | "
                 f"**{o['images_per_s'] / w['images_per_s']:.2f}x** |")
    L.append("")
    return L


def _markdown(out: dict[str, Any], presets: list[str], a: argparse.Namespace) -> str:
    L: list[str] = []
    conv = out.get("convert", [])
    med_c: dict[str, float] = {}
    for tool in [*CONVERTERS, BASELINE]:
        xs = [r["images_per_s"] for r in conv if r["tool"] == tool]
        if xs:
            med_c[tool] = _med(xs)
    if med_c:
        plain = med_c.get("plain LMDB bulk write (txn per 1,000 puts)")
        L.append(f"Conversion of {out['images']:,} JPEGs (mean {out['mean_kb']:.1f} KB), cold "
                 "source, whole process (start, scan, write, final fsync), median of "
                 f"{out['rounds']} alternating rounds:\n")
        disk = (out.get("disk_write") or {}).get("mib_per_s")
        if disk:
            L.append(f"The limit: the disk's own sequential write, {disk:,.0f} MiB/s (fio, "
                     f"{out['disk_write']['size_mib']:,} MiB in 1 MiB blocks through the page "
                     "cache, fsync at the end, load "
                     f"{out['disk_write']['load']}); the output column is each tool's output "
                     "bytes over its whole-process time, as a share of it.\n")
        L.append("| tool | images/s | MB/s (source) | output MiB/s (of the disk's write) | "
                 "seconds (rounds) | CPU seconds | peak RSS (main process) | vs plain LMDB |")
        L.append("|---|---|---|---|---|---|---|---|")
        for tool, ips in med_c.items():
            rows = [r for r in conv if r["tool"] == tool]
            each = " / ".join(f"{r['wall_s']:.1f}" for r in rows)
            o = _med([r["output_bytes"] / 2**20 / r["wall_s"] for r in rows])
            share = f" ({o / disk:.0%})" if disk else ""
            L.append(f"| {tool} | {ips:,.0f} | {_med([r['mb_per_s'] for r in rows]):,.0f} | "
                     f"{o:,.0f}{share} | {_med([r['wall_s'] for r in rows]):.2f} ({each}) | "
                     f"{_med([r.get('cpu_s', float('nan')) for r in rows]):.1f} | "
                     f"{_med([r['peak_rss'] for r in rows]) / 2**20:,.0f} MiB | "
                     + (f"{ips / plain:.2f}x |" if plain else "|"))
        L.append("")
        L.extend(_per_round(conv))
    reads = out.get("read", [])
    if reads:
        def m(kind: str, preset: str, cond: str) -> float:
            return _med([d["images_per_s"] for d in reads
                         if (d["kind"], d["preset"], d["cond"]) == (kind, preset, cond)])

        def ios(kind: str, preset: str, cond: str) -> float:
            return _med([d["ios_per_image"] for d in reads
                         if (d["kind"], d["preset"], d["cond"]) == (kind, preset, cond)])

        def cpu(kind: str, preset: str, cond: str) -> float:
            return _med([d.get("images_per_cpu_s", float("nan")) for d in reads
                         if (d["kind"], d["preset"], d["cond"]) == (kind, preset, cond)])

        ceil = {p: m("memory", p, "warm") for p in presets}
        seen = {d["kind"] for d in reads}
        L.append(f"Reading, DataLoader with {a.workers} workers, batch {a.batch}, first batch "
                 f"excluded, images/s (median of {out['rounds']}); decode = the resnet50 "
                 f"preset; cap = {a.iops} read IOPS (cgroup); I/Os per image from the "
                 "cgroup's counters:\n")
        L.append(f"| reader | warm, decode | cold, decode | cold + {a.iops} IOPS, decode "
                 "(I/Os per img) | cold, bytes only (I/Os per img) | warm / decode ceiling | "
                 "warm images per CPU-second / ceiling's |")
        L.append("|---|---|---|---|---|---|---|")
        names = {"autotune-wds": "autotune WdsSource (shards)",
                 "autotune-lmdb": "autotune LmdbSource (pread)",
                 "webdataset": "webdataset.WebDataset (same shards)",
                 "lmdb-idiom": "LMDB idiom, readahead=False (plain bulk write's LMDB)",
                 "litdata": "litdata StreamingDataset",
                 "folder": "loose files (map-style)"}
        for kind, label in names.items():
            if kind not in seen:
                continue
            w = m(kind, "resnet50", "warm")
            L.append(f"| {label} | {w:,.0f} | {m(kind, 'resnet50', 'cold'):,.0f} | "
                     f"{m(kind, 'resnet50', 'cold-capped'):,.0f} "
                     f"({ios(kind, 'resnet50', 'cold-capped'):.2f}) | "
                     f"{m(kind, 'none', 'cold'):,.0f} ({ios(kind, 'none', 'cold'):.2f}) | "
                     f"{w / ceil['resnet50']:.2f} | "
                     f"{cpu(kind, 'resnet50', 'warm'):,.0f} / {cpu('memory', 'resnet50', 'warm'):,.0f}"
                     f" = {cpu(kind, 'resnet50', 'warm') / cpu('memory', 'resnet50', 'warm'):.2f} |")
        L.append("")
        L.extend(_capped_rounds(reads, a))
        if "memory" not in seen:
            ceil = {p: float("nan") for p in presets}
        L.append("Decode ceiling (the same pipeline over 2,000 encoded images in memory): "
                 + "; ".join(f"{p} {v:,.0f} images/s" for p, v in ceil.items())
                 + (f"; {presets[1]} / resnet50 = {ceil[presets[1]] / ceil['resnet50']:.2f}x"
                    if len(presets) > 1 else "; no fast preset exists yet in configs/presets")
                 + ".\n")
        # targets
        t: list[str] = []
        if med_c:
            plain = med_c.get("plain LMDB bulk write (txn per 1,000 puts)", float("nan"))
            for fmt in ("wds", "lmdb"):
                v = med_c.get(f"autotune convert --format {fmt}", float("nan"))
                t.append(f"conversion {fmt} >= 1.0x plain LMDB: {v / plain:.2f}x "
                         f"({'met' if v >= plain else 'NOT met'})")
        for kind in ("autotune-wds", "autotune-lmdb"):
            w = m(kind, "resnet50", "warm")
            cw, cc = cpu(kind, "resnet50", "warm"), cpu("memory", "resnet50", "warm")
            t.append(f"{kind} warm >= 0.95 decode ceiling: {w / ceil['resnet50']:.2f} "
                     f"({'met' if w >= 0.95 * ceil['resnet50'] else 'NOT met'}; per CPU-second "
                     f"{cw / cc:.2f})")
            b, f = m(kind, "none", "cold"), m("folder", "none", "cold")
            t.append(f"{kind} bytes cold >= loose files: {b / f:.2f}x "
                     f"({'met' if b >= f else 'NOT met'})")
            c, w2 = m(kind, "resnet50", "cold-capped"), m(kind, "resnet50", "warm")
            t.append(f"{kind} capped >= 0.95 of its warm: {c / w2:.2f} "
                     f"({'met' if c >= 0.95 * w2 else 'NOT met'})")
        c, p = m("autotune-wds", "resnet50", "cold-capped"), m("webdataset", "resnet50", "cold-capped")
        t.append(f"autotune-wds capped >= 1.0x webdataset.WebDataset capped: {c / p:.2f}x "
                 f"({'met' if c >= p else 'NOT met'})")
        t = [x for x in t if "nan" not in x]  # a figure this run did not measure
        out["targets"] = t
        if t:
            L.append("Targets: " + "; ".join(t) + ".\n")
    for d in out.get("rss", []):
        L.append(f"Peak RSS, `autotune convert --format {d['format']}` of {d['files']:,} tiny "
                 f"files: converter {d['main_peak_rss'] / 2**20:.0f} MiB, each worker "
                 f"{d['worker_peak_rss'] / 2**20:.0f} MiB.")
    L.append(f"\nLoad average before/after: {out['load_before']} / {out.get('load_after')}.")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
