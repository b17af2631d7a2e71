"""`autotune probe s3://BUCKET/PREFIX`: object storage's counterpart of fio and the replay.

Measured with the dataset's own objects, through the same client layer the readers use
(autotune_converters.objstore: one boto3 client per process, GETs pinned to ETags):

- LIST: one fresh paginated LIST of the prefix: keys/s, pages, seconds per page;
- GETs of whole objects at 1, 4, 16, 64 in flight (threads sharing one client, as
  DataLoader workers each hold one): GETs/s, MiB/s, first-byte latency (the response's
  headers are in) and whole-object latency, p50 and p99. Each level reads a fresh seeded
  sample of objects (no object twice in a level) until its time is up;
- ranged GETs of one large object (a shard of a conversion, else the largest object when
  it is at least RANGE_MIN_BYTES): 1 MiB and 8 MiB ranges at seeded 4 KiB-aligned offsets,
  pinned with If-Match to its ETag, at 1, 4, 16 in flight: MiB/s and first-byte p50/p99
  (what a random-access reader of shards, or a parallel download, gets). Each answer's
  length and Content-Range are checked (a mismatch is an error). No such object: a note
  says so, never a zero;
- the storage ceiling in samples/s: an image folder reads one object per sample, so the
  best level's GETs/s (class `object`).

"Cold": the server's caches are not this process's to drop. With root, this machine's
page cache is dropped before each level, which is the server's cache too only where the
server runs on this machine (a local SeaweedFS or MinIO in tests); a remote bucket is
measured as it is (labelled).
"""

from __future__ import annotations

import math
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from autotune.probe import ProbeResult
from autotune.probe.classify import FilesystemInfo
from autotune.probe.samples import SampleLevel, SampleReplay
from autotune_base.errors import UsageError
from autotune_converters import registry
from autotune_converters.objstore import ObjectInfo, S3Config, Store, parse

DEFAULT_CONCURRENCY = (1, 4, 16, 64)
RANGE_SIZES = (1 << 20, 8 << 20)
RANGE_CONCURRENCY = (1, 4, 16)
# A loose object this large is read in ranges in practice (a video, an archive, a shard
# uploaded by hand); below it a whole GET is the way to read it.
RANGE_MIN_BYTES = 16 << 20
_ALIGN = 4096


@dataclass
class _Rates:
    """GETs with `concurrency` in flight: how many, how fast, and the first byte's wait."""

    concurrency: int
    gets: int
    bytes: int
    seconds: float
    gets_per_s: float
    mib_per_s: float
    first_byte_p50_ms: float
    first_byte_p99_ms: float


@dataclass
class GetLevel(_Rates):
    """Whole-object GETs at one concurrency, with the whole object's time."""

    object_p50_ms: float
    object_p99_ms: float
    errors: int = 0


@dataclass
class _RangeSize:
    range_bytes: int


# _RangeSize is the last base because a dataclass takes its bases' fields in reverse MRO
# order: range_bytes stays the first field, as RangeLevel(size, c, ...) and its JSON have it.
@dataclass
class RangeLevel(_Rates, _RangeSize):
    """Ranged GETs of `range_bytes` each with `concurrency` in flight."""

    errors: int = 0


@dataclass
class RangeProbe:
    """Ranged reads of one large object (the `object.ranged` section of probe's JSON)."""

    key: str
    size: int
    etag: str
    why: str                          # which object and why it was chosen
    levels: list[RangeLevel] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # range sizes larger than the object


