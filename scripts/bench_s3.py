"""Issue 24's "Done when" figures for object storage, in one run (not a test: timings).

    PYTHONPATH=. .venv/bin/python -m scripts.bench_s3 [--images 4000] [--delay-ms 25] \\
        [--json out/bench_s3.json] [--no-peers] [--only peers|gap] [--pipeline resnet50|none]
        [--readers ours,webdataset] [--cpus '0,1;1']

Starts SeaweedFS (`weed mini`, the s3 extra) in a temporary directory, uploads --images
generated JPEGs (autotune.synth.make_image_folder, about 80 KB each) to a fresh bucket as
s3://BUCKET/train/CLASS/NAME.jpg, and puts the delaying proxy (autotune.emulate.delayproxy,
its own process: --delay-ms each way, so a GET's first byte waits at least twice that) in
front of it. Everything below goes through the proxy:

1. probe vs plain: at 1, 4, 16, 64 in flight, the probe's GET loop
   (autotune.probe.objstore.measure_objects, what `autotune probe s3://` runs) and a plain
   ThreadPoolExecutor boto3 GET loop (a child process that imports no autotune), on the
   same objects (the probe's own seeded pick), warm; GETs/s and the ratio.
2. the closed loop: `autotune search s3://BUCKET/train --convert auto --stage-dir LOCAL
   --compute-ms 250 --batch-size 64` (AWS_ENDPOINT_URL = the proxy; --warm: no
   drop_caches on a machine others time tests on), a small space and few trials; its
   JSON's before (verdict, evidence, images/s, AU), converted, staged, after.
3. readers, the converted shards uploaded to s3://BUCKET/train-wds: our S3 WebDataset
   reader vs webdataset with a `pipe:curl` of a presigned GET per shard,
   s3torchconnector's S3IterableDataset (its endpoint; skipped where not installed), and
   LitData's and Mosaic Streaming's S3 readers on the same images in their own formats
   (scripts/bench_s3_peers.py: converted locally, uploaded beside ours), each in a fresh
   process with the same DataLoader workers and batch, bytes only and with the --pipeline
   preset's transform (`resnet50`) in the workers, --rounds interleaved rounds, median.
   `--only peers` runs this section alone (no 1., no 2.: it converts from the bucket).
4. `--only gap` (instead of 1.-3.): only --readers (ours, webdataset) with the --pipeline
   transform, each pass's process pinned to each of the --cpus sets, with every worker's
   run-queue wait and CPU time (schedstat) beside its samples/s (scripts/bench_s3_gap.py).

The third reader is optional: `.venv/bin/python -m pip install s3torchconnector` (1.5.0
was measured; it pulls no torch of its own where torch is installed). webdataset and curl
are used as installed.

Prints a table, writes --json. Note the machine's load beside the figures (printed).
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from scripts._common import ROOT, utc_date, write_json

KEY, SECRET = "bench-s3-key", "bench-s3-secret"
BUCKET = "bench-s3"
PY = sys.executable


def _boto(endpoint: str, pool: int = 64):  # noqa: ANN202 (a boto3 client)
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY,
                        aws_secret_access_key=SECRET, region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}, max_pool_connections=pool))


# -- children (each a fresh process) -----------------------------------------------------

def child_plain(endpoint: str, keys_file: str, c: int) -> dict[str, Any]:
    """The plain loop: boto3 only, c threads sharing one client, every key GET once."""
    keys = json.loads(Path(keys_file).read_text())
    client = _boto(endpoint)
    client.list_buckets()  # connected before the clock, as the probe's client is
    from scripts.s3_probe_check import timed_gets  # the same plain loop (boto3 only)

    return timed_gets(client, BUCKET, keys, c)


def child_probe(endpoint: str, url: str, c: int, k: int) -> dict[str, Any]:
    """The probe's GET loop at one concurrency over its seeded pick of k objects."""
    from autotune.probe.objstore import measure_objects
    from autotune_converters.objstore import S3Config, Store

    obj = measure_objects(url, store=Store(S3Config(endpoint)), concurrency=[c], seconds=3600,
                          max_objects=k, cold=False, ranges=False)
    p = obj.by_concurrency[0]
    return {"gets": p.gets, "gets_per_s": p.gets_per_s, "mib_per_s": p.mib_per_s,
            "first_byte_p50_ms": p.first_byte_p50_ms, "errors": p.errors,
            "list_keys_per_s": obj.list_keys_per_s, "mean_object_bytes": obj.mean_object_bytes}


