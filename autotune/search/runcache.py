"""The whole run, not one pass: which epochs the search's verdict describes.

The search measures cold passes: the first epoch of a run. Later epochs read from the
page cache where the dataset fits in what the job may cache (the cgroup's limit less the
job's own memory, else the host's available memory less it), and thrash where it is a
little larger (LRU under a new random order each epoch: autotune.probe.hitrate). So:

* fits, first epoch storage-bound: one warm trial of the recommended configuration (the
  dataset read into the page cache once, then `bench` with the cache kept: labelled warm)
  gives the later epochs' images/s and their verdict; "storage-bound for the first epoch
  only";
* fits, first epoch bound elsewhere: the later epochs have the same limit (the cache only
  makes reads cheaper, and reads were not the limit); not measured again, said so;
* does not fit: the hit rate measured under that room (a memory cgroup made for it,
  autotune.probe.hitrate), and the later epochs' images/s from it: storage serves only the
  misses; where it cannot be measured, strict LRU's figure, labelled modelled;
* object storage: no page cache between the job and the bucket: every epoch alike.

`whole_run()` returns the `run` key of search.json; `regime()` its one sentence, which the
verdict's summary starts with; autotune.search.projection projects the run's time with and
without conversion for `--epochs N` from it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune import environment
from autotune_base.pathtable import PathTable

__all__ = ["apply_run", "cache_room", "dataset_bytes", "regime", "size_text", "whole_run"]

Progress = Callable[[str], None]
HIT_RATE_EPOCHS = 3            # one to fill the cache, two measured
HIT_RATE_MAX_BYTES = 2 * 2**30  # larger datasets: a seeded sample, room scaled alike
HIT_RATE_BUDGET_S = 180.0      # the reads' estimated time at the storage ceiling, at most
HIT_RATE_MIN_BYTES = 256 * 2**20
WARM_FILL_BUDGET_S = 300.0     # reading a dataset that fits into the cache, at most


def size_text(n: float | None) -> str:
    """160 MiB, 1.7 GiB, 21 GiB."""
    return environment.size_text(n, unknown="?")


def _pct(x: float) -> str:
    return f"{x * 100:.0f} %"


def dataset_bytes(root: Any, fmt: str) -> tuple[int, PathTable]:
    """The dataset's bytes and (file, bytes) of each file a run reads: one pass over the
    source's files, kept as one table (no object per file: 1.28 million files held as
    Path objects and tuples cost the search about 600 MB)."""
    if fmt == "factory":
        p = Path(root)
        paths: Any = [p] if p.is_file() else (os.path.join(d, f) for d, _ds, fs in os.walk(p)
                                              for f in fs)
    else:
        from autotune_converters.registry import open_source

        paths = open_source(root, fmt).file_paths()   # the process's one listing of it
    out = PathTable()
    for f in paths:
        try:
            out.append(os.fspath(f), os.stat(f).st_size)
        except OSError:
            continue
    return sum(out.values()), out


def cache_room(env: Any, job_bytes: int) -> tuple[int, str]:
    """(bytes of page cache the job may use, where that figure comes from): the cgroup's
    limit less the job's own memory, else the host's available memory less it. A cgroup
    limit above the host's RAM (`Environment.memory_total()`: the smaller of both) binds
    nothing: the host's available memory does."""
    lim = _binding_limit(env)
    if lim is not None:
        return max(0, lim - job_bytes), f"this job's cgroup ({size_text(lim)} limit, {env.memory.source})"
    why = ("no cgroup limit" if env.memory.limit_bytes is None else
           f"the cgroup limit {size_text(env.memory.limit_bytes)} is above the host's "
           f"{size_text(env.memory_total())}")
    return (max(0, env.host_available_bytes - job_bytes),
            f"this machine's available memory ({size_text(env.host_available_bytes)}, {why})")


def _binding_limit(env: Any) -> int | None:
    """The cgroup's limit where it is at most the host's memory, else None."""
    lim = env.memory.limit_bytes
    return lim if lim is not None and lim <= env.memory_total() else None