@dataclass
class ObjectProbe:
    """What the object probe measured (the `object` section of probe's JSON)."""

    url: str
    endpoint: str
    objects: int
    mean_object_bytes: float
    list_seconds: float
    list_pages: int
    list_keys_per_s: float
    cold_method: str
    by_concurrency: list[GetLevel] = field(default_factory=list)
    retries: int = 0
    # A conversion (PREFIX/manifest.json: shards): an object is not a sample, so no
    # samples/s ceiling is claimed from GETs/s.
    conversion: str | None = None
    # Ranged reads of a large object, or (None and) the note that says why there are none.
    ranged: RangeProbe | None = None
    ranged_note: str | None = None

    @property
    def best(self) -> GetLevel:
        return max(self.by_concurrency, key=lambda lv: lv.gets_per_s)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.by_concurrency:
            d["best_concurrency"] = self.best.concurrency
            d["best_gets_per_s"] = self.best.gets_per_s
        return d


@dataclass
class ObjectProbeResult(ProbeResult):
    """A ProbeResult whose storage is a bucket: `object` holds the GET figures."""

    object: ObjectProbe | None = None

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["object"] = self.object.to_dict() if self.object else None
        return d


def _pct(xs: list[float], q: float) -> float:
    """The q-quantile (nearest rank) in ms."""
    if not xs:
        return 0.0
    s = sorted(xs)
    return 1000 * s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def _run_for(store: Store, c: int, seconds: float, step: Callable[[], bool]) -> float:
    """`step()` in `c` threads until `seconds` have passed (each thread makes one step at
    least) or a step returns False; the seconds it took. The client is made and the threads
    are started before the clock runs: on a busy machine making a boto3 client can take
    longer than a short level, which then measured nothing at all."""
    store.client  # one per process, shared by the threads
    start = [0.0]
    gate = threading.Barrier(c + 1, action=lambda: start.__setitem__(0, time.perf_counter()))

    def work() -> None:
        gate.wait()
        deadline = start[0] + seconds
        while step() and time.perf_counter() < deadline:
            pass

    threads = [threading.Thread(target=work, daemon=True) for _ in range(c)]
    for t in threads:
        t.start()
    gate.wait()
    for t in threads:
        t.join()
    return max(time.perf_counter() - start[0], 1e-9)


def _rates(c: int, got: list[int], el: float, first: list[float]) -> tuple[Any, ...]:
    """_Rates' figures, in its field order, from the [gets, bytes, ...] counts, the seconds
    taken and the first-byte times."""
    return (c, got[0], got[1], round(el, 3), round(got[0] / el, 1),
            round(got[1] / el / 2**20, 2), round(_pct(first, 0.5), 2),
            round(_pct(first, 0.99), 2))


def _level(store: Store, bucket: str, objs: list[ObjectInfo], c: int, seconds: float) -> GetLevel:
    """GET `objs` (each once at most) with `c` threads until `seconds` have passed."""
    it = iter(objs)
    lock = threading.Lock()
    first: list[float] = []
    whole: list[float] = []
    got = [0, 0, 0]  # gets, bytes, errors

    def step() -> bool:
        with lock:
            obj = next(it, None)
        if obj is None:
            return False
        t0 = time.perf_counter()
        try:
            r = store.call(f"s3://{bucket}/{obj.key}", bucket, lambda cl, o=obj: cl.get_object(
                Bucket=bucket, Key=o.key, **({"IfMatch": o.etag} if o.etag else {})))
            t1 = time.perf_counter()
            n = len(r["Body"].read())
        except Exception:  # noqa: BLE001 (counted: a probe reports, the reader raises)
            with lock:
                got[2] += 1
            return True
        t2 = time.perf_counter()
        with lock:
            first.append(t1 - t0)
            whole.append(t2 - t0)
            got[0] += 1
            got[1] += n
        return True

    el = _run_for(store, c, seconds, step)
    return GetLevel(*_rates(c, got, el, first), round(_pct(whole, 0.5), 2),
                    round(_pct(whole, 0.99), 2), got[2])


