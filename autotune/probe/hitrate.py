"""The page cache's hit rate over later epochs, measured under a memory limit.

A dataset larger than the page cache a job may use is not served "c of it from memory"
each epoch: a training loop reads it in a new random order every epoch, and a cache that
evicts the least recently used page throws out, just before they are read again, the
pages the previous epoch read last. Strict LRU under a new random permutation each epoch
hits

    h(c) = c + (1 - c) * ln(1 - c)        (c: the cache's share of the dataset, 0 <= c < 1)

11 % at c = 0.43, 67 % at c = 0.9 (CoorDL, VLDB'21, measured the same thrashing). Linux's
page cache is not strict LRU (active and inactive lists, or MGLRU), so a real figure lands
between h(c) and c; `lru_bound` and `simulate_lru` give the bound, `measure_hit_rate` the
figure.

`measure_hit_rate` measures, not assumes:

1. the files' pages are evicted first (cgroup v1 charges a page to whoever read it first:
   a page another cgroup holds would be a hit that costs this limit nothing);
2. a memory cgroup is made for the measurement (v1 under this process's own memory
   cgroup, first; v2 only where its `cgroup.controllers` lists memory and it is
   delegated: a systemd-hybrid host's `unified` mount has no memory controller), and a
   reader process started
   inside it (it joins before it execs, so everything it touches is charged there);
3. once the reader has its memory (its interpreter and one read buffer), the cgroup's
   limit is set to what it uses plus the cache room: the reader stands in for the job,
   whose own memory is not cache;
4. the reader reads every file whole, epoch after epoch, each in a new seeded random
   order, and after each epoch reads its `/proc/PID/io` `read_bytes` (bytes that came
   from storage): hits = 1 - read_bytes / bytes delivered (rounded up to whole pages per
   file: a miss reads the last partial page in full). The first epoch fills the cache;
   the later ones are the figure.

Where no cgroup can be made (not root, no v1 memory hierarchy, no v2 delegation) the
reader runs in this process's own cgroup ("in place": the job's own limit then binds),
or the caller labels the figure modelled with `lru_bound`.
"""

from __future__ import annotations

import json
import math
import os
import random
import secrets
import subprocess
import sys
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autotune.cgroups import join_self, remove_cgroup, write_value
from autotune.errors import AutotuneError, NotPermitted, UsageError
from autotune_base.pathtable import PathTable

__all__ = ["HitRate", "MemoryCgroup", "lru_bound", "measure_hit_rate", "simulate_lru"]

CGROUP_PREFIX = "autotune-runcache-"
LRU_FORMULA = "c + (1 - c) * ln(1 - c)"


def lru_bound(c: float) -> float:
    """Strict LRU's hit rate under a new random order each epoch, for a cache holding a
    share `c` of the dataset (1.0 from c >= 1: everything stays)."""
    if c >= 1:
        return 1.0
    if c <= 0:
        return 0.0
    return c + (1 - c) * math.log(1 - c)


def simulate_lru(items: int, cache: int, epochs: int = 4, seed: int = 0) -> float:
    """Hit rate of a strict LRU cache of `cache` items over epochs 2.. of `items` read in
    a new random order each epoch (a check of `lru_bound`, and of nothing else)."""
    from collections import OrderedDict

    rng = random.Random(seed)
    lru: OrderedDict[int, None] = OrderedDict()
    hits = reads = 0
    for e in range(epochs):
        order = list(range(items))
        rng.shuffle(order)
        for i in order:
            if i in lru:
                lru.move_to_end(i)
                hit = True
            else:
                hit = False
                lru[i] = None
                if len(lru) > cache:
                    lru.popitem(last=False)
            if e > 0:
                hits += hit
                reads += 1
    return hits / reads if reads else 0.0