def regime(run: dict[str, Any]) -> str:
    """The sentence naming which epochs the verdict describes."""
    first, later = run.get("first") or {}, run.get("later") or {}
    fb, lb = first.get("bottleneck"), later.get("bottleneck")
    ds, room = size_text(run.get("dataset_bytes")), size_text(run.get("cache_bytes"))
    if run.get("object_storage"):
        return (f"{fb}-bound every epoch: the dataset is read from object storage, which "
                "the page cache does not hold between epochs")
    if run.get("ram_backed"):
        return f"{fb}-bound every epoch: the dataset is RAM-backed, every epoch reads memory"
    if not run.get("cold"):
        return (f"{fb}-bound (the trials were warm: --warm, the first epoch's cold reads "
                "were not measured)")
    later_txt = (f"later epochs {later['images_per_s']:,.0f} images/s, {lb}"
                 if later.get("images_per_s") else f"later epochs {lb}")
    how = {"warm": " (measured warm)", "cgroup hit rate": "", "in-place hit rate": "",
           "modelled": " (modelled)"}.get(run.get("method") or "", "")
    if run.get("fits"):
        where = f"fits in the {room} page cache this job may use"
        if fb == "storage" and lb != "storage":
            return (f"storage-bound for the first epoch only: the dataset ({ds}) {where}; "
                    f"{later_txt}{how}")
        return f"{fb}-bound every epoch: the dataset ({ds}) {where}; {later_txt}{how}"
    ratio = (run["dataset_bytes"] / run["cache_bytes"]) if run.get("cache_bytes") else None
    who = "this job's cgroup may cache" if run.get("cgroup_limit") else "this job may cache"
    size = (f"the dataset ({ds}) is {ratio:.1f}x the {room} {who}" if ratio
            else f"the dataset ({ds}) has no page cache room ({who}: none)")
    hr = run.get("hit_rate")
    hit = (f"measured hit rate {_pct(hr)}" if run.get("later_measured") and hr is not None else
           f"modelled hit rate {_pct(hr)} (strict LRU, c + (1 - c) ln(1 - c))" if hr is not None
           else "no hit rate")
    head = (f"{fb}-bound every epoch" if fb == lb or lb is None else
            f"{fb}-bound for the first epoch, {lb}-bound later")
    return f"{head}: {size}; {hit}; {later_txt}"


def _first(res: Any) -> dict[str, Any]:
    rec, v = res.recommended, res.verdict
    return {"images_per_s": rec.images_per_s if rec else None,
            "bottleneck": v.bottleneck if v else None, "summary": v.summary if v else None}


def whole_run(s: Any, res: Any, say: Progress | None = None) -> dict[str, Any] | None:
    """The `run` key: dataset bytes against the cache room, the first and later epochs'
    images/s and verdicts, and how the later figure was had. None when no configuration
    completed (nothing to say about any epoch)."""
    from autotune_converters.objstore.url import is_s3

    say = say or (lambda _m: None)
    if res.recommended is None or res.verdict is None:
        return None
    first = _first(res)
    run: dict[str, Any] = {"dataset_bytes": None, "cache_bytes": None, "cache_source": None,
                           "cgroup_limit": None, "job_bytes": None, "fits": None,
                           "cold": bool(res.cold), "object_storage": False,
                           "ram_backed": bool(res.ceilings.ram_backed), "first": first,
                           "later": dict(first), "later_measured": False, "method": None,
                           "hit_rate": None, "hit_rate_detail": None, "notes": [],
                           "epochs": getattr(s.opts, "epochs", None)}
    if is_s3(s.root):
        run.update(object_storage=True, fits=False, method="not cached",
                   notes=["object storage: each epoch GETs the objects again"])
    else:
        env = s.env  # the search's one reading (autotune.search.session)
        job = int(res.recommended.memory_mib * 2**20)
        total, files = dataset_bytes(s.root, s.fmt)
        room, source = cache_room(env, job)
        run.update(dataset_bytes=total, cache_bytes=room, cache_source=source,
                   cgroup_limit=_binding_limit(env), job_bytes=job, fits=total <= room)
        run["notes"].append(
            f"the job's own memory is the recommended configuration's peak ({size_text(job)}: "
            f"loader tree {res.recommended.memory_kind} + /dev/shm with "
            + (f"your step ({s.opts.step}))" if getattr(s.opts, "step", None) else
               "the emulated step; a real model adds its own)"))
        if run["ram_backed"] or not run["cold"]:
            run["method"] = "same as first"
        elif run["fits"]:
            rate = s.ceilings.valid("storage") or first["images_per_s"]
            fill_s = len(files) / rate if rate else float("inf")
            if first["bottleneck"] == "storage" and fill_s > WARM_FILL_BUDGET_S:
                # Reading it all into the cache is a whole first epoch on slow storage:
                # the later epochs get the next ceiling instead, labelled.
                _next_ceiling_later(res, run, f"reading the dataset into the page cache "
                                    f"would take about {fill_s / 60:,.0f} min at {rate:,.0f} "
                                    "files/s")
            elif first["bottleneck"] == "storage":
                _warm_later(s, res, run, files, say)
            else:
                run["method"] = "same as first"
                run["notes"].append(
                    f"storage is not the first epoch's limit ({first['bottleneck']}): later "
                    "epochs read the page cache, cheaper still, and keep that limit (not "
                    "measured again)")
        else:
            _hit_rate_later(s, res, run, files, room, say)
    run["regime"] = regime(run)
    return run


