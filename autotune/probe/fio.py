"""The real fio, run safely: only on a scratch file autotune created, laid out with data.

Two jobs, as DESIGN.md names them: sequential read (bs 1 MiB, 4 jobs) and random read
(bs 4 KiB, iodepth 64, 4 jobs), direct I/O, JSON output. Safety rules enforced here:

* fio overwrites an existing file it is pointed at, even for a read job (it "lays out"
  a file smaller than the job size). So fio is only ever given a file that this module
  created with O_EXCL inside a directory it created, the job size equals the file size,
  and `allow_file_create=0` stops fio from creating anything itself.
* The file is filled with real, incompressible data and fsynced. A file laid out with
  fallocate keeps unwritten extents that the filesystem answers with zeros without any
  disk I/O: measured on this project's machines, fio then reports ~2 M IOPS and 47 GB/s
  on a disk that serves ~110 k and 1.7 GB/s. Every job is cross-checked against the
  block device's own counters (/proc/diskstats), and such a figure is flagged.
* Without O_DIRECT (a filesystem that refuses it) fio runs buffered and the page cache
  can serve most of a job (measured here: 226 k "IOPS" of which the disk saw 2 % of the
  bytes). The same cross-check applies, stricter; where there is no disk to check against
  (tmpfs: RAM; FUSE and others, buffered) the figures are labelled and never plausible.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from autotune.blockdev import MEMORY_FS, mount_for
from autotune.errors import FioError, ToolMissing
from autotune.monitor.proctree import pid_alive
from autotune_base.fsutil import rmdir_quietly

SCRATCH_PREFIX = ".autotune-probe-"
OWNER_FILE = "owner.pid"
SCRATCH_FILE = "fio-scratch.bin"

# Beyond any single host's storage: a figure above these cannot have come from a device.
MAX_PLAUSIBLE_IOPS = 10_000_000
MAX_PLAUSIBLE_BW_MIB_S = 100 * 1024.0
# Direct reads must reach the disk; below this share of fio's bytes, they did not.
MIN_DEVICE_SHARE = 0.5
# Buffered reads: every byte the page cache serves inflates the figure (by 1/share at
# least), so a figure is the disk's only when the disk served nearly all of fio's bytes.
# Readahead makes the disk read more than fio asked (share > 1), which is fine.
MIN_DEVICE_SHARE_BUFFERED = 0.9

Progress = Callable[[str], None]


@dataclass
class FioJobResult:
    """One fio job's read figures (group-reported over its numjobs)."""

    name: str
    iops: float
    bw_mib_s: float
    lat_mean_ms: float
    lat_p50_ms: float | None
    lat_p99_ms: float | None
    io_bytes: int
    runtime_s: float
    device_bytes: int | None = None  # what the block device saw during the job, if known
    device_share: float | None = None  # device_bytes / io_bytes, when there was a device
    plausible: bool = True
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class FioResult:
    """Both jobs, with how they were run."""

    direct: bool
    ioengine: str
    file_bytes: int
    runtime_s: float
    seq_read: FioJobResult
    rand_read: FioJobResult
    version: str = ""
    warnings: list[str] = field(default_factory=list)
    device: str | None = None      # the disk whose counters cross-checked the jobs
    memory_fs: str | None = None   # "tmpfs" etc. when the scratch file lived in RAM

    @property
    def plausible(self) -> bool:
        return self.seq_read.plausible and self.rand_read.plausible

    def to_dict(self) -> dict:
        d = asdict(self)
        d["plausible"] = self.plausible
        return d


# ---------------------------------------------------------------- parsing