@dataclass
class HitRate:
    """A measured hit rate: `hit_rate` is the mean over the later epochs (from the second),
    `epochs` each epoch's bytes delivered, bytes from storage (read_bytes) and seconds."""

    hit_rate: float
    cache_share: float                 # c: the cache room over the pages read each epoch
    lru_bound: float                   # h(c): strict LRU's figure
    dataset_bytes: int                 # the bytes one epoch reads (the sample's, if sampled)
    room_bytes: int                    # the page cache the reader's cgroup left it
    method: str                        # "cgroup" (one made for it) or "in place"
    cgroup: str | None
    reader_bytes: int | None           # what the reader itself used (its "job's memory")
    limit_bytes: int | None            # the cgroup's limit during the epochs
    files: int
    sampled: bool = False              # a seeded sample of the files, room scaled alike
    epochs: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- the memory cgroup -----------------------------------------------------------------------

def _candidates(dirs: list[tuple[str, Path]]) -> list[tuple[str, Path, Path]]:
    """(kind, parent, home) where a measurement's cgroup may be made, best first: under
    this process's own v1 memory cgroup; else in the v2 hierarchy (its top, which may
    delegate memory to its children) only where its `cgroup.controllers` lists memory. A
    systemd-hybrid host mounts `unified` (v2, no memory controller) before the v1
    hierarchies: taking the first directory found would try that one and give up.
    `home` is the process's own cgroup of that kind, where processes go back to."""
    v1 = [d for k, d in dirs if k == "v1"]
    v2 = [d for k, d in dirs if k == "v2"]
    out = []
    if v1 and (v1[0] / "memory.limit_in_bytes").exists():
        out.append(("v1", v1[0], v1[0]))
    if v2:
        try:
            memory = "memory" in (v2[-1] / "cgroup.controllers").read_text().split()
        except OSError:
            memory = False
        if memory:
            out.append(("v2", v2[0], v2[0]))
            if v2[-1] != v2[0]:
                out.append(("v2", v2[-1], v2[0]))
    return out


class MemoryCgroup:
    """A memory cgroup made for one measurement; a context manager that removes it (its
    processes moved back to this process's own cgroup first)."""

    def __init__(self, tag: str = "hitrate") -> None:
        self.tag = tag
        self.path: Path | None = None
        self.kind: str | None = None
        self.home: Path | None = None   # where its processes go back to

    def __enter__(self) -> MemoryCgroup:
        from autotune.cgroups import cgroup_dirs

        try:
            dirs = cgroup_dirs("memory")
        except OSError as e:
            raise NotPermitted(f"/proc/self/cgroup: {e.strerror}; no memory cgroup can be "
                               "made") from e
        name = f"{CGROUP_PREFIX}{self.tag}-{os.getpid()}-{secrets.token_hex(3)}"
        errors: list[str] = []
        for kind, d, home in _candidates(dirs):
            if kind == "v1" and (d / "memory.limit_in_bytes").exists():
                parent = d
            elif kind == "v2":
                # v2: a child gets the memory controller only where the parent delegates it
                # (its cgroup.subtree_control); the root may enable it for its children.
                parent = d
                try:
                    if "memory" not in (d / "cgroup.subtree_control").read_text().split():
                        write_value(d / "cgroup.subtree_control", "+memory")
                except OSError as e:
                    errors.append(f"{d / 'cgroup.subtree_control'}: {e.strerror} (the memory "
                                  "controller is not delegated here)")
                    continue
            else:
                continue
            try:
                (parent / name).mkdir()
            except OSError as e:
                errors.append(f"{parent / name}: {e.strerror}")
                continue
            self.path, self.kind, self.home = parent / name, kind, home
            return self
        raise NotPermitted("no memory cgroup can be made for the hit-rate measurement"
                           + (": " + "; ".join(errors) if errors else
                              ": no v1 memory hierarchy or v2 mount holds this process"))

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    @property
    def procs(self) -> Path:
        assert self.path is not None
        return self.path / "cgroup.procs"

    def usage(self) -> int:
        assert self.path is not None
        f = "memory.current" if self.kind == "v2" else "memory.usage_in_bytes"
        return int((self.path / f).read_text().strip())

    def own_bytes(self) -> int:
        """Usage less the page cache its processes do not map: the memory the processes
        hold themselves (anonymous, kernel, mapped files), which is not cache room."""
        assert self.path is not None
        stat = {}
        for line in (self.path / "memory.stat").read_text().splitlines():
            k, _, v = line.partition(" ")
            if v.strip().isdigit():
                stat[k] = int(v)
        if self.kind == "v2":
            cache = stat.get("file", 0) - stat.get("file_mapped", 0)
        else:
            cache = stat.get("cache", 0) - stat.get("mapped_file", 0)
        return max(0, self.usage() - max(0, cache))

    def set_limit(self, n: int) -> None:
        assert self.path is not None
        f = self.path / ("memory.max" if self.kind == "v2" else "memory.limit_in_bytes")
        try:
            write_value(f, str(int(n)))
        except OSError as e:
            raise AutotuneError(f"cannot set {f} to {n:,} bytes: {e.strerror}") from e

    def preexec(self) -> Callable[[], None]:
        procs = os.fsencode(self.procs)

        def join() -> None:
            join_self(procs)  # in the child between fork and exec
        return join

    def remove(self) -> None:
        p, self.path = self.path, None
        if p is None:
            return
        remove_cgroup(p, (self.home / "cgroup.procs") if self.home else None, poll_s=0.05)