def _timed(loader: Any, workers: dict[int, dict] | None = None) -> dict[str, Any]:
    """One pass: samples/s and MiB/s over the whole pass (from iter(loader), worker start
    included, as an epoch costs a user) and after the first item (steady reading).
    `workers` (pid -> figures) collects each worker's samples from the batches' tags."""
    n = nb = n1 = 0
    t_first = None
    main0 = _main_sched() if workers is not None else None
    t0 = time.perf_counter()
    for k, b, *tag in loader:
        if t_first is None:
            t_first, n1 = time.perf_counter(), k
        n += k
        nb += b
        if tag and workers is not None:
            wid, pid, tt, ot = tag
            w = workers.setdefault(pid, {"id": wid, "samples": 0, "torch_threads": tt,
                                         "os_threads": ot})
            w["samples"] += k
            w["os_threads"] = max(w["os_threads"], ot)
    t1 = time.perf_counter()
    t_first = t_first or t1
    if main0 is not None:
        main1 = _main_sched()
        workers[0] = {"cpu_s": round(main1[0] - main0[0], 3),  # pid 0: this process
                      "wait_s": round(main1[1] - main0[1], 3)}
    return {"samples": n, "samples_per_s": n / (t1 - t0), "mib_per_s": nb / (t1 - t0) / 2**20,
            "seconds": round(t1 - t0, 3), "first_item_s": round(t_first - t0, 3),
            "steady_samples_per_s": (n - n1) / max(t1 - t_first, 1e-9)}


def _spread(worker_id: int) -> None:
    """worker_init_fn of the ours-spread diagnostic: worker i on the i-th CPU (mod) of
    the set its process may use."""
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, [cpus[worker_id % len(cpus)]])


def _main_sched() -> tuple[float, float]:
    """This process's CPU and run-queue wait so far, all threads (s)."""
    pid = os.getpid()
    cpu = wait = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            r, w = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[:2]
        except (OSError, ValueError):
            continue
        cpu, wait = cpu + int(r) / 1e9, wait + int(w) / 1e9
    return cpu, wait


def _pipeline(name: str) -> Any:
    """None (bytes only) or autotune's preset transform of that name (e.g. `resnet50`)."""
    if name == "bytes":
        return None
    from autotune.data.presets import load_preset
    from autotune.data.transforms import build_transform

    return build_transform(load_preset(name).transform)


def _size(x: Any) -> int:
    return len(x) if isinstance(x, (bytes, bytearray, memoryview)) else int(x.nbytes)


def _counted(batch: list) -> tuple[int, int]:  # noqa: ANN001 (collate: samples, bytes)
    """In the worker: the batch's samples and bytes (image bytes, or the tensors' bytes
    with a pipeline) and the worker's tag (scripts/bench_s3_gap.worker_tag: which worker,
    its torch and OS threads); only these counts cross to the main process, for every
    reader."""
    from scripts.bench_s3_gap import worker_tag

    return (len(batch), sum(_size(x) for x in batch), *worker_tag())


def _largest_bytes(s: dict) -> bytes:  # noqa: ANN001 (a webdataset sample: the image)
    return max((v for k, v in s.items() if not k.startswith("__") and isinstance(v, bytes)),
               key=len)


def child_read(kind: str, endpoint: str, prefix: str, workers: int, batch: int,
               pipeline: str = "bytes", cpus: str | None = None) -> dict:
    """Read every shard under s3://BUCKET/PREFIX once with `workers` workers: the images'
    bytes only, or through `pipeline` (an autotune preset's transform) in the workers.
    With `cpus` ('0,1'), this process (so its workers and their children) is pinned to
    those CPUs and each worker's run-queue wait is recorded (scripts/bench_s3_gap)."""
    if cpus:
        from scripts import bench_s3_gap as gap

        os.sched_setaffinity(0, gap.parse_cpus(cpus)[0])
        info: dict[int, dict] = {}
        sampler = gap.TreeSampler().start()
        t0 = gap.cpu_times()
        res = _read_pass(kind, endpoint, prefix, workers, batch, pipeline, info)
        sampler.stop()
        sampler.sample()  # the children that are still there
        res["cpu_busy"] = gap.busy_share(t0, gap.cpu_times(), gap.parse_cpus(cpus)[0])
        res["main_process"] = info.pop(0, {})  # over the pass, the sampler included
        res["worker_figures"] = gap.worker_figures(sampler.threads, info, res["seconds"])
        res["sampler_reads"] = sampler.reads
        res["placements"] = dict(sorted(sampler.placements.items(), key=lambda kv: -kv[1]))
        return res
    return _read_pass(kind, endpoint, prefix, workers, batch, pipeline, None)


