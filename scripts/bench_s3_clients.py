"""Which S3 client should the readers use? boto3, obstore and s3fs, measured alike (not a
test: timings).

    PYTHONPATH=. .venv/bin/python -m scripts.bench_s3_clients [--images 2600] \\
        [--delay-ms 25] [--levels 1,16,64] [--rounds 3] [--json out/bench_s3_clients.json]

The set-up is scripts/bench_s3.py's, through its own helpers: SeaweedFS (`weed mini`) in a
temporary directory, --images generated JPEGs (about 80 KB each) in a fresh bucket, and
the delay proxy (its own process, --delay-ms each way: a GET's first byte waits at least
twice that) in front of it. Every GET goes through the proxy. With --netcap RATE, the
server runs in a network namespace of its own behind a `tc tbf` cap of RATE on a veth
pair (autotune.emulate.netcap, root only), and the proxy in front of that.

Each client runs in a fresh process per round, --rounds interleaved (rotated) rounds; the
table shows the median of the rounds. In each process:

- import + client construction: seconds from the first import of the client's package to
  a constructed client (the process has imported nothing else heavy);
- at each level, c threads sharing one client GET every key of that level's seeded pick
  once (the same keys for every client in a round): GETs/s, first-byte p50 (the call
  that returns with the response's headers; s3fs's `cat_file` only returns the body, so
  its whole-object p50 stands in, marked), whole-object p50;
- CPU seconds per 1,000 GETs: the process's own user + system CPU (getrusage: every
  thread, the client's native runtime included) over the level, per 1,000 GETs. That is
  what each DataLoader worker pays to read.

Fork safety, once per client in a fresh process: a client is made and used, then the
process forks; the child GETs with the inherited client (10 s alarm) and with one made
after the fork.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import signal
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from scripts import bench_s3  # the set-up's helpers: server, upload, proxy, keys, children
from scripts._common import utc_date, write_json

BUCKET = bench_s3.BUCKET
CLIENTS = ("boto3", "obstore", "s3fs")


# -- the clients: make(endpoint) -> get(key) -> (first_byte_s, nbytes) --------------------

def make(kind: str, endpoint: str) -> Any:
    """A GET function of `kind`'s client (constructed here, timed by the caller)."""
    if kind == "boto3":
        client = bench_s3._boto(endpoint)

        def get(key: str) -> tuple[float, int]:
            t0 = time.perf_counter()
            r = client.get_object(Bucket=BUCKET, Key=key)
            return time.perf_counter() - t0, len(r["Body"].read())
        return get
    if kind == "obstore":
        import obstore
        from obstore.store import S3Store

        store = S3Store(BUCKET, endpoint=endpoint, access_key_id=bench_s3.KEY,
                        secret_access_key=bench_s3.SECRET, region="us-east-1",
                        virtual_hosted_style_request=False,
                        client_options={"allow_http": True})

        def get(key: str) -> tuple[float, int]:
            t0 = time.perf_counter()
            r = obstore.get(store, key)
            return time.perf_counter() - t0, len(r.bytes())
        return get
    import s3fs

    fs = s3fs.S3FileSystem(key=bench_s3.KEY, secret=bench_s3.SECRET, use_listings_cache=False,
                           client_kwargs={"endpoint_url": endpoint, "region_name": "us-east-1"},
                           config_kwargs={"s3": {"addressing_style": "path"},
                                          "max_pool_connections": 64})

    def get(key: str) -> tuple[float, int]:
        t0 = time.perf_counter()
        n = len(fs.cat_file(f"{BUCKET}/{key}"))
        return time.perf_counter() - t0, n  # whole object: cat_file has no headers-in point
    return get


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _pct50(xs: list[float]) -> float:
    return 1000 * sorted(xs)[len(xs) // 2] if xs else 0.0


def child_run(kind: str, endpoint: str, keys_file: str) -> dict[str, Any]:
    """One client in this fresh process: import+construction, then each level."""
    t0 = time.perf_counter()
    get = make(kind, endpoint)
    setup_s = time.perf_counter() - t0
    levels: dict[str, list[str]] = json.loads(Path(keys_file).read_text())
    get(levels["warm"][0])  # connected before the clock (as the probe's client is)
    out: dict[str, Any] = {"setup_s": setup_s, "levels": {}}
    for c, keys in levels.items():
        if c == "warm":
            continue
        cpu0, t1 = _cpu(), time.perf_counter()
        with ThreadPoolExecutor(int(c)) as pool:
            got = list(pool.map(get, keys))
        el, cpu = time.perf_counter() - t1, _cpu() - cpu0
        out["levels"][c] = {"gets": len(got), "gets_per_s": len(got) / el,
                            "first_byte_p50_ms": _pct50([f for f, _ in got]),
                            "cpu_s_per_1000": 1000 * cpu / len(got),
                            "bytes": sum(n for _, n in got)}
    return out


def child_fork(kind: str, endpoint: str, key: str) -> dict[str, str]:
    """Use a client, fork; in the child GET with the inherited one, then with a new one."""
    get = make(kind, endpoint)
    get(key)
    res = {}
    for how in ("inherited", "made after fork"):
        pid = os.fork()
        if pid == 0:  # the child: exit 0 ok, 1 error, killed by the alarm: hung
            # The default action, not a Python handler: a call blocked in native code
            # never returns to the interpreter to run one.
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(10)
            try:
                (get if how == "inherited" else make(kind, endpoint))(key)
                os._exit(0)
            except BaseException:  # noqa: BLE001 (reported as the exit code)
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        res[how] = {0: "ok", 1: "error", -signal.SIGALRM: "hung (10 s)"}.get(code, f"exit {code}")
    return res


# -- the run ------------------------------------------------------------------------------

def _child(args: list[str]) -> dict[str, Any]:
    return bench_s3._run_child(args, module="scripts.bench_s3_clients")


def rounds(via: str, levels: list[int], tmp: Path, a: argparse.Namespace) -> dict[str, list]:
    keys = bench_s3._keys(via)
    runs: dict[str, list] = {k: [] for k in a.clients}
    for r in range(a.rounds):
        rng = random.Random(r)
        pick = {str(c): rng.sample(keys, min(len(keys), max(100, 40 * c))) for c in levels}
        pick["warm"] = [keys[0]]
        kf = tmp / f"keys-{r}.json"
        kf.write_text(json.dumps(pick))
        order = a.clients[r % len(a.clients):] + a.clients[:r % len(a.clients)]
        for k in order:
            runs[k].append(_child(["run", k, via, str(kf)]))
            print(f"  round {r + 1} {k}: {_brief(runs[k][-1])}", flush=True)
    return runs


def _brief(d: dict[str, Any]) -> str:
    if "error" in d:
        return d["error"]
    return ", ".join(f"{c}: {v['gets_per_s']:.0f} GETs/s {v['cpu_s_per_1000']:.2f} CPU s/1000"
                     for c, v in d["levels"].items())


def medians(runs: dict[str, list], levels: list[int]) -> dict[str, dict[str, Any]]:
    med: dict[str, dict[str, Any]] = {}
    for k, rs in runs.items():
        ok = [x for x in rs if "levels" in x]
        m: dict[str, Any] = {"rounds_ok": len(ok), "errors": [x["error"] for x in rs
                                                              if "error" in x]}
        if ok:
            m["setup_s"] = statistics.median(x["setup_s"] for x in ok)
            for c in map(str, levels):
                m[c] = {f: statistics.median(x["levels"][c][f] for x in ok)
                        for f in ("gets_per_s", "first_byte_p50_ms", "cpu_s_per_1000")}
        med[k] = m
    return med


def _table(res: dict[str, Any], levels: list[int]) -> None:
    print(f"\n{res['images']} images ({res['mean_image_bytes'] / 1000:.0f} KB mean), proxy "
          f"{res['delay_ms']:g} ms each way{res.get('netcap_note', '')}; load before: "
          f"{res['uptime_before']}; after: {res['uptime_after']}")
    head = " | ".join(f"GETs/s @{c}" for c in levels)
    print(f"{'client':>8} | {head} | 1st byte p50 @1 ms | CPU s/1000 GETs @" +
          "/@".join(map(str, levels)) + " | import+client s | fork: inherited, after")
    for k, m in res["median"].items():
        if not m.get("rounds_ok"):
            print(f"{k:>8} | failed: {m['errors'][:1]}")
            continue
        g = " | ".join(f"{m[str(c)]['gets_per_s']:>10.1f}" for c in levels)
        cpu = "/".join(f"{m[str(c)]['cpu_s_per_1000']:.2f}" for c in levels)
        f = res["fork"].get(k, {})
        print(f"{k:>8} | {g} | {m[str(levels[0])]['first_byte_p50_ms']:>6.1f} | {cpu} | "
              f"{m['setup_s']:.2f} | {f.get('inherited')}, {f.get('made after fork')}")


def _serve(tmp: Path, a: argparse.Namespace) -> Any:
    """The server: SeaweedFS here, or inside a capped network namespace (--netcap)."""
    from autotune.emulate.seaweed import SeaweedServer

    if not a.netcap:
        return SeaweedServer(tmp / "weed")
    from autotune.emulate.netcap import CappedSeaweed

    return CappedSeaweed(tmp / "weed", rate=a.netcap)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        os.environ.update(AWS_ACCESS_KEY_ID=bench_s3.KEY, AWS_SECRET_ACCESS_KEY=bench_s3.SECRET)
        kind, args = sys.argv[2], sys.argv[3:]
        r = child_run(*args) if kind == "run" else child_fork(*args)
        print(json.dumps(r))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=2600)
    ap.add_argument("--delay-ms", type=float, default=25.0, help="proxy delay, each way")
    ap.add_argument("--levels", default="1,16,64")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", default=",".join(CLIENTS))
    ap.add_argument("--netcap", metavar="RATE", help="e.g. 100mbit: serve from a capped netns")
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args()
    a.clients = a.clients.split(",")
    levels = [int(x) for x in a.levels.split(",")]
    os.environ.update(AWS_ACCESS_KEY_ID=bench_s3.KEY, AWS_SECRET_ACCESS_KEY=bench_s3.SECRET)
    from autotune.synth import make_image_folder

    res: dict[str, Any] = {"date": utc_date(),
                           "images": a.images, "delay_ms": a.delay_ms, "levels": levels,
                           "uptime_before": bench_s3._uptime(), "cores": os.cpu_count()}
    if a.netcap:
        res["netcap_note"] = f", server behind a tc tbf cap of {a.netcap}"
    with tempfile.TemporaryDirectory(prefix="bench-s3-clients-", dir="/var/tmp") as td:
        tmp = Path(td)
        syn = make_image_folder(tmp / "train", a.images, 10, seed=1, workers=2)
        res["mean_image_bytes"] = getattr(syn, "bytes", 0) / max(1, a.images)
        with _serve(tmp, a) as endpoint:
            bench_s3._boto(endpoint).create_bucket(Bucket=BUCKET)
            bench_s3._upload(endpoint, tmp / "train", "train")
            proxy, via = bench_s3._start_proxy(endpoint, a.delay_ms / 1000)
            try:
                res["runs"] = rounds(via, levels, tmp, a)
                key = bench_s3._keys(via)[0]
                res["fork"] = {k: _child(["fork", k, via, key]) for k in a.clients}
            finally:
                proxy.terminate()
                proxy.wait(10)
    res["median"] = medians(res["runs"], levels)
    res["uptime_after"] = bench_s3._uptime()
    _table(res, levels)
    if a.json:
        write_json(a.json, res, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
