"""Our S3 WebDataset reader against webdataset's `pipe:curl`, pinned, with each worker's
run-queue wait (scripts/bench_s3.py `--only gap`; not a test: timings).

    flock /tmp/autotune-bench.lock env PYTHONPATH=. .venv/bin/python -m scripts.bench_s3 \\
        --only gap --images 4000 [--readers ours,webdataset] [--cpus '0,1;1'] [--rounds 3]

bench_s3.py starts the servers, converts and uploads the shards as for `--only peers`; this
module then reads them with only `--readers`, with the --pipeline preset's transform in
the workers, in rounds whose order rotates, for each CPU set of `--cpus` (';' between
sets): each reading process is pinned to that set before its DataLoader starts
(os.sched_setaffinity), so its workers and webdataset's `sh`/`curl` children inherit the
same set. SeaweedFS and the delay proxy are not pinned.

In the reading process a thread reads, every INTERVAL seconds, /proc/PID/task/TID/schedstat
(ns on a CPU, ns runnable waiting for one, time slices) and the status file's voluntary and
nonvoluntary context switches of every thread of every process below it; the last values
seen for each thread are kept (a thread that ends keeps what it had at the last read: up
to INTERVAL of a short-lived `curl` can be missed). Each batch's collate, in the worker,
says which worker made it, its pid, torch.get_num_threads() and the worker's OS threads,
so each worker's samples/s is recorded beside its waits. Also per pass: the load average
before and after, and each pinned CPU's busy share (/proc/stat) over the pass.
"""

from __future__ import annotations

import os
import statistics
import threading
from typing import Any

from autotune.runqueue import descendants, thread_schedstats
from scripts._common import loadavg

INTERVAL = 0.02


def parse_cpus(spec: str) -> list[list[int]]:
    """'0,1;1' -> [[0, 1], [1]] (one set per pass kind; a range as '0-1')."""
    sets = []
    for part in spec.split(";"):
        cpus: list[int] = []
        for x in part.split(","):
            a, _, b = x.strip().partition("-")
            cpus.extend(range(int(a), int(b or a) + 1))
        sets.append(sorted(set(cpus)))
    return sets


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def cpu_times() -> dict[int, tuple[int, int]]:
    """{cpu: (busy jiffies, total jiffies)} from /proc/stat (idle and iowait not busy)."""
    out = {}
    for line in (_read("/proc/stat") or "").splitlines():
        if line.startswith("cpu") and line[3:4].isdigit():
            f = line.split()
            v = [int(x) for x in f[1:]]
            total = sum(v[:8])
            out[int(f[0][3:])] = (total - v[3] - v[4], total)
    return out


def busy_share(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]],
               cpus: list[int]) -> dict[int, float]:
    """Each CPU's busy fraction between two cpu_times() (all processes, ours included)."""
    out = {}
    for c in cpus:
        b0, t0 = before.get(c, (0, 0))
        b1, t1 = after.get(c, (0, 0))
        out[c] = round((b1 - b0) / max(1, t1 - t0), 3)
    return out


def _thread(pid: int, tid: str) -> dict[str, Any] | None:
    ss = _read(f"/proc/{pid}/task/{tid}/schedstat")
    st = _read(f"/proc/{pid}/task/{tid}/status")
    if not ss or not st:
        return None
    run, wait, slices = (int(x) for x in ss.split()[:3])
    d: dict[str, Any] = {"cpu_ns": run, "wait_ns": wait, "slices": slices}
    for line in st.splitlines():
        k, _, v = line.partition(":")
        if k == "Name":
            d["name"] = v.strip()
        elif k == "PPid":
            d["ppid"] = int(v)
        elif k == "voluntary_ctxt_switches":
            d["vol"] = int(v)
        elif k == "nonvoluntary_ctxt_switches":
            d["nonvol"] = int(v)
    return d


def _on_cpu(pid: int) -> int | None:
    """The CPU a runnable (R) process is on or queued on, else None (/proc/PID/stat)."""
    st = _read(f"/proc/{pid}/stat")
    if not st:
        return None
    f = st[st.rindex(")") + 2:].split()
    return int(f[36]) if f[0] == "R" else None  # field 3 is the state, 39 the CPU