def pick_large(objs: Sequence[ObjectInfo], conversion: str | None,
               min_bytes: int = RANGE_MIN_BYTES) -> tuple[ObjectInfo | None, str]:
    """The object to read in ranges and why, or (None, why there is none)."""
    if not objs:
        return None, "no objects: no ranged reads"
    big = max(objs, key=lambda o: (o.size, o.key))
    smallest = min(RANGE_SIZES)
    if conversion is not None and big.size >= smallest:
        return big, f"the largest shard of the {conversion} conversion"
    if big.size >= min_bytes:
        return big, f"the largest object (at least {min_bytes >> 20} MiB)"
    return None, (f"no large object: the largest, {big.key}, is {big.size:,} bytes (under "
                  f"{min_bytes >> 20} MiB{'' if conversion is None else ' and under 1 MiB'}); "
                  "no ranged reads measured")


def _range_level(store: Store, bucket: str, obj: ObjectInfo, size: int, c: int,
                 seconds: float, seed: int,
                 on_range: Callable[[int, bytes], None] | None = None) -> RangeLevel:
    """Ranged GETs of `size` bytes at seeded 4 KiB-aligned offsets of `obj` with `c`
    threads until `seconds` have passed; each answer's length and Content-Range checked."""
    rng = random.Random(seed)
    slots = (obj.size - size) // _ALIGN + 1
    lock = threading.Lock()
    first: list[float] = []
    got = [0, 0, 0]  # gets, bytes, errors
    what = f"s3://{bucket}/{obj.key}"

    def step() -> bool:
        with lock:
            off = rng.randrange(slots) * _ALIGN
        kw: dict[str, Any] = {"Bucket": bucket, "Key": obj.key,
                              "Range": f"bytes={off}-{off + size - 1}"}
        if obj.etag:
            kw["IfMatch"] = obj.etag
        t0 = time.perf_counter()
        try:
            r = store.call(what, bucket, lambda cl: cl.get_object(**kw))
            t1 = time.perf_counter()
            data = r["Body"].read()
            ok = (len(data) == size and str(r.get("ContentRange", "")).startswith(
                f"bytes {off}-{off + size - 1}/"))
        except Exception:  # noqa: BLE001 (counted: a probe reports, the reader raises)
            ok = False
        if not ok:
            with lock:
                got[2] += 1
            return True
        if on_range is not None:
            on_range(off, data)
        with lock:
            first.append(t1 - t0)
            got[0] += 1
            got[1] += len(data)
        return True

    el = _run_for(store, c, seconds, step)
    return RangeLevel(size, *_rates(c, got, el, first), got[2])


def measure_ranges(store: Store, bucket: str, obj: ObjectInfo, why: str, *,
                   sizes: Sequence[int] = RANGE_SIZES,
                   concurrency: Sequence[int] = RANGE_CONCURRENCY, seconds: float = 5.0,
                   seed: int = 0, on_range: Callable[[int, bytes], None] | None = None,
                   progress: Callable[[str], None] | None = None) -> RangeProbe:
    """Ranged GETs of `obj` at each range size and concurrency. `on_range(offset, data)`
    sees every range read (to verify it)."""
    say = progress or (lambda _m: None)
    res = RangeProbe(obj.key, obj.size, obj.etag, why)
    for size in sizes:
        if size > obj.size:
            res.skipped.append(f"{size >> 20} MiB ranges: larger than the object "
                               f"({obj.size:,} bytes)")
            continue
        for c in concurrency:
            say(f"ranged GETs of {size >> 20} MiB with {c} in flight ({seconds:g} s)")
            res.levels.append(_range_level(store, bucket, obj, size, c, seconds,
                                           seed * 1000 + size + c, on_range))
    return res


def _cold(cold: bool) -> str:
    if not cold:
        return "warm (--warm)"
    if os.geteuid() == 0:
        from autotune.cache import drop_caches
        from autotune.errors import NotPermitted

        try:
            drop_caches()
            return "drop_caches (this machine's page cache; the server's only if it runs here)"
        except NotPermitted:
            pass
    return "as it is (no root: the server's caches cannot be dropped from here)"