# -- the reader --------------------------------------------------------------------------------

# Runs in `python -I -c`: standard library only, so the "job's memory" it stands for is a
# bare interpreter's, and each reading thread has one buffer, allocated before "ready".
_READER = r"""
import json, os, random, sys, threading
spec = json.loads(sys.stdin.readline())
files, epochs, seed, threads = spec["files"], spec["epochs"], spec["seed"], spec["threads"]
bufs = [bytearray(1 << 20) for _ in range(threads)]
def io():
    out = {}
    with open("/proc/%d/io" % os.getpid()) as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k.strip()] = int(v)
    return out
print("ready", flush=True)
sys.stdin.readline()
for e in range(epochs):
    order = list(range(len(files)))
    random.Random(seed * 1000003 + e).shuffle(order)
    delivered = [0] * threads
    def run(k):
        b = memoryview(bufs[k])
        for i in order[k::threads]:
            try:
                with open(files[i], "rb", buffering=0) as f:
                    while True:
                        n = f.readinto(b)
                        if not n:
                            break
                        delivered[k] += n
            except OSError:
                pass
    a = io()
    import time
    t0 = time.monotonic()
    ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for t in ts: t.start()
    for t in ts: t.join()
    secs = time.monotonic() - t0
    z = io()
    print(json.dumps({"epoch": e + 1, "delivered": sum(delivered), "seconds": secs,
                      "read_bytes": z["read_bytes"] - a["read_bytes"],
                      "rchar": z["rchar"] - a["rchar"]}), flush=True)
"""


def _sample(files: Sequence[tuple[str, int]], max_bytes: int, seed: int,
            total: int | None = None) -> tuple[list[tuple[str, int]], bool]:
    if total is None:
        total = sum(n for _, n in files)
    if total <= max_bytes:
        return list(files), False
    # The positions are shuffled, not the files: an array of them is 8 bytes a file, and
    # random.shuffle swaps alike whatever it holds, so the sample is the same.
    order = array("q", range(len(files)))
    random.Random(seed).shuffle(order)
    out, acc = [], 0
    for i in order:
        if acc >= max_bytes:
            break
        f, n = files[i]
        out.append((f, n))
        acc += n
    return out, True


def _evict(paths: list[str]) -> float | None:
    """Evict the files' pages (fadvise: only these files, no global drop for the other
    measurements on the machine); drop the page cache as root when pages stay (mapped
    ones). Returns the resident share left (sampled)."""
    from autotune.bench.residency import resident_fraction
    from autotune.cache import drop_caches, evict_files

    evict_files(paths)
    ps = [Path(p) for p in paths]
    left = resident_fraction(ps)
    if left and left > 0.01 and os.geteuid() == 0:
        try:
            drop_caches(1)
        except NotPermitted:
            pass
        left = resident_fraction(ps)
    return left