def _read_pass(kind: str, endpoint: str, prefix: str, workers: int, batch: int,
               pipeline: str, info: dict[int, dict] | None) -> dict:
    import torch

    transform = _pipeline(pipeline)
    if kind in ("ours", "ours-spread", "ours-sleep"):
        # ours-spread and ours-sleep are diagnostics of `--only gap` (scripts/bench_s3_gap):
        # each worker pinned to one CPU of the set in turn; a 1 ms sleep before each sample
        from autotune_converters.wds.bucket import S3WdsSource

        if kind == "ours-sleep":
            inner = transform

            def transform(data: bytes) -> Any:  # noqa: F811 (the diagnostic's wrapper)
                time.sleep(0.001)
                return data if inner is None else inner(data)

        os.environ["AWS_ENDPOINT_URL"] = endpoint
        ds = S3WdsSource(f"s3://{BUCKET}/{prefix}").dataset(transform, shuffle=False)
        loader = torch.utils.data.DataLoader(  # (transform(bytes), label) -> the first
            ds, num_workers=workers, batch_size=batch,
            collate_fn=lambda b: _counted([x[0] for x in b]),
            worker_init_fn=_spread if kind == "ours-spread" else None)
        return _timed(loader, info)
    if kind == "webdataset":
        import webdataset as wds

        client = _boto(endpoint)
        keys = sorted(o["Key"] for o in client.list_objects_v2(
            Bucket=BUCKET, Prefix=prefix + "/")["Contents"] if o["Key"].endswith(".tar"))
        urls = [f"pipe:curl -s -f '{client.generate_presigned_url('get_object', Params={'Bucket': BUCKET, 'Key': k}, ExpiresIn=3600)}'"
                for k in keys]
        ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).map(
            lambda s: _largest_bytes(s) if transform is None else transform(_largest_bytes(s)))
        loader = torch.utils.data.DataLoader(ds, num_workers=workers, batch_size=batch,
                                             collate_fn=_counted)
        return _timed(loader, info)
    if kind in ("litdata", "mosaic"):
        from scripts.bench_s3_peers import dataset

        import shutil

        ds = dataset(kind, endpoint, BUCKET, prefix, batch, transform)
        loader = torch.utils.data.DataLoader(ds, num_workers=workers, batch_size=batch,
                                             collate_fn=_counted)
        try:
            return _timed(loader)
        finally:
            shutil.rmtree(ds.cache, ignore_errors=True)  # its downloaded shards
    return _s3torchconnector(endpoint, prefix, workers, transform)


def _s3torchconnector(endpoint: str, prefix: str, workers: int, transform: Any) -> dict:
    """s3torchconnector's S3IterableDataset, one item per shard (its unit): the shard's
    images, each through `transform` when given, counted in the worker."""
    import tarfile

    import torch
    from s3torchconnector import S3ClientConfig, S3IterableDataset

    def members(reader: Any) -> tuple[int, int]:
        if not reader.key.endswith(".tar"):
            return 0, 0
        n = nb = 0
        with tarfile.open(fileobj=reader, mode="r|") as tf:
            for m in tf:
                f = tf.extractfile(m) if m.isfile() else None
                if f is not None and m.name.rsplit(".", 1)[-1] in ("jpg", "jpeg", "png"):
                    data = f.read()
                    n, nb = n + 1, nb + _size(data if transform is None else transform(data))
        return n, nb

    ds = S3IterableDataset.from_prefix(
        f"s3://{BUCKET}/{prefix}/", region="us-east-1", endpoint=endpoint,
        s3client_config=S3ClientConfig(force_path_style=True), enable_sharding=True,
        transform=members)
    # one item per shard: its first item is a whole shard, not a batch of 64
    loader = torch.utils.data.DataLoader(ds, num_workers=workers, batch_size=None,
                                         collate_fn=lambda counts: counts)
    return _timed(loader)