def parse_fio_json(text: str, name: str = "") -> FioJobResult:
    """Parse fio's `--output-format=json` (group_reporting) into read figures.

    fio may print warnings before the JSON document; they are skipped. A job whose
    `error` is set, or that read nothing, raises FioError naming it.
    """
    start = text.find("{")
    if start < 0:
        raise FioError(f"fio printed no JSON for job {name or '?'}: {text.strip()[:200]!r}")
    try:
        doc = json.loads(text[start:])
        job = doc["jobs"][0]
        read = job["read"]
    except (json.JSONDecodeError, KeyError, IndexError, TypeError) as e:
        raise FioError(f"fio output for job {name or '?'} is not the JSON expected "
                       f"({type(e).__name__}: {e}); is this fio >= 3.0?") from e
    if job.get("error"):
        raise FioError(f"fio job {name or job.get('jobname')} failed with error "
                       f"{job['error']} ({os.strerror(job['error'])}).")
    io_bytes = int(read.get("io_bytes", 0))
    if io_bytes <= 0:
        raise FioError(f"fio job {name or job.get('jobname')} read 0 bytes.")
    clat = read.get("clat_ns") or read.get("lat_ns") or {}
    pct = clat.get("percentile") or {}

    def _pct(key: str) -> float | None:
        v = pct.get(key)
        return None if v is None else v / 1e6

    return FioJobResult(
        name=name or job.get("jobname", ""),
        iops=float(read["iops"]),
        bw_mib_s=float(read["bw_bytes"]) / 2**20,
        lat_mean_ms=float(clat.get("mean", 0.0)) / 1e6,
        lat_p50_ms=_pct("50.000000"),
        lat_p99_ms=_pct("99.000000"),
        io_bytes=io_bytes,
        runtime_s=float(read.get("runtime", 0)) / 1e3,
    )


def check_plausible(res: FioJobResult, *, direct: bool, device: str | None,
                    memory_fs: str | None = None) -> FioJobResult:
    """Flag a figure that is not the storage's. Mutates and returns `res`.

    Implausible: beyond any host's storage; RAM-backed (`memory_fs`, e.g. tmpfs); buffered
    with no disk to cross-check (page-cache hits cannot be told apart); or cross-checked
    against `device`'s counters and not served by it (MIN_DEVICE_SHARE direct,
    MIN_DEVICE_SHARE_BUFFERED buffered). Direct reads with no visible disk (NFS, overlay)
    bypassed this host's cache and stand, unchecked.
    """
    def flag(why: str) -> None:
        res.plausible = False
        res.warnings.append(f"{res.name}: {why}")

    if res.iops > MAX_PLAUSIBLE_IOPS or res.bw_mib_s > MAX_PLAUSIBLE_BW_MIB_S:
        flag(f"{res.iops:,.0f} IOPS / {res.bw_mib_s:,.0f} MiB/s is beyond any single host's "
             "storage; the reads were not served by a device.")
    if memory_fs:
        flag(f"RAM-backed: the scratch file is on {memory_fs}, so {res.iops:,.0f} IOPS / "
             f"{res.bw_mib_s:,.0f} MiB/s is memory's speed, not storage's, and cannot pass a "
             "gate; probe a directory on the storage the dataset will be read from.")
        return res
    if device and res.device_bytes is not None:
        res.device_share = res.device_bytes / res.io_bytes if res.io_bytes else 0.0
        floor = MIN_DEVICE_SHARE if direct else MIN_DEVICE_SHARE_BUFFERED
        if res.device_share < floor:
            how = ("the reads did not reach the disk (unwritten extents or a cache)" if direct
                   else "buffered I/O (O_DIRECT refused): the page cache served the rest")
            flag(f"implausible: fio read {res.io_bytes / 2**20:,.0f} MiB but {device} served "
                 f"only {res.device_bytes / 2**20:,.0f} MiB ({res.device_share:.1%}, below "
                 f"{floor:.0%}): {how}; {res.iops:,.0f} IOPS / {res.bw_mib_s:,.0f} MiB/s is "
                 "not the disk's figure.")
    elif not direct:
        flag("unverifiable: buffered I/O (O_DIRECT refused) and no block device visible to "
             "cross-check how much the page cache served, so the figure cannot pass a gate; "
             "pass --scratch DIR on a filesystem that accepts O_DIRECT on the same storage.")
    return res


# ---------------------------------------------------------------- scratch area