def measure_objects(url: str, *, store: Store | None = None,
                    concurrency: Sequence[int] = DEFAULT_CONCURRENCY, seconds: float = 10.0,
                    max_objects: int = 2000, cold: bool = True, seed: int = 0,
                    ranges: bool = True, range_seconds: float | None = None,
                    range_min_bytes: int = RANGE_MIN_BYTES,
                    on_range: Callable[[int, bytes], None] | None = None,
                    progress: Callable[[str], None] | None = None) -> ObjectProbe:
    """LIST the prefix once (fresh), then GET its objects at each concurrency, then (with
    `ranges`) ranged GETs of its large object, `range_seconds` a level (default half of
    `seconds`); `on_range(offset, data)` sees each range read."""
    say = progress or (lambda _m: None)
    u = parse(url)
    store = store or Store(S3Config.from_env())
    say(f"listing {u}")
    listing = store.list(u)
    manifest = u.key("manifest.json")
    objs = [o for o in listing.objects if not o.key.endswith("/") and o.key != manifest]
    n = len(objs)
    if n == 0:  # a mistyped or empty prefix: nothing to GET, no figure to give
        raise UsageError(f"{u}: no objects below it at {store.config.shown} (LIST found "
                         f"{len(listing.objects)} key(s)"
                         + (", only the manifest" if listing.objects else "")
                         + "); check the bucket and the prefix (s3://BUCKET/PREFIX, the "
                         "folder holding CLASS/IMAGE.jpg or a conversion's shards).")
    res = ObjectProbe(str(u), store.config.shown, n,
                      listing.total_bytes / n if n else 0.0, round(listing.seconds, 4),
                      listing.pages, round(len(listing.objects) / max(listing.seconds, 1e-9), 1),
                      "warm (--warm)" if not cold else "")
    if len(objs) < len(listing.objects):
        res.conversion = registry.resolve(str(u))
    rng = random.Random(seed)
    for c in concurrency:
        pick = rng.sample(objs, min(n, max_objects))
        res.cold_method = _cold(cold)
        say(f"GETs with {c} in flight ({seconds:g} s)")
        res.by_concurrency.append(_level(store, u.bucket, pick, c, seconds))
    if ranges:
        big, why = pick_large(objs, res.conversion, range_min_bytes)
        if big is None:
            res.ranged_note = why
        else:
            res.ranged = measure_ranges(store, u.bucket, big, why, seed=seed,
                                        seconds=seconds / 2 if range_seconds is None
                                        else range_seconds, on_range=on_range,
                                        progress=progress)
    else:
        res.ranged_note = "ranged reads not measured (ranges=False)"
    res.retries = store.retries
    return res


def probe_result(url: str, obj: ObjectProbe) -> Any:
    """The object probe as a ProbeResult (the shape `autotune search` and the JSON use):
    class `object`, the storage ceiling in samples/s (one object per sample)."""
    fs = FilesystemInfo(type="s3", mountpoint=None, source=obj.endpoint, device=None,
                        rotational=None, klass="object",
                        evidence=[f"s3:// dataset at {obj.endpoint}: object storage, read "
                                  "over the network"])
    levels = [lv for lv in obj.by_concurrency if lv.gets]
    samples = SampleReplay("folder", obj.objects, obj.cold_method,
                           [SampleLevel(lv.concurrency, lv.gets, lv.bytes, lv.seconds,
                                        lv.gets_per_s, lv.mib_per_s, lv.errors) for lv in levels])
    verdict = _verdict(obj, levels)
    return ObjectProbeResult(path=url, filesystem=fs, fio=None,
                             fio_error="object storage: no fio (nothing to write a scratch "
                                       "file on)", replay=None,
                             replay_error="object storage: measured by GETs (see object)",
                             verdict=verdict, scratch_dir=None, seconds=0.0,
                             samples=samples if levels and obj.conversion is None else None,
                             object=obj)