def _run_child(args: list[str], timeout: float = 900,
               module: str = "scripts.bench_s3") -> dict[str, Any]:
    """`python -m MODULE --child ARGS...` (this script's, or bench_s3_clients'): its JSON
    line, or {"error": the last line of its stderr}."""
    p = subprocess.run([PY, "-m", module, "--child", *args], capture_output=True, text=True,
                       timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1][:300]}
    return json.loads(p.stdout.strip().splitlines()[-1])


# -- the run ------------------------------------------------------------------------------

def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _upload(endpoint: str, root: Path, prefix: str) -> int:
    client = _boto(endpoint)
    files = [p for p in sorted(root.rglob("*")) if p.is_file()]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda p: client.put_object(
            Bucket=BUCKET, Key=f"{prefix}/{p.relative_to(root).as_posix()}",
            Body=p.read_bytes()), files))
    return len(files)


def _start_proxy(endpoint: str, delay_s: float) -> tuple[subprocess.Popen, str]:
    u = urlsplit(endpoint)
    p = subprocess.Popen([PY, "-m", "autotune.emulate.delayproxy", "--target",
                          f"{u.hostname}:{u.port}", "--delay", str(delay_s)],
                         stdout=subprocess.PIPE, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    addr = p.stdout.readline().strip()  # type: ignore[union-attr]
    return p, f"http://{addr}"


def _keys(via: str) -> list[str]:
    """Every object key under s3://BUCKET/train/."""
    client = _boto(via)
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="train/"):
        keys += [o["Key"] for o in page.get("Contents", []) if not o["Key"].endswith("/")]
    return keys


def probe_vs_plain(via: str, levels: list[int], tmp: Path) -> list[dict[str, Any]]:
    """Each level: the probe's seeded pick (its own rule: Random(0).sample of the listing
    without the manifest), then the plain loop on the same keys."""
    keys = _keys(via)
    rows = []
    for c in levels:
        k = min(len(keys), max(100, 60 * c))  # about 10 s a level at 50 ms first byte
        pick = random.Random(0).sample(keys, k)
        kf = tmp / f"keys-{c}.json"
        kf.write_text(json.dumps(pick))
        pr = _run_child(["probe", via, f"s3://{BUCKET}/train", str(c), str(k)])
        pl = _run_child(["plain", via, str(kf), str(c)])
        ratio = (pr["gets_per_s"] / pl["gets_per_s"]) if "error" not in pr | pl else None
        rows.append({"concurrency": c, "objects": k, "probe": pr, "plain": pl, "ratio": ratio})
        print(f"  {c:>2} in flight: probe {pr.get('gets_per_s', 0):.1f}, plain "
              f"{pl.get('gets_per_s', 0):.1f} GETs/s", flush=True)
    return rows


def _side(d: dict[str, Any] | None) -> dict[str, Any] | None:
    if not d:
        return None
    pick = lambda t: t and {k: t.get(k) for k in ("config", "images_per_s", "au")}  # noqa: E731
    v = d.get("verdict") or {}
    return {"verdict": v.get("bottleneck"), "summary": v.get("summary"),
            "evidence": v.get("evidence"), "best": pick(d.get("best")),
            "recommended": pick(d.get("recommended")), "baseline": pick(d.get("baseline")),
            "baseline_confirmed": pick(d.get("baseline_confirmed")),
            "ceilings": d.get("ceilings"), "dataset": d.get("dataset")}


