"""The three ceilings a loader configuration cannot beat (DESIGN.md, in images/s).

* storage: the cold replay's files/s at its best concurrency (`autotune probe`), one file
  per image, cross-checked against fio's sequential bandwidth / mean file size;
* decode: the sample pipeline's rate on one core from memory (no I/O), times the usable
  cores;
* demand: batch size / step time, what the (emulated) training step can consume.

The smallest one names the bottleneck when the best configuration reaches it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from autotune.cpus import cpu_limit


def cpu_quota_cores() -> float | None:
    """Cores allowed by the smallest cgroup CPU quota on this process's own cgroup and its
    ancestors (containers, Slurm, systemd slices), or None when unlimited."""
    q = cpu_limit().quota
    return None if q is None else q.cores


def effective_cores() -> int:
    """Usable whole cores (affinity mask and cgroup quotas, rounded down): autotune.cpus."""
    return cpu_limit().whole


OVERTAKEN = 1.15  # a trial this much above a ceiling shows the ceiling was wrong


@dataclass
class Ceilings:
    storage: float | None
    decode: float | None
    demand: float | None
    cores: int
    decode_per_core: float | None = None
    storage_best_concurrency: int | None = None
    evidence: list[str] = field(default_factory=list)
    probe: dict[str, Any] | None = None
    # Ceilings a measured trial beat by more than OVERTAKEN: now "at least" that trial's
    # figure (name -> why), and no longer a reason to stop the search.
    lower_bounds: dict[str, str] = field(default_factory=dict)

    def finite(self) -> dict[str, float]:
        return {k: v for k, v in (("storage", self.storage), ("decode", self.decode),
                                  ("demand", self.demand)) if v}

    def smallest(self, *, firm: bool = False) -> tuple[str, float] | None:
        """The lowest ceiling; firm=True leaves out those a trial has overtaken."""
        f = self.finite()
        if firm:
            f = {k: v for k, v in f.items() if k not in self.lower_bounds}
        if not f:
            return None
        k = min(f, key=f.__getitem__)
        return k, f[k]

    def to_dict(self) -> dict[str, Any]:
        s = self.smallest()
        return {"storage": self.storage, "decode": self.decode, "demand": self.demand,
                "smallest": s[0] if s else None, "cores": self.cores,
                "decode_per_core": self.decode_per_core,
                "storage_best_concurrency": self.storage_best_concurrency,
                "evidence": self.evidence, "lower_bounds": self.lower_bounds}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Ceilings:
        """Inverse of to_dict (a resumed study's ceilings; the probe stays in probe.json)."""
        return cls(storage=d.get("storage"), decode=d.get("decode"), demand=d.get("demand"),
                   cores=d.get("cores", 1), decode_per_core=d.get("decode_per_core"),
                   storage_best_concurrency=d.get("storage_best_concurrency"),
                   evidence=d.get("evidence", []), probe=None)

    def revise(self, number: int, images_per_s: float | None) -> str | None:
        """Take a measured configuration into account: a storage or decode ceiling it beats
        by more than OVERTAKEN was an underestimate. It becomes that figure, marked as a
        lower bound (and said why); returns the note when one was overtaken now."""
        if not images_per_s:
            return None
        note = None
        for name in ("storage", "decode"):
            v = getattr(self, name)
            if not v:
                continue
            if name in self.lower_bounds:
                setattr(self, name, max(v, images_per_s))
            elif images_per_s > OVERTAKEN * v:
                who = "the baseline" if number < 0 else f"trial {number}"
                why = (" A cold replay of a few seconds can be spent mostly on the "
                       "filesystem's metadata (directory and inode blocks) that a long run "
                       "reads once; under a cgroup cap each of ext4's inode-readahead blocks "
                       "is charged as one I/O." if name == "storage" else "")
                note = (f"the {name} ceiling {v:,.0f} images/s was an underestimate: {who} "
                        f"measured {images_per_s:,.0f}; taken as at least that from here on, "
                        f"and no longer a reason to stop the search.{why}")
                setattr(self, name, images_per_s)
                self.lower_bounds[name] = note
                self.evidence.append(note)
        return note


def sample_blobs(source: Any, n: int = 200, seed: int = 0) -> list[bytes]:
    """Encoded bytes of up to `n` random samples of a SampleSource (unreadable ones skipped)."""
    if getattr(source, "iterable", False):  # shards: the first n records, read in order
        blobs = []
        for data, _label, _where in source.records():
            blobs.append(data)
            if len(blobs) >= n:
                break
        return blobs
    rng = random.Random(seed)
    idx = list(range(len(source)))
    pick = idx if len(idx) <= n else rng.sample(idx, n)
    blobs = []
    for i in pick:
        try:
            blobs.append(source.read(i)[0])
        except Exception:  # noqa: BLE001 - a corrupt sample is not a decode-rate figure
            continue
    return blobs


def decode_rate_per_core(blobs: list[bytes], transform: Callable[[bytes], Any], *,
                         seconds: float = 3.0) -> tuple[float, int]:
    """Images/s of `transform` on one core, from bytes already in memory (no I/O timed),
    decoding round-robin for about `seconds`. Returns (rate, images decoded)."""
    if not blobs:
        return 0.0, 0
    transform(blobs[0])  # first call imports numpy/torch/PIL plugins: not decode cost
    n = 0
    t0 = time.process_time()
    w0 = time.monotonic()
    while True:
        transform(blobs[n % len(blobs)])
        n += 1
        if time.monotonic() - w0 >= seconds and n >= min(len(blobs), 20):
            break
    # CPU time, not wall time: another process on a shared machine must not lower the
    # per-core figure (it would lower the wall-clock one).
    cpu = max(time.process_time() - t0, 1e-9)
    return n / cpu, n


def demand_ceiling(batch_size: int, compute_ms: float) -> float | None:
    """Images/s the step can consume; None when there is no step (infinite demand)."""
    return batch_size * 1000.0 / compute_ms if compute_ms > 0 else None


def measure(*, transform: Callable[[bytes], Any], blobs: list[bytes], batch_size: int, compute_ms: float, probe: Any | None,
            decode_seconds: float = 3.0) -> Ceilings:
    """All three ceilings. `probe` is a ProbeResult (or None when storage was not probed)."""
    limit = cpu_limit()
    cores = limit.whole
    ev: list[str] = []
    storage = best_c = None
    probe_d = None
    if probe is not None:
        probe_d = probe.to_dict()
        if probe.replay is not None:
            best = probe.replay.best
            storage, best_c = best.files_per_s, best.concurrency
            ev.append(f"storage: cold replay of {probe.replay.files_sampled} files peaks at "
                      f"{storage:,.0f} files/s with {best_c} reads in flight "
                      f"(p50 {best.lat_p50_ms:.2f} ms per file)")
            ev.extend(f"storage: {e}" for e in probe.verdict.get("evidence", [])
                      if e.startswith("cross-check"))
        else:
            ev.append(f"storage: not measured ({probe.replay_error})")
    per_core, n = decode_rate_per_core(blobs, transform, seconds=decode_seconds)
    # CPU time, not whole cores: a 1.5-core quota decodes 1.5 cores' worth.
    decode = per_core * limit.cores if per_core else None
    if decode:
        ev.append(f"decode: {per_core:,.0f} images/s per core from memory ({n} decodes) x "
                  f"{limit.cores:g} usable core(s) ({limit.source}) = {decode:,.0f} images/s")
    demand = demand_ceiling(batch_size, compute_ms)
    if demand:
        ev.append(f"demand: batch {batch_size} / {compute_ms:g} ms step = {demand:,.0f} images/s")
    else:
        ev.append("demand: no step (compute 0): the loader alone is measured")
    return Ceilings(storage=storage, decode=decode, demand=demand, cores=cores,
                    decode_per_core=per_core or None, storage_best_concurrency=best_c,
                    evidence=ev, probe=probe_d)