def apply_run(s: Any, res: Any, say: Progress | None = None) -> None:
    """Measure the whole run (`whole_run`) into `res.run`, and start the verdict's summary
    with its regime. A measurement that fails is a warning, never the search's end."""
    from autotune.errors import AutotuneError

    try:
        run = whole_run(s, res, say)
    except (AutotuneError, OSError) as e:
        res.warnings.append(f"the later epochs were not measured: {e}")
        return
    res.run = run
    if run is not None and res.verdict is not None:
        res.verdict.summary = f"{run['regime']}. First epoch: {res.verdict.summary}"


def _later_ceilings(s: Any) -> Any:
    """The ceilings for epochs read from the page cache: storage plays no part."""
    return replace(s.ceilings, storage=None, probe=None, lower_bounds={
        k: v for k, v in s.ceilings.lower_bounds.items() if k != "storage"}, evidence=[])


def _warm_later(s: Any, res: Any, run: dict[str, Any], files: PathTable,
                say: Progress) -> None:
    """One warm trial of the recommended configuration: the dataset read into the page
    cache once (under the emulated cap where there is one: it is the first epoch's read),
    then measured with the cache kept."""
    from autotune.bench.residency import preload, resident_fraction
    from autotune.search.verdict import decide, job_args_of, worker_bound_of

    rec = res.recommended
    say(f"later epochs: reading the dataset ({size_text(run['dataset_bytes'])}) into the page "
        "cache, then one warm trial of the recommended configuration")
    throttle = s.opts.throttle
    paths = [f for f, _ in files]   # str: a Path each would cost ~400 bytes a file more
    t0 = time.monotonic()
    with contextlib.ExitStack() as held:
        with throttle.joined() if throttle is not None else contextlib.nullcontext():
            _preload_parallel(paths, preload)
            pinned = held.enter_context(_Pinned(paths))
        run["preload_s"] = time.monotonic() - t0
        resident = resident_fraction(paths)
        params = {k: v for k, v in rec.params.items()}
        warm = s.bench({**params, "cold": False}, "warm")
        warm.params = params
        resident_end = resident_fraction(paths)
    if not pinned.pinned:
        run["notes"].append(pinned.why)
    run["warm_trial"] = {k: warm.to_dict().get(k) for k in (
        "state", "images_per_s", "au", "data_wait_fraction", "reason", "measured_s",
        "timeline_file")}
    run["warm_trial"]["resident_at_start"] = resident
    run["warm_trial"]["resident_at_end"] = resident_end
    if not warm.ok:
        run["notes"].append(f"the warm trial failed ({warm.reason}): later epochs modelled")
        _modelled_later(res, run, run["dataset_bytes"], run["cache_bytes"])
        return
    step_s = s.base.compute_ms / 1000 if s.base.step is None and s.base.compute_ms else None
    v = decide(warm, warm, _later_ceilings(s), batch_size=s.base.batch_size, step_s=step_s,
               dataset=str(s.root), worker_bound=worker_bound_of(s.space),
               job_args=job_args_of(s.base))
    run.update(later={"images_per_s": warm.images_per_s, "bottleneck": v.bottleneck,
                      "summary": v.summary},
               later_measured=True, method="warm")
    low = [r for r in (resident, resident_end) if r is not None and r < 0.95]
    if low:
        run["notes"].append(f"only {_pct(min(low))} of the dataset's sampled pages were cached "
                            "at the start or end of the warm trial")


class _Pinned:
    """The dataset's pages mapped (and touched) by this process while the warm trial runs:
    a cache drop skips mapped pages, so another process's `drop_caches` on a shared
    machine cannot turn the warm figure cold (it is what `vmtouch` does, without mlock:
    memory pressure can still reclaim them). Up to PIN_MAX_FILES files (one mapping
    each: vm.max_map_count is 65,530 by default)."""

    PIN_MAX_FILES = 30_000

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths
        self.maps: list[Any] = []
        self.pinned, self.why = False, ""

    def __enter__(self) -> _Pinned:
        import ctypes
        import mmap

        if len(self.paths) > self.PIN_MAX_FILES:
            self.why = (f"the dataset's {len(self.paths):,} files were not held mapped during "
                        f"the warm trial (more than {self.PIN_MAX_FILES:,} mappings): another "
                        "process's cache drop would have made it colder")
            return self
        # libc's mmap, not Python's: Python's mmap object keeps a file descriptor open per
        # mapping, and thousands of them break select() in the measurement's runner.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self._libc = libc
        failed, page = ctypes.c_void_p(-1).value, mmap.PAGESIZE
        for p in self.paths:
            try:
                fd = os.open(p, os.O_RDONLY)
            except OSError:
                continue
            try:
                size = os.fstat(fd).st_size
                addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0) if size else None
            finally:
                os.close(fd)   # the mapping holds the pages, not the descriptor
            if addr in (None, failed):
                continue
            # MADV_POPULATE_READ (Linux 5.14+) maps every page in one call; else touch them.
            if libc.madvise(addr, size, 22) != 0:
                for i in range(0, size, page):
                    ctypes.c_char.from_address(addr + i).value
            self.maps.append((addr, size))
        self.pinned = True
        return self

    def __exit__(self, *exc: Any) -> None:
        for addr, size in self.maps:
            self._libc.munmap(addr, size)
        self.maps = []