def closed_loop(via: str, tmp: Path, a: argparse.Namespace) -> dict[str, Any]:
    out, stage = tmp / "search-out", tmp / "stage"
    cmd = [PY, "-m", "autotune", "search", f"s3://{BUCKET}/train", "--convert", "auto",
           "--stage-dir", str(stage), "--compute-ms", "250", "--batch-size", "64",
           "--space", a.space, "--trials", str(a.trials), "--confirm", str(a.confirm),
           *(["--seconds", str(a.seconds)] if a.seconds else []), "--warm", "--out", str(out), "-q",
           "--json", str(tmp / "search.json")]
    shown = " ".join(["autotune", *cmd[3:]]).replace(str(tmp), "$TMP")
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.search_timeout,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "AWS_ENDPOINT_URL": via})
    res: dict[str, Any] = {"command": f"AWS_ENDPOINT_URL=<proxy> {shown}",
                           "exit": p.returncode, "seconds": round(time.perf_counter() - t0, 1),
                           "stdout_tail": p.stdout[-3000:], "stderr_tail": p.stderr[-2000:]}
    f = tmp / "search.json"
    if not f.is_file():
        return res
    d = json.loads(f.read_text())
    res.update(before=_side(d.get("before", d)), after=_side(d.get("after")),
               converted=d.get("converted"), staged=d.get("staged"),
               decision=d.get("decision"), gain=d.get("gain"))
    return res


def _converted(via: str, endpoint: str, tmp: Path, staged: dict | None
               ) -> tuple[Path, str, int] | dict:
    """Our WebDataset shards uploaded to s3://BUCKET/train-wds: (dir, how, objects), or
    {"skipped": why}."""
    sdir = Path(staged["dir"]) if staged and staged.get("dir") else None
    how = "the loop's staged conversion"
    if sdir is None or not (sdir / "manifest.json").is_file():
        # The loop did not convert (its verdict was not storage): convert from the bucket
        # here, as the loop would have (WebDataset, convert's defaults), to compare readers.
        sdir, how = tmp / "converted-wds", "autotune convert s3://BUCKET/train DIR --format wds"
        p = subprocess.run([PY, "-m", "autotune", "convert", f"s3://{BUCKET}/train", str(sdir),
                            "--format", "wds", "--workers", "2", "-q"], capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": str(ROOT),
                                           "AWS_ENDPOINT_URL": via})
        if p.returncode != 0:
            return {"skipped": f"convert failed: {p.stderr.strip()[-300:]}"}
    return sdir, how, _upload(endpoint, sdir, "train-wds")


def peers(via: str, endpoint: str, tmp: Path, staged: dict | None, a: argparse.Namespace) -> dict:
    conv = _converted(via, endpoint, tmp, staged)
    if isinstance(conv, dict):
        return conv
    sdir, how, n = conv
    kinds, prefix, notes = _readers(endpoint, tmp)
    pipelines = ["bytes", *([a.pipeline] if a.pipeline != "none" else [])]
    rounds: dict[str, list[dict]] = {f"{k}|{p}": [] for p in pipelines for k in kinds}
    for r in range(a.rounds):
        order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]  # interleaved, rotated
        for p in pipelines:
            for k in order:
                rounds[f"{k}|{p}"].append(_run_child(["read", k, via, prefix[k],
                                                      str(a.read_workers), "64", p]))
                print(f"  round {r + 1} {k} {p}: {rounds[f'{k}|{p}'][-1]}", flush=True)
    med = {}
    for key, rs in rounds.items():
        ok = [x["samples_per_s"] for x in rs if "samples_per_s" in x]
        mib = [x["mib_per_s"] for x in rs if "mib_per_s" in x]
        st = [x["steady_samples_per_s"] for x in rs if "steady_samples_per_s" in x]
        first = [x["first_item_s"] for x in rs if "first_item_s" in x]
        med[key] = {"median_samples_per_s": statistics.median(ok) if ok else None,
                    "median_steady_samples_per_s": statistics.median(st) if st else None,
                    "median_mib_per_s": statistics.median(mib) if mib else None,
                    "median_first_item_s": statistics.median(first) if first else None,
                    "samples": [x.get("samples") for x in rs],
                    "errors": [x["error"] for x in rs if "error" in x]}
    shards = json.loads((sdir / "manifest.json").read_text()).get("shards", [])
    return {"shards_from": how, "objects_uploaded": n, "shards": len(shards),
            "workers": a.read_workers, "batch": 64, "pipelines": pipelines, "notes": notes,
            "rounds": rounds, "median": med}


def _gap(via: str, endpoint: str, tmp: Path, a: argparse.Namespace, servers: list[int]
         ) -> dict:
    """`--only gap`: our shards converted and uploaded as for `--only peers`, then only
    --readers, pinned to each of --cpus (scripts/bench_s3_gap); `servers`: the proxy's
    and SeaweedFS's pids, whose CPU and wait each pass also records."""
    from scripts.bench_s3_gap import gap

    conv = _converted(via, endpoint, tmp, None)
    if isinstance(conv, dict):
        return conv
    return {"objects_uploaded": conv[2], **gap(_run_child, via, "train-wds", a, servers)}