def _verdict(obj: ObjectProbe, levels: list[GetLevel]) -> dict[str, Any]:
    ev = [f"LIST: {obj.objects:,} objects in {obj.list_pages} page(s), {obj.list_seconds:.2f} s "
          f"({obj.list_keys_per_s:,.0f} keys/s)"]
    advice: list[str] = []
    best = max(levels, key=lambda lv: lv.gets_per_s) if levels else None
    one = next((lv for lv in levels if lv.concurrency == 1), None)
    for lv in levels:
        ev.append(f"{lv.concurrency} in flight: {lv.gets_per_s:,.0f} GETs/s, {lv.mib_per_s:,.1f} "
                  f"MiB/s, first byte p50 {lv.first_byte_p50_ms:.1f} ms p99 "
                  f"{lv.first_byte_p99_ms:.1f} ms")
    if best is not None and one is not None and best.concurrency > 1 \
            and best.gets_per_s > 2 * one.gets_per_s:
        advice.append(f"latency-bound: {one.gets_per_s:,.0f} GETs/s with one request in flight, "
                      f"{best.gets_per_s:,.0f} with {best.concurrency}: keep about "
                      f"{best.concurrency} requests in flight (DataLoader workers x threads), "
                      "or convert to shards so that each request is large")
    ev.extend(_range_evidence(obj))
    rate = None if best is None else round(best.gets_per_s, 1)
    summary = (f"object storage ({obj.endpoint})"
               + (f": at most ~{rate:,.0f} objects/s for this dataset's objects" if rate else ""))
    per_sample = rate
    if obj.conversion is not None:
        per_sample = None  # a shard holds many samples: GETs/s is not samples/s
        ev.append(f"a {obj.conversion} conversion: its objects are shards, so GETs/s is no "
                  "samples/s ceiling (bench it for samples/s)")
    return {"class": "object", "storage_files_per_s": rate, "storage_samples_per_s": per_sample,
            "samples_best_concurrency": best.concurrency if best else None,
            "storage_pass": None, "storage_method": "GETs", "best_concurrency":
            best.concurrency if best else None, "rules": [], "evidence": ev, "advice": advice,
            "summary": summary, "cold": obj.cold_method.startswith("drop_caches"),
            "cold_reason": None if obj.cold_method.startswith("drop_caches") else obj.cold_method}


def _range_evidence(obj: ObjectProbe) -> list[str]:
    rp = obj.ranged
    if rp is None:
        return [obj.ranged_note] if obj.ranged_note else []
    out = []
    for size in sorted({lv.range_bytes for lv in rp.levels}):
        lvs = [lv for lv in rp.levels if lv.range_bytes == size and lv.gets]
        if lvs:
            b = max(lvs, key=lambda lv: lv.mib_per_s)
            out.append(f"ranged GETs of {size >> 20} MiB of {rp.key} ({rp.why}): best "
                       f"{b.mib_per_s:,.1f} MiB/s at {b.concurrency} in flight, first byte "
                       f"p50 {b.first_byte_p50_ms:.1f} ms p99 {b.first_byte_p99_ms:.1f} ms")
    return out + rp.skipped


def probe_objects(url: str, *, concurrency: Sequence[int] = DEFAULT_CONCURRENCY,
                  seconds: float = 10.0, max_objects: int = 2000, cold: bool = True,
                  seed: int = 0, ranges: bool = True,
                  progress: Callable[[str], None] | None = None) -> Any:
    """`autotune probe s3://...`: measure_objects as a ProbeResult (with `.object`)."""
    t0 = time.monotonic()
    obj = measure_objects(url, concurrency=concurrency, seconds=seconds,
                          max_objects=max_objects, cold=cold, seed=seed, ranges=ranges,
                          progress=progress)
    res = probe_result(url, obj)
    res.seconds = time.monotonic() - t0
    return res