def _owner_alive(d: Path) -> bool:
    try:
        pid = int((d / OWNER_FILE).read_text().strip())
    except (OSError, ValueError):
        return True  # not ours to judge: keep it
    return pid_alive(pid)


def remove_stale_scratch(parent: Path) -> list[Path]:
    """Remove scratch directories left by a probe that was killed with SIGKILL.

    Only directories with our prefix *and* our owner file naming a dead process are
    touched, and inside them only the files this module writes.
    """
    removed = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return removed
    for d in entries:
        if not d.name.startswith(SCRATCH_PREFIX) or not d.is_dir() or d.is_symlink():
            continue
        if not (d / OWNER_FILE).is_file() or _owner_alive(d):
            continue
        for name in (SCRATCH_FILE, OWNER_FILE):
            try:
                (d / name).unlink()
            except FileNotFoundError:
                pass
            except OSError:
                break
        rmdir_quietly(d, removed)
    return removed


@contextmanager
def scratch_file(directory: str | os.PathLike[str], size: int,
                 progress: Progress | None = None) -> Iterator[Path]:
    """Create a scratch directory in `directory`, a file of `size` bytes of random data in
    it (O_EXCL, fsynced), yield the file's path, and remove both on any exit.
    """
    parent = Path(directory)
    remove_stale_scratch(parent)
    free = shutil.disk_usage(parent).free
    if size + 64 * 2**20 > free:
        raise FioError(f"{parent}: {size / 2**20:,.0f} MiB scratch file does not fit in "
                       f"{free / 2**20:,.0f} MiB free; pass a smaller --size.")
    d = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=parent))
    try:
        (d / OWNER_FILE).write_text(f"{os.getpid()}\n")
        f = d / SCRATCH_FILE
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            chunk = 4 * 2**20
            written = 0
            last = 0.0
            while written < size:
                n = min(chunk, size - written)
                # Unique random data per block: no dedup, compression or zero-page shortcut.
                buf = os.urandom(n)
                while buf:
                    k = os.write(fd, buf)
                    buf = buf[k:]
                written += n
                if progress and time.monotonic() - last > 0.5:
                    last = time.monotonic()
                    progress(f"laying out scratch file {written / size:.0%}")
            os.fsync(fd)
        finally:
            os.close(fd)
        yield f
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------- running fio

def fio_binary() -> str:
    exe = shutil.which("fio")
    if not exe:
        raise ToolMissing("fio is not installed; install it (as root or with sudo, "
                          "Debian/Ubuntu: `apt-get install fio`, RHEL: `dnf install fio`; "
                          "without privilege, in your conda environment: `conda install -c "
                          "conda-forge fio`).")
    return exe