def _readers(endpoint: str, tmp: Path) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """The readers measured here, the prefix each reads, and how each was pointed at the
    proxy (or why it is not measured). LitData and Mosaic Streaming get the same images
    converted into their own formats (bench_s3_peers.prepare), uploaded beside ours."""
    from scripts import bench_s3_peers

    kinds = ["ours", "webdataset"]
    prefix = {"ours": "train-wds", "webdataset": "train-wds", "s3torchconnector": "train-wds"}
    notes = {"ours": "AWS_ENDPOINT_URL", "webdataset": "pipe:curl of a presigned GET URL"}
    try:
        import s3torchconnector  # noqa: F401
        kinds.append("s3torchconnector")
        notes["s3torchconnector"] = "S3IterableDataset.from_prefix(endpoint=...)"
    except ImportError:
        notes["s3torchconnector"] = "not installed"
    how = {"litdata": "StreamingDataset(storage_options={'endpoint_url': ...}), through "
                      "boto3 (its obstore path refuses http://)",
           "mosaic": "S3_ENDPOINT_URL"}
    for k in bench_s3_peers.PEERS:
        why = bench_s3_peers.available(k)
        if why is None:
            try:
                out = bench_s3_peers.prepare(k, tmp / "train", tmp / f"peer-{k}")
                prefix[k] = f"train-{k}"
                _upload(endpoint, out, prefix[k])
                kinds.append(k)
                notes[k] = how[k]
                continue
            except Exception as e:  # noqa: BLE001 (the reason goes into the table)
                why = f"conversion failed ({type(e).__name__}: {e})"[:200]
        notes[k] = why
        print(f"  {k}: {why}", flush=True)
    return kinds, prefix, notes


def _table(res: dict[str, Any]) -> None:
    print(f"\n{res['images']} images, proxy {res['delay_ms']:g} ms each way; load before: "
          f"{res['uptime_before']}; after: {res['uptime_after']}")
    if res.get("probe_vs_plain"):
        print(f"{'in flight':>9} | {'objects':>7} | {'probe GETs/s':>12} | {'plain GETs/s':>12} | "
              f"ratio | 1st byte p50 ms (probe, plain)")
    for r in res.get("probe_vs_plain") or []:
        p, q = r["probe"], r["plain"]
        print(f"{r['concurrency']:>9} | {r['objects']:>7} | {p.get('gets_per_s', 0):>12.1f} | "
              f"{q.get('gets_per_s', 0):>12.1f} | {r['ratio'] or 0:.2f} | "
              f"{p.get('first_byte_p50_ms', 0):.0f}, {q.get('first_byte_p50_ms', 0):.0f}")
    lp = res.get("loop") or {}
    if not lp:
        return _readers_table(res)
    for side in ("before", "after"):
        s = lp.get(side)
        if s:
            print(f"{side}: verdict {s['verdict']}; best {s['best']}; baseline {s['baseline']}")
    print(f"converted: {bool(lp.get('converted'))}; staged: {bool(lp.get('staged'))}; "
          f"exit {lp.get('exit')}, {lp.get('seconds')} s")
    _readers_table(res)


def _readers_table(res: dict[str, Any]) -> None:
    pe = res.get("peers") or {}
    if pe.get("median"):
        print(f"\nreaders, {pe['workers']} workers, batch {pe['batch']}, medians of the rounds:")
        print(f"{'reader':>16} | {'pipeline':>8} | {'samples/s':>9} | {'MiB/s':>6} | "
              f"{'1st item s':>10} | {'after 1st':>9} | endpoint given as")
    for key, m in (pe.get("median") or {}).items():
        k, p = key.split("|")
        print(f"{k:>16} | {p:>8} | {m['median_samples_per_s'] or 0:9.0f} | "
              f"{(m['median_mib_per_s'] or 0) if p == 'bytes' else 0:6.0f} | "
              f"{m['median_first_item_s'] or 0:10.2f} | "
              f"{m['median_steady_samples_per_s'] or 0:9.0f} | {pe['notes'].get(k, '')}"
              + (f" ERRORS: {m['errors'][0]}" if m["errors"] else ""))
    for k, why in (pe.get("notes") or {}).items():
        if not any(key.startswith(k + "|") for key in pe.get("median") or {}):
            print(f"{k:>16} | not measured: {why}")