def _migrations(pid: int) -> int | None:
    for line in (_read(f"/proc/{pid}/sched") or "").splitlines():
        if line.startswith("se.nr_migrations"):
            return int(line.split(":")[1])
    return None


class TreeSampler:
    """A thread that keeps the last schedstat/status of every thread below this process."""

    def __init__(self, interval: float = INTERVAL) -> None:
        self.interval = interval
        self.root = os.getpid()
        self.threads: dict[tuple[int, int], dict[str, Any]] = {}
        self.reads = 0
        # "0,0,1": at one read, 3 workers runnable, two of them queued on CPU 0 -> reads
        self.placements: dict[str, int] = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name="gap-sampler", daemon=True)

    def start(self) -> TreeSampler:
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        on: list[int] = []  # the CPU of each runnable DataLoader worker's main thread
        for pid in descendants(self.root):
            if pid == self.root:
                continue
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                d = _thread(pid, tid)
                if d is not None:
                    self.threads[(pid, int(tid))] = d
                    if int(tid) == pid and d.get("ppid") == self.root:
                        d["migrations"] = _migrations(pid)
                        cpu = _on_cpu(pid)
                        if cpu is not None:
                            on.append(cpu)
        if on:
            key = ",".join(str(c) for c in sorted(on))
            self.placements[key] = self.placements.get(key, 0) + 1
        self.reads += 1

    def stop(self) -> None:
        self._stop.set()
        self._t.join()


def worker_figures(threads: dict[tuple[int, int], dict[str, Any]], info: dict[int, dict],
                   seconds: float) -> list[dict[str, Any]]:
    """Per DataLoader worker (info: pid -> {"id", "samples", "torch_threads", "os_threads"}):
    its threads' CPU and run-queue wait (main thread, others by name) and its children's
    (webdataset's sh/curl), in seconds, with its samples/s over the pass."""
    procs: dict[int, dict[tuple[int, int], dict]] = {}
    for key, d in threads.items():
        procs.setdefault(key[0], {})[key] = d
    parent = {pid: next(iter(ts.values())).get("ppid") for pid, ts in procs.items()}

    def owner(pid: int) -> int | None:
        seen = 0
        while pid is not None and pid not in info and seen < 10:
            pid, seen = parent.get(pid), seen + 1
        return pid if pid in info else None

    out = []
    for wpid, w in sorted(info.items(), key=lambda kv: kv[1]["id"]):
        ts = procs.get(wpid, {})
        main = ts.get((wpid, wpid), {})
        others: dict[str, list[float]] = {}
        for (pid, tid), d in ts.items():
            if tid != wpid:
                o = others.setdefault(d.get("name", "?"), [0, 0.0, 0.0])
                o[0] += 1
                o[1] += d["cpu_ns"] / 1e9
                o[2] += d["wait_ns"] / 1e9
        kids = [d for (pid, _), d in threads.items() if pid != wpid and owner(pid) == wpid]
        kid_names = sorted({d.get("name", "?") for d in kids})
        cpu = sum(d["cpu_ns"] for d in ts.values()) / 1e9
        wait = sum(d["wait_ns"] for d in ts.values()) / 1e9
        out.append({
            "worker": w["id"], "pid": wpid, "samples": w["samples"],
            "samples_per_s": round(w["samples"] / seconds, 1),
            "cpu_s": round(cpu, 3), "wait_s": round(wait, 3),
            # its main thread neither on a CPU nor waiting for one: blocked (a socket, a
            # pipe, the queue) or not yet started
            "other_s": round(seconds - (main.get("cpu_ns", 0) + main.get("wait_ns", 0)) / 1e9, 3),
            "main_cpu_s": round(main.get("cpu_ns", 0) / 1e9, 3),
            "main_wait_s": round(main.get("wait_ns", 0) / 1e9, 3),
            "main_slices": main.get("slices"), "main_vol": main.get("vol"),
            "migrations": main.get("migrations"),
            "main_nonvol": main.get("nonvol"),
            "other_threads": {k: {"n": v[0], "cpu_s": round(v[1], 3), "wait_s": round(v[2], 3)}
                              for k, v in others.items()},
            "children": {"names": kid_names, "n": len({p for (p, _), d in threads.items()
                                                        if p != wpid and owner(p) == wpid}),
                         "cpu_s": round(sum(d["cpu_ns"] for d in kids) / 1e9, 3),
                         "wait_s": round(sum(d["wait_ns"] for d in kids) / 1e9, 3),
                         "vol": sum(d.get("vol", 0) for d in kids),
                         "nonvol": sum(d.get("nonvol", 0) for d in kids)},
            "torch_threads": w.get("torch_threads"), "os_threads": w.get("os_threads"),
        })
    return out