def _next_ceiling_later(res: Any, run: dict[str, Any], why: str) -> None:
    """Later epochs of a dataset that fits, not measured: storage out of the picture, the
    next ceiling (decode or demand) is their rate."""
    c = res.ceilings
    caps = {k: v for k, v in (("decode", c.valid("decode")), ("demand", c.demand)) if v}
    if not caps:
        run.update(method="modelled", later_measured=False)
        run["notes"].append(f"later epochs not measured ({why}) and no ceiling to model them")
        return
    k = min(caps, key=caps.__getitem__)
    run.update(method="modelled", later_measured=False,
               later={"images_per_s": caps[k], "bottleneck": "compute" if k == "demand" else k,
                      "summary": f"modelled: the {k} ceiling, storage out of the picture"})
    run["notes"].append(f"later epochs modelled from the {k} ceiling, not measured: {why}")


def _preload_parallel(paths: list[str], preload: Callable[[Any], int], threads: int = 8) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(lambda k: preload(paths[k::threads]), range(threads)))


def _later_from_hits(res: Any, run: dict[str, Any], h: float) -> None:
    """Later epochs' images/s from a hit rate: storage serves only the misses, so a
    storage-bound first epoch speeds up by 1 / (1 - h), up to the next ceiling."""
    first = run["first"]
    c = res.ceilings
    others = {k: v for k, v in (("decode", c.valid("decode")), ("demand", c.demand)) if v}
    if first["bottleneck"] != "storage" or not first["images_per_s"]:
        run["later"] = dict(first)
        return
    ips = first["images_per_s"] / max(1e-9, 1.0 - h)
    b = "storage"
    if others:
        k = min(others, key=others.__getitem__)
        if others[k] < ips:
            ips, b = others[k], ("compute" if k == "demand" else k)
    run["later"] = {"images_per_s": ips, "bottleneck": b,
                    "summary": f"derived: the first epoch's {first['images_per_s']:,.0f} "
                               f"images/s over the {_pct(1 - h)} of reads that miss the cache"
                               + (f", capped by the {k} ceiling" if b != "storage" else "")}


def _modelled_later(res: Any, run: dict[str, Any], total: int, room: int) -> None:
    from autotune.probe.hitrate import LRU_FORMULA, lru_bound

    c = min(1.0, room / total) if total else 1.0
    h = lru_bound(c)
    run.update(method="modelled", later_measured=False, hit_rate=h,
               hit_rate_detail={"cache_share": c, "lru_bound": h, "formula": LRU_FORMULA})
    run["notes"].append(f"hit rate modelled, not measured: strict LRU under a new random order "
                        f"each epoch hits {LRU_FORMULA} = {_pct(h)} at c = {c:.2f}; Linux lands "
                        "between that and c")
    _later_from_hits(res, run, h)


def _hit_rate_later(s: Any, res: Any, run: dict[str, Any], files: PathTable,
                    room: int, say: Progress) -> None:
    from autotune.errors import AutotuneError
    from autotune.probe.hitrate import measure_hit_rate

    total = run["dataset_bytes"]
    # The reads' time at the storage ceiling (files/s) bounds the sample: three passes over
    # a large dataset on slow storage would cost more than the search.
    cap = HIT_RATE_MAX_BYTES
    ceiling = s.ceilings.valid("storage")
    if ceiling and files:
        per_file = total / len(files)
        cap = min(cap, max(HIT_RATE_MIN_BYTES,
                           int(HIT_RATE_BUDGET_S * ceiling * per_file / HIT_RATE_EPOCHS)))
    throttle = s.opts.throttle
    try:
        with throttle.joined() if throttle is not None else contextlib.nullcontext():
            hr = measure_hit_rate(files, room, epochs=HIT_RATE_EPOCHS, max_bytes=cap,
                                  seed=s.opts.seed, progress=lambda m: say(f"later epochs: {m}"))
    except AutotuneError as e:
        run["notes"].append(f"hit rate not measured ({e})")
        _modelled_later(res, run, total, room)
        return
    run.update(method="cgroup hit rate" if hr.method == "cgroup" else "in-place hit rate",
               later_measured=True, hit_rate=hr.hit_rate, hit_rate_detail=hr.to_dict())
    run["notes"].extend(hr.notes)
    _later_from_hits(res, run, hr.hit_rate)