def _child(kind: str, args: list[str]) -> int:
    """`--child KIND ARGS...`: one measurement in this fresh process; its JSON on stdout."""
    os.environ.update(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET)
    if kind == "plain":
        r = child_plain(args[0], args[1], int(args[2]))
    elif kind == "probe":
        r = child_probe(args[0], args[1], int(args[2]), int(args[3]))
    else:
        r = child_read(args[0], args[1], args[2], int(args[3]), int(args[4]),
                       args[5] if len(args) > 5 else "bytes", args[6] if len(args) > 6 else None)
    print(json.dumps(r))
    return 0


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        return _child(sys.argv[2], sys.argv[3:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=4000)
    ap.add_argument("--delay-ms", type=float, default=25.0, help="proxy delay, each way")
    ap.add_argument("--levels", default="1,4,16,64")
    ap.add_argument("--space", default="small")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--confirm", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=None,
                    help="search's window per trial (default: search's own, from the step)")
    ap.add_argument("--search-timeout", type=float, default=1200)
    ap.add_argument("--read-workers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--only", choices=["peers", "gap"], default=None,
                    help="run only this section (peers: section 3, no probe loop, no search; "
                         "gap: --readers pinned to --cpus, each worker's run-queue wait, "
                         "scripts/bench_s3_gap.py)")
    ap.add_argument("--readers", default="ours,webdataset",
                    help="--only gap: the readers (also the diagnostics ours-spread, ours-sleep)")
    ap.add_argument("--cpus", default="0,1;1",
                    help="--only gap: CPU sets to pin each reading process to, ';' between")
    ap.add_argument("--pipeline", default="resnet50",
                    help="a preset whose transform every reader also runs ('none': bytes only)")
    ap.add_argument("--no-search", action="store_true")
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args()
    os.environ.update(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET)
    from autotune.emulate.seaweed import SeaweedServer
    from autotune.synth import make_image_folder

    res: dict[str, Any] = {"date": utc_date(),
                           "images": a.images, "delay_ms": a.delay_ms,
                           "uptime_before": _uptime(), "cores": os.cpu_count()}
    print(f"load: {res['uptime_before']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-s3-", dir="/var/tmp") as td:
        tmp = Path(td)
        t0 = time.perf_counter()
        syn = make_image_folder(tmp / "train", a.images, 10, seed=1, workers=2)
        res["mean_image_bytes"] = getattr(syn, "bytes", 0) / max(1, a.images)
        server = SeaweedServer(tmp / "weed")
        with server as endpoint:
            _boto(endpoint).create_bucket(Bucket=BUCKET)
            res["uploaded"] = _upload(endpoint, tmp / "train", "train")
            print(f"made and uploaded {res['uploaded']} images in "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
            proxy, via = _start_proxy(endpoint, a.delay_ms / 1000)
            try:
                if a.only is None:
                    res["probe_vs_plain"] = probe_vs_plain(via, [int(x) for x in
                                                                 a.levels.split(",")], tmp)
                if not a.no_search and a.only is None:
                    res["loop"] = closed_loop(via, tmp, a)
                    print(f"search: exit {res['loop']['exit']} in {res['loop']['seconds']} s",
                          flush=True)
                if a.only == "gap":
                    res["gap"] = _gap(via, endpoint, tmp, a,
                                      [proxy.pid, *([server.proc.pid] if server.proc else [])])
                elif not a.no_peers:
                    res["peers"] = peers(via, endpoint, tmp, (res.get("loop") or {})
                                         .get("staged"), a)
            finally:
                proxy.terminate()
                proxy.wait(10)
    res["uptime_after"] = _uptime()
    if "gap" in res:
        from scripts.bench_s3_gap import table

        print(f"\nload before: {res['uptime_before']}; after: {res['uptime_after']}")
        table(res["gap"]) if "passes" in res["gap"] else print(res["gap"])
    else:
        _table(res)
    if a.json:
        write_json(a.json, res, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
