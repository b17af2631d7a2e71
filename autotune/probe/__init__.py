"""`autotune probe`: what the storage under a dataset can deliver.

Three parts, each usable alone: fio on a scratch file (`autotune.probe.fio`), a cold
replay of the dataset's own files (`autotune.probe.replay`) and a classification of the
storage (`autotune.probe.classify`). `probe()` runs them and adds the storage's verdict
(the rules of autotune.verdict.storage). A part that cannot run (fio missing, read-only
filesystem) is reported with its reason; the others still run.
"""

from __future__ import annotations

import os
import stat
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
from autotune.verdict.storage import SMALL_FILE_MIN_IOPS, storage_verdict

__all__ = ["ProbeResult", "probe", "SMALL_FILE_MIN_IOPS"]


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
    sdir, warnings = _scratch_dir(p, scratch)
    fio_res, fio_err = (_run_fio(sdir, size, runtime, progress) if run_fio
                        else (None, "skipped (--no-fio)"))
    rp, rp_err = (_run_replay(p, replay_files, concurrency, replay_seconds, seed, cold, progress)
                  if run_replay else (None, "skipped (--no-replay)"))
    samples = _sample_replay(p, replay_seconds, cold, seed, progress, warnings) \
        if run_replay else None
    fs = classify(p, fio_res, rp)
    if fio_res:
        warnings.extend(fio_res.warnings)
    if rp:
        warnings.extend(rp.warnings)
    ram = ram_backed(p)
    verdict = storage_verdict(
        fs, fio_res, rp, samples, cold=bool(cold and rp is not None and ram is None),
        cold_reason=ram if ram else (None if cold else "--warm: the cache was kept"),
        cap=_read_cap(p))
    if ram and rp is not None:
        rp.cold_method = "RAM-backed (never cold)"
        warnings.append(f"NOT COLD: {ram}; the replay measured RAM, not storage.")
    if environment is None:
        from autotune.environment import read_environment

        environment = read_environment(p, scratch=scratch)
    return ProbeResult(path=str(p), filesystem=fs, fio=fio_res, fio_error=fio_err, replay=rp,
                       replay_error=rp_err, verdict=verdict,
                       scratch_dir=str(sdir) if run_fio else None,
                       seconds=time.monotonic() - t0, warnings=warnings, samples=samples,
                       environment=environment.to_dict())


def _read_cap(p: Path) -> Any:
    """This process's cgroup read cap on the disk holding `p` (autotune.readcap), if any:
    what a job in this cgroup (a container's --device-read-bps) is held to. The disk is
    the one the replay counts reads on (block_device_for)."""
    from autotune.readcap import read_cap

    return read_cap(block_device_for(p))


def _run_fio(sdir: Path, size: int, runtime: float,
             progress: Callable[[str], None] | None) -> tuple[FioResult | None, str | None]:
    """fio on a scratch file in `sdir`, or why it could not run."""
    from autotune.probe import fio as fio_mod

    if not os.access(sdir, os.W_OK):
        return None, (f"{sdir} is not writable ({_why_unwritable(sdir)}); fio needs a "
                      "scratch file there: pass --scratch DIR on the same storage")
    dev = block_device_for(sdir)
    try:
        return fio_mod.measure(sdir, size=size, runtime=runtime,
                               device=dev.name if dev else None, progress=progress), None
    except AutotuneError as e:
        return None, str(e)


def _why_unwritable(d: Path) -> str:
    """Why this user cannot write `d`: a read-only mount, or the folder's permissions."""
    try:
        if os.statvfs(d).f_flag & os.ST_RDONLY:
            return "a read-only filesystem"
        st = d.stat()
    except OSError as e:
        return e.strerror or "cannot be checked"
    return (f"its permissions: mode {stat.filemode(st.st_mode)}, owner uid {st.st_uid}, "
            f"this process uid {os.geteuid()}")


def _run_replay(p: Path, max_files: int, concurrency: Sequence[int], seconds: float, seed: int,
                cold: bool, progress: Callable[[str], None] | None,
                ) -> tuple[ReplayResult | None, str | None]:
    """The cold replay of the dataset's own files, or why it could not run."""
    from autotune.probe.replay import replay

    try:
        return replay(p, max_files=max_files, concurrency=concurrency, seconds_per_level=seconds,
                      seed=seed, cold=cold, progress=progress), None
    except AutotuneError as e:
        return None, str(e)


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