def _sized(files: Sequence[tuple[str, int]] | Sequence[str]
           ) -> tuple[Sequence[tuple[str, int]], int]:
    """Each file with its size (given, or stat'ed), and their total; UsageError when empty.
    A PathTable of (path, bytes) is used as it is (no tuple per file)."""
    if isinstance(files, PathTable):
        sized: Sequence[tuple[str, int]] = files
        total = sum(files.values())
    else:
        sized = [(str(f), os.path.getsize(f)) if not isinstance(f, tuple)
                 else (str(f[0]), int(f[1])) for f in files]
        total = sum(n for _, n in sized)
    if not sized or total == 0:
        raise UsageError("no bytes to read: the hit rate needs a non-empty dataset.")
    return sized, total


def _cgroup(in_place: bool | None, notes: list[str]) -> MemoryCgroup | None:
    """A new memory cgroup to read in, or None to read in place (see measure_hit_rate)."""
    if in_place is True:
        return None
    try:
        return MemoryCgroup().__enter__()
    except NotPermitted as e:
        if in_place is False:
            raise
        notes.append(f"{e}: measured in place (this process's own cgroup and its limit)")
        return None


def measure_hit_rate(files: Sequence[tuple[str, int]] | Sequence[str], room_bytes: int, *,
                     epochs: int = 3, threads: int = 4, seed: int = 0,
                     max_bytes: int = 2 * 2**30, in_place: bool | None = None,
                     timeout_s: float = 1800.0,
                     progress: Callable[[str], None] | None = None) -> HitRate:
    """Read `files` (paths, or (path, bytes)) `epochs` times in a new random order each
    epoch with `room_bytes` of page cache, and count the hits (see the module doc).

    max_bytes: a dataset larger than this is measured on a seeded sample of its files of
    about this size, with the room scaled by the same share (the hit rate under random
    order follows the share c; the result says `sampled`).
    in_place: None makes a cgroup where one can be made, else reads in place (this
    process's own cgroup, whose limit then binds); True always in place, False never
    (NotPermitted where no cgroup can be made).
    """
    if epochs < 2:
        raise UsageError(f"epochs must be at least 2 (the first fills the cache), but got {epochs}.")
    if room_bytes < 0:
        raise UsageError(f"room_bytes must not be negative, but got {room_bytes:,}.")
    say = progress or (lambda _m: None)
    sized, total = _sized(files)
    chosen, sampled = _sample(sized, max_bytes, seed, total)
    epoch_bytes = sum(n for _, n in chosen)
    room = int(room_bytes * epoch_bytes / total) if sampled else int(room_bytes)
    notes: list[str] = []
    if sampled:
        notes.append(f"measured on a seeded sample of {len(chosen):,} of {len(sized):,} files "
                     f"({epoch_bytes / 2**20:,.0f} MiB), the cache room scaled alike to "
                     f"{room / 2**20:,.0f} MiB")
    cg = _cgroup(in_place, notes)
    try:
        left = _evict([f for f, _ in chosen])
        if left:
            notes.append(f"{left:.0%} of the files' sampled pages stayed cached after eviction "
                         "(mapped elsewhere): those hits cost this limit nothing")
        page = os.sysconf("SC_PAGE_SIZE")
        spec = {"files": [f for f, _ in chosen], "epochs": epochs, "seed": seed,
                "threads": max(1, threads),
                "pages_bytes": sum(-(-n // page) * page for _, n in chosen)}
        proc = subprocess.Popen([sys.executable, "-I", "-c", _READER], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True,
                                preexec_fn=cg.preexec() if cg is not None else None)
        try:
            return _drive(proc, cg, spec, room, epoch_bytes, sampled, notes, say, timeout_s)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    finally:
        if cg is not None:
            cg.remove()


def _in_place_over(h: float, c: float, room: int, notes: list[str]) -> float:
    """The figure for a rate measured in place over the cache's share `c`. In place the
    reader has the cgroup's whole free memory, not the job's room (the job's own memory
    is not held): over `c`, more than any random order can hit with that room, it
    measured that larger cache (a review: 94 % at a share of 74 %). The model of the room
    is the figure then."""
    notes.append(f"in place the reader had more page cache than the job's "
                 f"{room / 2**20:,.0f} MiB (it hit {h:.0%}, over the cache's share {c:.0%}, "
                 f"the most a random order can): the LRU model's {lru_bound(c):.0%} for that "
                 "share is used instead")
    return lru_bound(c)


def _row_notes(rows: list[dict[str, Any]], notes: list[str]) -> None:
    """What the epochs' rows say beside the figure: read-ahead reclaimed, a first epoch
    that already hit."""
    over = [r for r in rows[1:] if (r["from_storage"] or 0) > 1.0]
    if over:
        notes.append("epoch(s) " + ", ".join(str(r["epoch"]) for r in over) + " read more "
                     "from storage than they delivered (up to "
                     f"{max(r['from_storage'] for r in over):.0%}): read-ahead pages were "
                     "reclaimed before they were read")
    if rows and rows[0]["hit_rate"] is not None and rows[0]["hit_rate"] > 0.1:
        notes.append(f"the first epoch already hit {rows[0]['hit_rate']:.0%}: not every page "
                     "was evicted before it")


def _drive(proc: subprocess.Popen, cg: MemoryCgroup | None, spec: dict[str, Any], room: int,
           epoch_bytes: int, sampled: bool, notes: list[str], say: Callable[[str], None],
           timeout_s: float) -> HitRate:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(spec) + "\n")
    proc.stdin.flush()
    if proc.stdout.readline().strip() != "ready":
        raise AutotuneError(f"the hit-rate reader (pid {proc.pid}) stopped before it was "
                            f"ready (exit {proc.poll()})")
    reader = limit = None
    if cg is not None:
        reader = cg.own_bytes()
        limit = reader + room
        cg.set_limit(limit)
    say(f"hit rate: reading {len(spec['files']):,} files ({epoch_bytes / 2**20:,.0f} MiB) "
        f"{spec['epochs']} times with {room / 2**20:,.0f} MiB of page cache"
        + (f" (cgroup {cg.path}, limit {limit / 2**20:,.0f} MiB)" if cg is not None else
           " (in place)"))
    proc.stdin.write("go\n")
    proc.stdin.flush()
    deadline = time.monotonic() + timeout_s
    rows: list[dict[str, Any]] = []
    for line in proc.stdout:
        r = json.loads(line)
        # A miss reads whole pages: a file's last partial page counts in full in
        # read_bytes, so misses are set against the page-rounded bytes delivered.
        r["pages_bytes"] = spec["pages_bytes"] if r["delivered"] == epoch_bytes else r["delivered"]
        # Over 1 where read-ahead pages were reclaimed before they were read (a tight
        # cgroup): storage then serves more than the data, and nothing hits.
        r["from_storage"] = r["read_bytes"] / r["pages_bytes"] if r["pages_bytes"] else None
        r["hit_rate"] = None if r["from_storage"] is None else max(0.0, 1.0 - r["from_storage"])
        rows.append(r)
        say(f"hit rate: epoch {r['epoch']}: {r['delivered'] / 2**20:,.0f} MiB delivered, "
            f"{r['read_bytes'] / 2**20:,.0f} MiB from storage ({r['seconds']:.1f} s)")
        if time.monotonic() > deadline:
            break
    rc = proc.wait(timeout=30)
    if len(rows) < spec["epochs"]:
        why = ("killed by the OOM killer or a signal" if rc and rc < 0 else f"exit {rc}")
        raise AutotuneError(f"the hit-rate reader ended after {len(rows)} of "
                            f"{spec['epochs']} epochs ({why})"
                            + (f"; its cgroup's limit was {limit:,} bytes" if limit else ""))
    later = [r["hit_rate"] for r in rows[1:] if r["hit_rate"] is not None]
    h = sum(later) / len(later) if later else 0.0
    c = min(1.0, room / spec["pages_bytes"]) if spec["pages_bytes"] else 1.0
    if cg is None and h > c:
        h = _in_place_over(h, c, room, notes)
    _row_notes(rows, notes)
    return HitRate(hit_rate=h, cache_share=c, lru_bound=lru_bound(c), dataset_bytes=epoch_bytes,
                   room_bytes=room, method="cgroup" if cg is not None else "in place",
                   cgroup=str(cg.path) if cg is not None and cg.path else None,
                   reader_bytes=reader, limit_bytes=limit, files=len(spec["files"]),
                   sampled=sampled, epochs=rows, notes=notes)