def worker_tag() -> tuple[int, int, int, int]:
    """In a DataLoader worker: (worker id, pid, torch.get_num_threads(), OS threads)."""
    import torch

    wi = torch.utils.data.get_worker_info()
    return (wi.id if wi else -1, os.getpid(), torch.get_num_threads(),
            len(os.listdir("/proc/self/task")))



def tree_usage(pids: list[int]) -> tuple[float, float]:
    """(CPU s, run-queue wait s) of every thread of `pids` and their descendants so far."""
    cpu = wait = 0
    for root in pids:
        for r, w in thread_schedstats(root).values():
            cpu, wait = cpu + r, wait + w
    return cpu / 1e9, wait / 1e9


def gap(run_child: Any, via: str, prefix: str, a: Any, servers: list[int]) -> dict[str, Any]:
    """The rounds: for each CPU set, `a.rounds` rounds of `a.readers` in rotated order,
    each pass a fresh pinned process (run_child(args) -> its JSON); `servers` (the proxy,
    SeaweedFS: not pinned) have their CPU and wait over each pass recorded beside it."""
    kinds = [k.strip() for k in a.readers.split(",") if k.strip()]
    sets = parse_cpus(a.cpus)
    passes = []
    for cpus in sets:
        spec = ",".join(map(str, cpus))
        for r in range(a.rounds):
            order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
            for k in order:
                la0, s0 = loadavg(), tree_usage(servers)
                res = run_child(["read", k, via, prefix, str(a.read_workers), "64", a.pipeline,
                                 spec])
                s1 = tree_usage(servers)
                res.update(reader=k, cpus=cpus, round=r + 1, load_before=la0,
                           load_after=loadavg(), servers_cpu_s=round(s1[0] - s0[0], 3),
                           servers_wait_s=round(s1[1] - s0[1], 3))
                passes.append(res)
                print(f"  cpus {spec} round {r + 1} {k}: " + summary_line(res), flush=True)
    return {"readers": kinds, "cpu_sets": sets, "pipeline": a.pipeline,
            "workers": a.read_workers, "batch": 64, "interval_s": INTERVAL, "passes": passes,
            "median": medians(passes)}


def tree_cpu(p: dict[str, Any]) -> float:
    """CPU seconds of the reading process's whole tree over the pass: its main process,
    the workers (all threads) and their children."""
    ws = p.get("worker_figures") or []
    return (p.get("main_process", {}).get("cpu_s", 0.0) + sum(w["cpu_s"] for w in ws)
            + sum(w["children"]["cpu_s"] for w in ws))


def one_cpu_share(placements: dict[str, int]) -> float:
    """Of the reads that found at least 2 workers runnable, the share where all of them
    were on (or queued on) the same CPU."""
    two = {k: n for k, n in placements.items() if "," in k}
    same = sum(n for k, n in two.items() if len(set(k.split(","))) == 1)
    return same / max(1, sum(two.values()))


def summary_line(p: dict[str, Any]) -> str:
    if "error" in p:
        return f"ERROR {p['error']}"
    ws = p.get("worker_figures") or []
    share = tree_cpu(p) / p["seconds"] / max(1, len(p.get("cpu_busy") or [1]))
    wait = [w["main_wait_s"] for w in ws]
    cpu = [w["main_cpu_s"] for w in ws]
    kid = [w["children"]["cpu_s"] for w in ws]
    kidw = [w["children"]["wait_s"] for w in ws]
    return (f"{p['samples_per_s']:.0f} samples/s, {p['seconds']:.1f} s; per worker (main thread) wait "
            f"{min(wait, default=0):.2f}-{max(wait, default=0):.2f} s, cpu "
            f"{min(cpu, default=0):.2f}-{max(cpu, default=0):.2f} s, blocked "
            f"{min((w['other_s'] for w in ws), default=0):.2f}-"
            f"{max((w['other_s'] for w in ws), default=0):.2f} s; tree "
            f"{tree_cpu(p) / max(1, p['samples']) * 1e3:.2f} ms CPU/sample, {share:.0%} of the "
            f"pinned CPUs; children cpu "
            f"{sum(kid):.2f} wait {sum(kidw):.2f} s; torch threads "
            f"{sorted({w['torch_threads'] for w in ws})}, OS threads "
            f"{sorted({w['os_threads'] for w in ws})}; main nonvol "
            f"{sum(w['main_nonvol'] or 0 for w in ws)}, vol {sum(w['main_vol'] or 0 for w in ws)}"
            f"; servers cpu {p.get('servers_cpu_s')} wait {p.get('servers_wait_s')} s"
            f"; migrations {[w.get('migrations') for w in ws]}"
            f"; runnable workers on one CPU {one_cpu_share(p.get('placements') or {}):.0%}"
            f"; busy {p.get('cpu_busy')}; load {p.get('load_before')} -> {p.get('load_after')}")


