"""`autotune probe`: what the storage under a dataset can deliver.

Three parts, each usable alone: fio on a scratch file (`autotune.probe.fio`), a cold
replay of the dataset's own files (`autotune.probe.replay`) and a classification of the
storage (`autotune.probe.classify`). `probe()` runs them and adds a verdict. A part that
cannot run (fio missing, read-only filesystem) is reported with its reason; the others
still run.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.blockdev import block_device_for, mount_for
from autotune.cache import ram_backed
from autotune.errors import AutotuneError, UsageError
from autotune.probe.classify import FilesystemInfo, classify
from autotune.probe.fio import FioResult
from autotune.probe.replay import DEFAULT_CONCURRENCY, ReplayResult
from autotune.probe.samples import SampleReplay

__all__ = ["ProbeResult", "probe", "SMALL_FILE_MIN_IOPS"]

# The seed article's rule of thumb: small-file image training wants > 50k random IOPS.
SMALL_FILE_MIN_IOPS = 50_000
# A file read whole is served in readahead-sized requests (128 KiB by default on Linux).
READAHEAD_BYTES = 128 * 1024


@dataclass
class ProbeResult:
    path: str
    filesystem: FilesystemInfo
    fio: FioResult | None
    fio_error: str | None
    replay: ReplayResult | None
    replay_error: str | None
    verdict: dict
    scratch_dir: str | None
    seconds: float
    warnings: list[str] = field(default_factory=list)
    # A conversion (manifest.json): cold reads through its format's reader, samples/s.
    samples: SampleReplay | None = None
    # What the job's container allows (autotune.environment.Environment.to_dict()).
    environment: dict | None = None

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "filesystem": self.filesystem.to_dict(),
            "fio": self.fio.to_dict() if self.fio else None,
            "fio_error": self.fio_error,
            "replay": self.replay.to_dict() if self.replay else None,
            "replay_error": self.replay_error,
            "verdict": self.verdict,
            "scratch_dir": self.scratch_dir,
            "seconds": round(self.seconds, 2),
            "warnings": self.warnings,
            "samples": self.samples.to_dict() if self.samples else None,
            "environment": self.environment,
        }


def _verdict(fs: FilesystemInfo, fio: FioResult | None, rp: ReplayResult | None) -> dict:
    """Storage ceiling and rules, each with the figures behind it."""
    evidence: list[str] = []
    advice: list[str] = []
    rules = []
    ceiling = None
    best_c = None
    if rp is not None:
        best = rp.best
        lv, which = rp.ceiling
        ceiling, best_c = lv.files_per_s, lv.concurrency
        one = next((lv for lv in rp.by_concurrency if lv.concurrency == 1), None)
        evidence.append(f"replay of {rp.files_sampled} files (mean {rp.mean_file_bytes / 1e3:.0f} KB, "
                        f"{rp.cold_method}): best {best.files_per_s:,.0f} files/s at concurrency "
                        f"{best.concurrency}, p50 {best.lat_p50_ms:.2f} ms")
        st = rp.best_steady
        if st is not None:
            evidence.append(f"steady state (page cache dropped, inodes kept): best "
                            f"{st.files_per_s:,.0f} files/s at concurrency {st.concurrency} "
                            f"({st.files_per_s / max(best.files_per_s, 1e-9):.1f}x the fully "
                            "cold pass, whose metadata reads a long run pays once); the "
                            "storage ceiling uses it")
        if one is not None and best.concurrency > 1 and best.files_per_s > 2 * one.files_per_s:
            evidence.append(f"latency-bound: {one.files_per_s:,.0f} files/s at concurrency 1 "
                            f"grows to {best.files_per_s:,.0f} at {best.concurrency}")
            advice.append(f"this storage needs about {best.concurrency} reads in flight: use at "
                          f"least {min(best.concurrency, 16)} DataLoader workers, or convert "
                          "to shards (`autotune convert`) so each read is large")
    if fio is not None:
        r, s = fio.rand_read, fio.seq_read
        label = "" if fio.direct else (
            f" (buffered; {fio.device} served {r.device_share:.0%} of the random job's bytes)"
            if r.device_share is not None else " (buffered)")
        if not fio.plausible:
            evidence.append("fio figures failed the plausibility check and are ignored: "
                            + "; ".join(fio.warnings))
        else:
            ok = r.iops > SMALL_FILE_MIN_IOPS
            rules.append({"rule": f"random 4 KiB read IOPS > {SMALL_FILE_MIN_IOPS:,} "
                                  "(small-file image training)",
                          "value": round(r.iops), "pass": ok})
            evidence.append(f"fio{label}: {r.iops:,.0f} random 4 KiB IOPS "
                            f"(p99 {r.lat_p99_ms or 0:.2f} ms at depth 256), "
                            f"{s.bw_mib_s:,.0f} MiB/s sequential")
            if not ok:
                advice.append(f"{r.iops:,.0f} random IOPS is below {SMALL_FILE_MIN_IOPS:,}: "
                              "small random reads will starve a fast GPU; repack into shards "
                              "(`autotune convert`) and stage them on local NVMe (`autotune stage`)")
            if rp is not None and rp.mean_file_bytes > 0:
                mean = rp.mean_file_bytes
                bw_bound = s.bw_mib_s * 2**20 / mean
                ios_per_file = 1 + math.ceil(mean / READAHEAD_BYTES)
                iops_bound = r.iops / ios_per_file
                evidence.append(f"cross-check: sequential bandwidth / mean file = {bw_bound:,.0f} "
                                f"files/s; random IOPS / {ios_per_file} I/Os per file = "
                                f"{iops_bound:,.0f} files/s")
                if ceiling is not None and ceiling > 1.5 * bw_bound and fs.klass != "memory":
                    advice.append(f"the replay ({ceiling:,.0f} files/s) beat the sequential "
                                  f"bandwidth bound ({bw_bound:,.0f}): its files were probably "
                                  "served from a cache (a host or server cache autotune cannot "
                                  "drop); the storage ceiling may be lower when the cache is cold")
    if ceiling is None and fio is not None and fio.plausible and rp is None:
        evidence.append("no replay: the ceiling in files/s is unknown (only fio's figures)")
    summary = (f"{fs.klass} storage ({fs.type or '?'}"
               + (f" on {fs.device}" if fs.device else "") + ")")
    if ceiling is not None:
        summary += f": at most ~{ceiling:,.0f} files/s for this dataset's files"
    return {"class": fs.klass, "storage_files_per_s": None if ceiling is None else round(ceiling, 1),
            "storage_pass": rp.ceiling[1] if rp is not None else None,
            "storage_method": rp.ceiling_method if rp is not None else None,
            "best_concurrency": best_c, "rules": rules, "evidence": evidence,
            "advice": advice, "summary": summary}


def _scratch_dir(path: Path, scratch: str | os.PathLike[str] | None) -> tuple[Path, list[str]]:
    warnings: list[str] = []
    if scratch is not None:
        d = Path(scratch)
        if not d.is_dir():
            raise UsageError(f"scratch directory {d}: not a directory.", setting="scratch")
        a, b = mount_for(d), mount_for(path)
        if a and b and a.mountpoint != b.mountpoint:
            warnings.append(f"--scratch {d} is on {a.mountpoint} ({a.fstype}), not on "
                            f"{b.mountpoint} ({b.fstype}) like {path}: fio measures the scratch's storage")
        return d, warnings
    return (path if path.is_dir() else path.parent), warnings


def probe(path: str | os.PathLike[str], *, size: int = 2**30, runtime: float = 10.0,
          scratch: str | os.PathLike[str] | None = None, replay_files: int = 2000,
          concurrency: Sequence[int] = DEFAULT_CONCURRENCY, replay_seconds: float = 10.0,
          run_fio: bool = True, run_replay: bool = True, cold: bool = True, seed: int = 0,
          progress: Callable[[str], None] | None = None,
          environment: Any = None) -> ProbeResult:
    """Measure the storage holding `path` (a dataset directory or file; an s3:// prefix is
    autotune.probe.objstore.probe_objects). `environment`: the command's
    `autotune.environment.Environment` (read here when not given), kept in the result."""
    t0 = time.monotonic()
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{p}: no such file or directory.")
    fio_res: FioResult | None = None
    fio_err: str | None = None
    rp: ReplayResult | None = None
    rp_err: str | None = None
    sdir, warnings = _scratch_dir(p, scratch)
    if run_fio:
        from autotune.probe import fio as fio_mod

        if not os.access(sdir, os.W_OK):
            fio_err = (f"{sdir} is not writable (read-only filesystem?); fio needs a scratch "
                       "file there: pass --scratch DIR on the same storage")
        else:
            dev = block_device_for(sdir)
            try:
                fio_res = fio_mod.measure(sdir, size=size, runtime=runtime,
                                          device=dev.name if dev else None, progress=progress)
            except AutotuneError as e:
                fio_err = str(e)
    else:
        fio_err = "skipped (--no-fio)"
    if run_replay:
        from autotune.probe.replay import replay

        try:
            rp = replay(p, max_files=replay_files, concurrency=concurrency,
                        seconds_per_level=replay_seconds, seed=seed, cold=cold,
                        progress=progress)
        except AutotuneError as e:
            rp_err = str(e)
    else:
        rp_err = "skipped (--no-replay)"
    samples = _sample_replay(p, replay_seconds, cold, seed, progress, warnings) \
        if run_replay else None
    fs = classify(p, fio_res, rp)
    if fio_res:
        warnings.extend(fio_res.warnings)
    if rp:
        warnings.extend(rp.warnings)
    verdict = _verdict(fs, fio_res, rp)
    ram = ram_backed(p)
    verdict["cold"] = bool(cold and rp is not None and ram is None)
    verdict["cold_reason"] = ram if ram else (None if cold else "--warm: the cache was kept")
    if ram and rp is not None:
        rp.cold_method = "RAM-backed (never cold)"
        warnings.append(f"NOT COLD: {ram}; the replay measured RAM, not storage.")
    if samples is not None and samples.by_concurrency:
        b = samples.best
        verdict["storage_samples_per_s"] = round(b.samples_per_s, 1)
        verdict["samples_best_concurrency"] = b.concurrency
        verdict["evidence"].insert(0, f"{samples.format} conversion read through its reader "
                                   f"(bytes only, {samples.cold_method}): best "
                                   f"{b.samples_per_s:,.0f} samples/s with {b.concurrency} "
                                   "reader(s): its storage ceiling in samples, not files")
    if environment is None:
        from autotune.environment import read_environment

        environment = read_environment(p, scratch=scratch)
    return ProbeResult(path=str(p), filesystem=fs, fio=fio_res, fio_error=fio_err, replay=rp,
                       replay_error=rp_err, verdict=verdict,
                       scratch_dir=str(sdir) if run_fio else None,
                       seconds=time.monotonic() - t0, warnings=warnings, samples=samples,
                       environment=environment.to_dict())


def _sample_replay(p: Path, seconds: float, cold: bool, seed: int,
                   progress: Callable[[str], None] | None,
                   warnings: list[str]) -> SampleReplay | None:
    """For a conversion (a format other than an image folder): samples/s through its reader."""
    from autotune_converters import registry

    try:
        if not p.is_dir() or registry.detect(p) == "folder":
            return None
        from autotune.probe.samples import sample_replay

        return sample_replay(registry.open_source(p), seconds_per_level=seconds, cold=cold,
                             seed=seed, progress=progress)
    except AutotuneError as e:
        warnings.append(f"sample replay: not run ({e})")
        return None
