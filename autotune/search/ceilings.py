"""The three ceilings a loader configuration cannot beat (DESIGN.md, in images/s).

* storage: the cold replay's files/s at its best concurrency (`autotune probe`), one file
  per image, cross-checked against fio's sequential bandwidth / mean file size;
* decode: the sample pipeline's rate on one core from memory (no I/O), times the usable
  cores;
* demand: batch size / step time, what the (emulated) training step can consume.

The smallest one names the bottleneck when the best configuration reaches it.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterator
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
    """The three ceilings (images/s), each measured apart from the trials they judge.

    A ceiling a trial overtakes by more than OVERTAKEN is a wrong measurement: it is said
    so (`lower_bounds`: the measured value, the trial figure it is at least, and why) and
    is never used as a ceiling again; it is never replaced by the trials' own figure.
    """

    storage: float | None
    decode: float | None
    demand: float | None
    cores: int
    decode_per_core: float | None = None
    storage_best_concurrency: int | None = None
    evidence: list[str] = field(default_factory=list)
    probe: dict[str, Any] | None = None
    lower_bounds: dict[str, dict[str, Any]] = field(default_factory=dict)
    storage_unit: str = "files/s"     # loose files: files/s = images/s; a conversion: samples/s
    samples: int | None = None        # the dataset's size (for the minimum window)
    ram_backed: str | None = None     # why the dataset can never be read cold
    iterable: bool = False            # the dataset is an IterableDataset (no shuffle=)

    def finite(self) -> dict[str, float]:
        """The ceilings that hold (measured, and not overtaken)."""
        return {k: v for k, v in (("storage", self.storage), ("decode", self.decode),
                                  ("demand", self.demand)) if v and k not in self.lower_bounds}

    def smallest(self, *, firm: bool = False) -> tuple[str, float] | None:
        """The lowest ceiling that holds (`firm` is kept for callers: overtaken ceilings
        are never ceilings)."""
        f = self.finite()
        if not f:
            return None
        k = min(f, key=f.__getitem__)
        return k, f[k]

    def valid(self, name: str) -> float | None:
        return self.finite().get(name)

    def to_dict(self) -> dict[str, Any]:
        s = self.smallest()
        return {"storage": self.valid("storage"), "decode": self.valid("decode"),
                "demand": self.demand, "smallest": s[0] if s else None, "cores": self.cores,
                "decode_per_core": self.decode_per_core,
                "storage_best_concurrency": self.storage_best_concurrency,
                "storage_unit": self.storage_unit, "samples": self.samples,
                "ram_backed": self.ram_backed, "iterable": self.iterable,
                "evidence": self.evidence,
                "lower_bounds": self.lower_bounds,
                "measured": {"storage": self.storage, "decode": self.decode}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Ceilings:
        """Inverse of to_dict (a resumed study's ceilings; its probe is kept apart)."""
        m = d.get("measured") or {}
        lb = d.get("lower_bounds") or {}
        return cls(storage=m.get("storage", d.get("storage")), decode=m.get("decode", d.get("decode")),
                   demand=d.get("demand"), cores=d.get("cores", 1),
                   decode_per_core=d.get("decode_per_core"),
                   storage_best_concurrency=d.get("storage_best_concurrency"),
                   evidence=d.get("evidence", []), probe=None,
                   lower_bounds={k: v for k, v in lb.items() if isinstance(v, dict)},
                   storage_unit=d.get("storage_unit", "files/s"), samples=d.get("samples"),
                   ram_backed=d.get("ram_backed"), iterable=bool(d.get("iterable")))

    def revise(self, number: int, images_per_s: float | None) -> str | None:
        """Take a measured configuration into account: a storage or decode ceiling it beats
        by more than OVERTAKEN was a wrong measurement, said so (and why it may be), and is
        no ceiling from here on. Returns the note when one was overtaken now."""
        if not images_per_s:
            return None
        note = None
        for name in ("storage", "decode"):
            v = getattr(self, name)
            if not v:
                continue
            lb = self.lower_bounds.get(name)
            if lb is not None:
                lb["at_least"] = max(lb["at_least"], images_per_s)
            elif images_per_s > OVERTAKEN * v:
                who = "the baseline" if number < 0 else f"trial {number}"
                why = (" A cold replay of a few seconds can be spent mostly on the "
                       "filesystem's metadata (directory and inode blocks) that a long run "
                       "reads once; under a cgroup cap each of ext4's inode-readahead blocks "
                       "is charged as one I/O; and a cache autotune cannot drop (a host's, a "
                       "server's) serves a long run better than a short sample."
                       if name == "storage" else
                       " The decode rate is measured on one core from memory: a busy "
                       "machine during that measurement lowers it.")
                note = (f"the {name} ceiling {v:,.0f} images/s was a wrong measurement: {who} "
                        f"measured {images_per_s:,.0f}; it is no ceiling from here on (not "
                        f"replaced by the trials' figure) and stops nothing.{why}")
                self.lower_bounds[name] = {"measured": v, "at_least": images_per_s,
                                           "reason": note}
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
    with _one_torch_thread():
        return _decode_loop(blobs, transform, seconds)


@contextlib.contextmanager
def _one_torch_thread() -> Iterator[None]:
    """One torch thread, as in a DataLoader worker (torch sets it there): with torch's
    default thread pool the CPU time of a resize spreads over every core, and a "per
    core" figure would come out a fraction of a worker's."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _decode_loop(blobs: list[bytes], transform: Callable[[bytes], Any],
                 seconds: float) -> tuple[float, int]:
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


def factory_rate_per_core(dataset: Any, *, n: int = 200, seconds: float = 3.0,
                          seed: int = 0) -> tuple[float, int]:
    """Samples/s per core of a user's dataset (its own reading and transform), its files
    warm: up to `n` samples are read once (pages cached), then again for about `seconds`,
    timed in CPU time on one torch thread as a worker runs it."""
    import torch
    import torch.utils.data

    if isinstance(dataset, torch.utils.data.IterableDataset):
        def items() -> Any:
            for k, x in enumerate(dataset):
                if k >= n:
                    return
                yield x
    else:
        idx = list(range(len(dataset)))
        pick = idx if len(idx) <= n else random.Random(seed).sample(idx, n)

        def items() -> Any:
            return (dataset[i] for i in pick)

    with _one_torch_thread():
        for _ in items():   # warms the files and the libraries: not decode cost
            pass
        k, t0, w0 = 0, time.process_time(), time.monotonic()
        while time.monotonic() - w0 < seconds:
            before = k
            for _ in items():
                k += 1
            if k == before:
                break
        return k / max(time.process_time() - t0, 1e-9), k


def demand_ceiling(batch_size: int, compute_ms: float) -> float | None:
    """Images/s the step can consume; None when there is no step (infinite demand)."""
    return batch_size * 1000.0 / compute_ms if compute_ms > 0 else None


def measure(*, transform: Callable[[bytes], Any], blobs: list[bytes], batch_size: int, compute_ms: float, probe: Any | None,
            decode_seconds: float = 3.0, samples: int | None = None,
            user_dataset: Any = None, step: str | None = None) -> Ceilings:
    """All three ceilings. `probe` is a ProbeResult (or None when storage was not probed);
    a conversion's storage ceiling is its samples/s through the format's reader."""
    limit = cpu_limit()
    cores = limit.whole
    storage, best_c, unit, ev = _storage_ceiling(probe)
    probe_d = probe.to_dict() if probe is not None else None
    if user_dataset is not None:
        per_core, n = factory_rate_per_core(user_dataset, seconds=decode_seconds)
        how = f"the dataset factory's own samples, files warm ({n} samples)"
    else:
        per_core, n = decode_rate_per_core(blobs, transform, seconds=decode_seconds)
        how = f"from memory ({n} decodes)"
    # CPU time, not whole cores: a 1.5-core quota decodes 1.5 cores' worth.
    decode = per_core * limit.cores if per_core else None
    if decode:
        ev.append(f"decode: {per_core:,.0f} images/s per core {how} x "
                  f"{limit.cores:g} usable core(s) ({limit.source}) = {decode:,.0f} images/s")
    demand = demand_ceiling(batch_size, compute_ms)
    if demand:
        ev.append(f"demand: batch {batch_size} / {compute_ms:g} ms step = {demand:,.0f} images/s")
    elif step:
        # compute_ms is 0 here because the step's time is not known apart from the trials,
        # not because there is no step: each trial runs it.
        ev.append(f"demand: your step ({step}) runs in each trial; its time is measured "
                  "there, not apart, so there is no demand ceiling")
    else:
        ev.append("demand: no step (compute 0): the loader alone is measured")
    return Ceilings(storage=storage, decode=decode, demand=demand, cores=cores,
                    decode_per_core=per_core or None, storage_best_concurrency=best_c,
                    evidence=ev, probe=probe_d, storage_unit=unit, samples=samples)


def _storage_ceiling(probe: Any | None) -> tuple[float | None, int | None, str, list[str]]:
    """(the storage ceiling, its best concurrency, its unit, the evidence) from a probe: an
    s3:// folder's GETs, a conversion's samples through its reader, or the files' replay."""
    ev: list[str] = []
    storage = best_c = None
    unit = "files/s"
    if probe is None:
        return storage, best_c, unit, ev
    obj = getattr(probe, "object", None)
    if obj is not None and probe.samples is not None and probe.samples.by_concurrency:
        b = obj.best  # an s3:// folder: one GET per sample
        storage, best_c, unit = b.gets_per_s, b.concurrency, "samples/s"
        ev.append(f"storage: GETs of the dataset's objects ({obj.endpoint}): {storage:,.0f} "
                  f"samples/s with {best_c} in flight, {b.mib_per_s:,.0f} MiB/s, first "
                  f"byte p50 {b.first_byte_p50_ms:.1f} ms (one object per sample)")
    elif probe.samples is not None and probe.samples.by_concurrency:
        b = probe.samples.best
        storage, best_c, unit = b.samples_per_s, b.concurrency, "samples/s"
        ev.append(f"storage: {probe.samples.format} read cold through its reader (bytes "
                  f"only): {storage:,.0f} samples/s with {best_c} reader(s), "
                  f"{b.mib_per_s:,.0f} MiB/s; a conversion's ceiling is in samples, not "
                  "its shard files")
    elif probe.replay is not None:
        best, which = probe.replay.ceiling
        storage, best_c = best.files_per_s, best.concurrency
        cold = probe.replay.best
        ios = ("" if best.ios_per_file is None else
               f", {best.ios_per_file:.2f} reads per file ({probe.replay.io_source})")
        ev.append(f"storage: {which} replay of {probe.replay.files_sampled} files peaks at "
                  f"{storage:,.0f} files/s with {best_c} reads in flight "
                  f"(p50 {best.lat_p50_ms:.2f} ms per file{ios}); fully cold "
                  f"{cold.files_per_s:,.0f} files/s at {cold.concurrency}")
        ev.extend(f"storage: {e}" for e in probe.verdict.get("evidence", [])
                  if e.startswith("cross-check"))
    else:
        ev.append(f"storage: not measured ({probe.replay_error})")
    return storage, best_c, unit, ev