def medians(passes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    keys = sorted({(p["reader"], tuple(p["cpus"])) for p in passes})
    for reader, cpus in keys:
        ps = [p for p in passes if p["reader"] == reader and tuple(p["cpus"]) == cpus
              and "samples_per_s" in p]
        if not ps:
            continue
        ws = [w for p in ps for w in p.get("worker_figures") or []]
        out[f"{reader}|{','.join(map(str, cpus))}"] = {
            "samples_per_s": [round(p["samples_per_s"]) for p in ps],
            "median_samples_per_s": round(statistics.median(p["samples_per_s"] for p in ps)),
            "median_worker_wait_s": round(statistics.median(w["main_wait_s"] for w in ws), 2),
            "median_worker_cpu_s": round(statistics.median(w["main_cpu_s"] for w in ws), 2),
            "median_one_cpu_share": round(statistics.median(
                one_cpu_share(p.get("placements") or {}) for p in ps), 2),
            "median_worker_blocked_s": round(statistics.median(w["other_s"] for w in ws), 2),
            "median_tree_ms_per_sample": round(statistics.median(
                tree_cpu(p) / p["samples"] * 1e3 for p in ps), 2),
            "median_tree_share": round(statistics.median(
                tree_cpu(p) / p["seconds"] / len(p["cpu_busy"]) for p in ps), 3),
        }
    return out


def table(g: dict[str, Any]) -> None:
    print(f"\n{g['pipeline']}, {g['workers']} workers, batch {g['batch']}; per pass:")
    print("per worker: its main thread's run-queue wait, CPU and blocked time (s); kids: "
          "webdataset's sh/curl (s, all workers)")
    print(f"{'cpus':>5} | {'rd':>2} | {'reader':>10} | {'smp/s':>5} | {'wait s/worker':>17} | "
          f"{'cpu s/worker':>17} | {'blocked s/worker':>17} | {'kids cpu/wait':>13} | "
          "tree ms/smp | tree share | busy | load before -> after")
    for p in g["passes"]:
        if "error" in p:
            print(f"{','.join(map(str, p['cpus'])):>5} | {p['round']:>2} | {p['reader']:>10} | "
                  f"ERROR {p['error']}")
            continue
        ws = p["worker_figures"]
        wait = " ".join(f"{w['main_wait_s']:.1f}" for w in ws)
        cpu = " ".join(f"{w['main_cpu_s']:.1f}" for w in ws)
        kc = sum(w["children"]["cpu_s"] for w in ws)
        kw = sum(w["children"]["wait_s"] for w in ws)
        blocked = " ".join(f"{w['other_s']:.1f}" for w in ws)
        busy = "/".join(f"{v:.2f}" for v in p["cpu_busy"].values())
        share = tree_cpu(p) / p["seconds"] / len(p["cpu_busy"])
        print(f"{','.join(map(str, p['cpus'])):>5} | {p['round']:>2} | {p['reader']:>10} | "
              f"{p['samples_per_s']:5.0f} | {wait:>17} | {cpu:>17} | {blocked:>17} | "
              f"{kc:5.1f}/{kw:5.1f} | {tree_cpu(p) / p['samples'] * 1e3:11.2f} | "
              f"{share:10.0%} | {busy} | {p['load_before']} -> {p['load_after']}")
    for k, m in g["median"].items():
        print(f"  {k}: {m}")