def fio_version(exe: str) -> str:
    try:
        return subprocess.run([exe, "--version"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def pick_engine(exe: str) -> str:
    """libaio where fio has it (honours iodepth with O_DIRECT), then io_uring, else psync."""
    try:
        out = subprocess.run([exe, "--enghelp"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    engines = {line.strip() for line in out.splitlines()}
    for e in ("libaio", "io_uring"):
        if e in engines:
            return e
    return "psync"


def direct_io_supported(file: Path) -> bool:
    """Whether the filesystem accepts O_DIRECT on this file (tmpfs < 6.6, some FUSE refuse)."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    os.close(fd)
    return True


def _die_with_parent() -> None:
    # fio must not outlive a probe killed with SIGKILL (it would hold the scratch file).
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _read_device_bytes(device: str | None) -> int | None:
    if not device:
        return None
    from autotune.monitor.diskstats import DiskStatsReader

    try:
        return DiskStatsReader(device).snapshot().counters.sectors_read * 512
    except (OSError, LookupError):
        return None


def run_job(exe: str, file: Path, name: str, args: list[str], *, runtime: float,
            direct: bool, device: str | None, ioengine: str,
            memory_fs: str | None = None) -> FioJobResult:
    """Run one fio job on `file` (which must be a scratch file this module created)."""
    if not file.name == SCRATCH_FILE or not file.parent.name.startswith(SCRATCH_PREFIX):
        raise FioError(f"refusing to run fio on {file}: fio overwrites files it is pointed "
                       "at, so it only ever runs on a scratch file autotune created.")
    size = file.stat().st_size
    cmd = [exe, "--output-format=json", f"--name={name}", f"--filename={file}",
           f"--ioengine={ioengine}", f"--direct={int(direct)}", f"--runtime={runtime:g}",
           "--time_based", "--group_reporting", "--allow_file_create=0", "--invalidate=1",
           *args]
    if not any(a.startswith("--size=") for a in args):
        cmd.append(f"--size={size}")
    before = _read_device_bytes(device)
    # Threads, not forked job processes, and a process group of its own: on Ctrl-C or
    # SIGTERM the whole of fio dies with us (forked job processes outlive a killed fio
    # parent and would go on reading for the rest of --runtime).
    proc = subprocess.Popen([*cmd, "--thread"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=_die_with_parent)
    try:
        stdout, stderr = proc.communicate(timeout=runtime + 120)
    except subprocess.TimeoutExpired as e:
        _kill_group(proc)
        raise FioError(f"fio job {name} did not finish within {runtime + 120:.0f} s; "
                       "the storage may be hung.") from e
    except BaseException:
        _kill_group(proc)
        raise
    after = _read_device_bytes(device)
    if proc.returncode != 0:
        msg = (stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise FioError(f"fio job {name} failed: {msg}")
    res = parse_fio_json(stdout, name)
    if before is not None and after is not None:
        res.device_bytes = after - before
    return check_plausible(res, direct=direct, device=device, memory_fs=memory_fs)


def measure(directory: str | os.PathLike[str], *, size: int = 2**30, runtime: float = 10.0,
            device: str | None = None, progress: Progress | None = None) -> FioResult:
    """Run both fio jobs on a fresh scratch file in `directory` (a directory on the
    filesystem to measure). `device` is the kernel name of the disk behind it (for the
    plausibility cross-check), or None when there is none (tmpfs, FUSE, NFS). A directory
    on a RAM filesystem is found here and its figures are labelled RAM-backed.
    """
    if runtime <= 0:
        raise FioError(f"runtime must be positive, but got {runtime}.")
    exe = fio_binary()
    engine = pick_engine(exe)
    warnings: list[str] = []
    m = mount_for(directory)
    memory_fs = m.fstype if m is not None and m.fstype in MEMORY_FS else None
    with scratch_file(directory, size, progress) as f:
        direct = direct_io_supported(f)
        if not direct:
            warnings.append("O_DIRECT was refused by this filesystem: fio ran buffered after "
                            "dropping the file's cache, so figures can include page-cache hits"
                            + (f"; each job is cross-checked against {device}'s counters."
                               if device else "; with no block device to cross-check, they "
                               "are unverifiable."))
        if engine == "psync":
            warnings.append("fio has neither libaio nor io_uring: psync ignores iodepth.")
        nj = 4
        part = max(size // nj // 2**20, 1) * 2**20
        seq_args = ["--rw=read", "--bs=1M", f"--numjobs={nj}", "--iodepth=16",
                    f"--size={part}", f"--offset_increment={part}"]
        rand_args = ["--rw=randread", "--bs=4k", f"--numjobs={nj}", "--iodepth=64",
                     "--norandommap", "--randrepeat=0"]
        jobs = {}
        for name, args in (("seq_read", seq_args), ("rand_read", rand_args)):
            if progress:
                progress(f"fio {name.replace('_', ' ')} ({runtime:g} s)")
            if not direct:
                from autotune.cache import evict_files
                evict_files([f])
            jobs[name] = run_job(exe, f, name, args, runtime=runtime, direct=direct,
                                 device=device, ioengine=engine, memory_fs=memory_fs)
        for j in jobs.values():
            warnings.extend(j.warnings)
        return FioResult(direct=direct, ioengine=engine, file_bytes=size, runtime_s=runtime,
                         seq_read=jobs["seq_read"], rand_read=jobs["rand_read"],
                         version=fio_version(exe), warnings=warnings, device=device,
                         memory_fs=memory_fs)
