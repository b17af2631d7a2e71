"""What the job's own container allows, read once: the one place every budget comes from.

A job in a container or a Slurm allocation sees the host's figures in `/proc/meminfo` and
`df /dev/shm`'s host mount only on bare metal; inside, what binds is

* **memory**: the tightest cgroup limit on the way up from the process's own cgroup
  (v1 `memory.limit_in_bytes`; v2 `memory.max`, and `memory.high`, where the kernel starts
  reclaiming and throttling). v1's "unlimited" (a page counter's maximum, about 2**63) and
  v2's `max` are no limit. The **working set** is usage less inactive file pages (what
  cAdvisor and the kubelet evict on; v1's `total_inactive_file`, the whole subtree's, as
  its usage is): the page cache a job has read counts in `usage`, and without that
  subtraction a job that read its dataset once looks out of memory. What is **left** is
  the least of (limit less working set) over every limited cgroup on the way up: a looser
  ancestor its other children fill binds before the tightest limit does. A v2 hierarchy
  whose `cgroup.controllers` lacks `memory` (a systemd-hybrid host's `unified` mount) has
  no memory limits and is not read;
* **/dev/shm**: Docker's default is a 64 MiB tmpfs, a Kubernetes pod's the same unless it
  mounts an `emptyDir` of medium Memory; DataLoader workers hand every batch to the main
  process through it, and its pages are charged to the cgroup too;
* **CPU**: `autotune.cpus` (affinity and quotas);
* **privileges**: whether the page cache can be dropped (root and a writable `/proc/sys`:
  otherwise files are evicted one by one with `posix_fadvise`, which keeps inodes) and
  whether delay accounting can be switched on (otherwise I/O waits come from sampling task
  states), and whether the data's mount is read-only (probe's scratch file must go
  elsewhere: `--scratch`).

`read_environment()` returns an `Environment`; `Environment.to_dict()` is the `environment`
key of probe, bench and search JSON, `Environment.lines()` their header, and
`Environment.limitations()` says what a command could not do and what that changes. A file
that is missing or unreadable is one note naming it, and the figure falls back to the next
source (the cgroup to the host, `/dev/shm` to "unknown").

cgroup v2 is read from the same code as v1; this project's machine mounts v1 only, so the
v2 readers are tested on synthetic files written in the kernel's format (a Docker
container's layout, a Kubernetes pod's), not recordings from a v2 host
(tests/test_environment.py).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from autotune.cgroups import CGROUP_FILE, MOUNTINFO_FILE, cgroup_dirs, own_paths
from autotune.cpus import CpuLimit, cpu_limit

__all__ = ["DEV_SHM", "Environment", "MemoryLimit", "ShmSpace", "read_environment",
           "read_memory_limit", "read_shm", "size_text"]

DEV_SHM = "/dev/shm"
PROC_SYS = "/proc/sys"
# v1 reports "no limit" as PAGE_COUNTER_MAX pages (9223372036854771712 with 4 KiB pages);
# anything this large is no limit on any machine that exists.
_UNLIMITED = 1 << 60


def size_text(n: int | float | None, unknown: str = "unknown") -> str:
    """160 MiB, 1.7 GiB, 21 GiB; `unknown` for None."""
    if n is None:
        return unknown
    if n >= 10 * 2**30:
        return f"{n / 2**30:.0f} GiB"
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / 2**20:.0f} MiB"


@dataclass(frozen=True)
class MemoryLimit:
    """The memory this job may use, from its cgroups, and how much of it is taken.

    `limit_bytes` is the tightest of every `memory.max` / `memory.limit_in_bytes` /
    `memory.high` on the way up (None: no cgroup limit), `source` the file it came from.
    `usage_bytes`, `inactive_file_bytes` and `working_set_bytes` are those of the cgroup
    whose limit binds (it holds every process below it). `remaining_bytes` is the least
    any limited cgroup on the way up has left: a looser ancestor whose other children
    fill it leaves less than the tightest limit does (`least_remaining_source` names its
    limit file)."""

    limit_bytes: int | None
    source: str
    kind: str | None = None               # "v1" or "v2", None without a limit
    usage_bytes: int | None = None
    inactive_file_bytes: int | None = None
    oom_group: bool = False                # v2 memory.oom.group on the binding cgroup
    notes: tuple[str, ...] = ()
    # min over limited cgroups of (limit - working set); None: the binding cgroup's alone
    least_remaining_bytes: int | None = None
    least_remaining_source: str | None = None

    @property
    def working_set_bytes(self) -> int | None:
        """usage less inactive file pages: what the OOM killer cannot simply reclaim."""
        if self.usage_bytes is None:
            return None
        return max(0, self.usage_bytes - (self.inactive_file_bytes or 0))

    @property
    def remaining_bytes(self) -> int | None:
        """The least any limited cgroup on the way up has left (its limit less its working
        set); None without a limit."""
        if self.limit_bytes is None:
            return None
        own = max(0, self.limit_bytes - (self.working_set_bytes or 0))
        return own if self.least_remaining_bytes is None else min(own, self.least_remaining_bytes)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["working_set_bytes"] = self.working_set_bytes
        d["remaining_bytes"] = self.remaining_bytes
        return d


@dataclass(frozen=True)
class ShmSpace:
    """The filesystem at /dev/shm: DataLoader workers' batches live there until the loop
    frees them. `total_bytes`/`free_bytes` None when it is missing or not a tmpfs."""

    path: str
    fstype: str | None
    total_bytes: int | None
    free_bytes: int | None
    note: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Environment:
    """What the job's own container allows; see the module doc."""

    cpu: CpuLimit
    memory: MemoryLimit
    shm: ShmSpace
    host_total_bytes: int
    host_available_bytes: int
    root: bool
    can_drop_caches: bool
    delayacct_on: bool
    can_switch_delayacct: bool
    data_path: str | None = None
    data_read_only: bool | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    # Where probe's fio scratch file goes instead of the data's mount (--scratch), if given.
    scratch_dir: str | None = None
    # The command runs fio (probe, search): a read-only data mount is then a limitation.
    runs_fio: bool = True

    # -- budgets -------------------------------------------------------------------------
    def memory_budget(self) -> int:
        """Bytes this job may still take: the cgroup's limit less its working set where a
        limit is set, else the host's available memory (the smaller of both when a limit
        is above what the host has free)."""
        rem = self.memory.remaining_bytes
        if rem is None:
            return self.host_available_bytes
        return min(rem, self.host_available_bytes) if self.host_available_bytes else rem

    def memory_total(self) -> int:
        """The job's memory: the cgroup's limit, else the host's total."""
        lim = self.memory.limit_bytes
        if lim is None:
            return self.host_total_bytes
        return min(lim, self.host_total_bytes) if self.host_total_bytes else lim

    def memory_total_source(self) -> str:
        """Where `memory_total()` comes from, for a header: the cgroup file, or the host."""
        lim = self.memory.limit_bytes
        if lim is None:
            return f"the host's {size_text(self.host_total_bytes)} (no cgroup limit)"
        if self.host_total_bytes and lim > self.host_total_bytes:
            return (f"the host's {size_text(self.host_total_bytes)} (below the cgroup limit "
                    f"{size_text(lim)}, {self.memory.source})")
        return f"the cgroup limit {size_text(lim)} ({self.memory.source})"

    def over_limit(self, budget_bytes: int, what: str) -> str | None:
        """The warning for a user's memory figure (`what`: "--max-memory 30,000 MiB") above
        the cgroup's memory limit, naming both; None when it is within the limit or no
        limit is set. The OOM killer acts at the limit, whatever the budget says."""
        lim = self.memory.limit_bytes
        if lim is None or budget_bytes <= lim:
            return None
        return (f"{what} is over this job's cgroup memory limit of {lim / 2**20:,.0f} MiB "
                f"({self.memory.source}): the OOM killer acts at the limit; give at most "
                "half of it, or leave it unset (half of the limit)")

    def shm_budget(self) -> int | None:
        """Bytes batches may take in /dev/shm: its free space, and no more than the cgroup
        has left (tmpfs pages are charged to it). 0 when there is no /dev/shm at all (no
        such directory, no mount: workers cannot hand batches over, only `num_workers=0`
        fits); None when it exists but its size is unknown (statvfs refused)."""
        if self.shm.free_bytes is None:
            if self.shm.total_bytes is None and self.shm.fstype is None:
                return 0
            return None
        return min(self.shm.free_bytes, self.memory_budget())

    # -- presentation --------------------------------------------------------------------
    def lines(self) -> list[str]:
        """The header lines probe, bench and search print."""
        mem = self.memory
        if mem.limit_bytes is None:
            m = f"memory: no cgroup limit; host {size_text(self.host_total_bytes)}, " \
                f"{size_text(self.host_available_bytes)} available"
        else:
            m = (f"memory: cgroup limit {size_text(mem.limit_bytes)} ({mem.source}), working set "
                 f"{size_text(mem.working_set_bytes)}, {size_text(mem.remaining_bytes)} left")
            if mem.least_remaining_source and mem.least_remaining_source != mem.source:
                m += f" (the least of any limit on the way up: {mem.least_remaining_source})"
        if self.shm.total_bytes is None:
            s = f"/dev/shm: {self.shm.note or 'unknown'}"
        else:
            s = (f"/dev/shm: {self.shm.fstype} {size_text(self.shm.total_bytes)}, "
                 f"{size_text(self.shm.free_bytes)} free")
        c = f"cpu: {self.cpu.cores:g} usable core(s) ({self.cpu.source})"
        return [c, m, s] + self.limitations()

    def limitations(self) -> list[str]:
        """What this environment keeps autotune from doing, and what that changes."""
        out = []
        if not self.can_drop_caches:
            why = "not root" if not self.root else f"{PROC_SYS} is read-only"
            out.append(f"caches cannot be dropped ({why}): files are evicted one by one "
                       "with posix_fadvise, which keeps inodes and directory entries; a "
                       "'cold' figure re-reads data but not metadata")
        if not self.delayacct_on and not self.can_switch_delayacct:
            out.append("delay accounting is off and cannot be switched on: I/O waits are "
                       "sampled from task states (D, wchan), coarser than the kernel's count")
        if self.runs_fio and self.data_read_only:
            out.append(f"{self.data_path} is on a read-only mount: " + (
                f"fio's scratch file goes to {self.scratch_dir} (--scratch); fio measures "
                "that directory's storage" if self.scratch_dir else
                "fio cannot write its scratch file there and is skipped; probe and search "
                "take --scratch DIR (a writable directory on the same storage)"))
        if self.memory.oom_group:
            out.append("memory.oom.group=1: the OOM killer ends the whole container, no "
                       "worker can be lost and recovered; budgets stay well under the limit")
        out.extend(self.notes)
        out.extend(self.memory.notes)
        if self.shm.note and self.shm.total_bytes is not None:
            out.append(self.shm.note)
        return out

    def to_dict(self) -> dict:
        return {"cpu": self.cpu.to_dict(), "memory": self.memory.to_dict(),
                "shm": self.shm.to_dict(), "host_total_bytes": self.host_total_bytes,
                "host_available_bytes": self.host_available_bytes, "root": self.root,
                "can_drop_caches": self.can_drop_caches, "delayacct_on": self.delayacct_on,
                "can_switch_delayacct": self.can_switch_delayacct,
                "data_path": self.data_path, "data_read_only": self.data_read_only,
                "scratch_dir": self.scratch_dir,
                "memory_total_bytes": self.memory_total(),
                "memory_total_source": self.memory_total_source(),
                "memory_budget_bytes": self.memory_budget(),
                "shm_budget_bytes": self.shm_budget(),
                "limitations": self.limitations(), "lines": self.lines()}


# -- readers -------------------------------------------------------------------------------

def _read_int(f: Path) -> int | None:
    """An integer file; None for v2's "max"."""
    raw = f.read_text().strip()
    if raw == "max":
        return None
    v = int(raw)
    return None if v >= _UNLIMITED else v


def _stat(f: Path) -> dict[str, int]:
    """memory.stat as a dict (v1 lists `inactive_file`, the cgroup's own pages, before
    `total_inactive_file`, its whole subtree's: pick by name, not by order)."""
    out: dict[str, int] = {}
    for line in f.read_text().splitlines():
        k, _, v = line.partition(" ")
        try:
            out[k] = int(v)
        except ValueError:
            continue
    return out


def _inactive_file(stat: dict[str, int], kind: str) -> int | None:
    # v1's usage_in_bytes is hierarchical, so its inactive pages must be too: the
    # `total_` figure (the cgroup's own `inactive_file` leaves out its children's). v2's
    # memory.stat is hierarchical already.
    if kind == "v1" and "total_inactive_file" in stat:
        return stat["total_inactive_file"]
    return stat.get("inactive_file")


def _err(e: BaseException) -> str:
    return getattr(e, "strerror", None) or str(e)


def cgroup_usage(d: Path, kind: str, notes: list[str]) -> tuple[int | None, int | None]:
    """(usage, inactive file bytes) of one cgroup; a file that cannot be read is a note
    naming it and what the figure becomes."""
    usage = inactive = None
    uf = d / ("memory.current" if kind == "v2" else "memory.usage_in_bytes")
    try:
        usage = _read_int(uf)
    except (OSError, ValueError) as e:
        notes.append(f"{uf}: unreadable ({_err(e)}); the working set there is unknown and "
                     "its whole limit is counted as free")
        return None, None
    sf = d / "memory.stat"
    try:
        inactive = _inactive_file(_stat(sf), kind)
    except (OSError, ValueError) as e:
        notes.append(f"{sf}: unreadable ({_err(e)}); page cache counted as used: the "
                     f"working set is the whole usage ({size_text(usage)})")
    return usage, inactive


def _memory_controller_in(top: Path) -> bool:
    """Whether a v2 hierarchy carries the memory controller (a systemd-hybrid host mounts
    a unified hierarchy without it, the memory controller on v1)."""
    try:
        return "memory" in (top / "cgroup.controllers").read_text().split()
    except OSError:
        return False


def _tightest_limit(d: Path, kind: str, own_nonroot: bool,
                    notes: list[str]) -> tuple[int, str] | None:
    """The tightest memory limit file of one cgroup directory: (bytes, file), or None;
    a missing or unreadable file is noted in `notes`."""
    names = ("memory.max", "memory.high") if kind == "v2" else ("memory.limit_in_bytes",)
    here: tuple[int, str] | None = None
    for name in names:
        f = d / name
        try:
            v = _read_int(f)
        except FileNotFoundError:
            # The root cgroup has no limit files: not worth a note. The process's own
            # (non-root) cgroup without one is: a limit could be missed.
            if own_nonroot and name == names[0]:
                notes.append(f"{f}: missing; the limits of the cgroups above it are "
                             "used, else the host's memory")
            continue
        except (OSError, ValueError) as e:
            notes.append(f"{f}: unreadable ({_err(e)}); the limits above it are used")
            continue
        if v is not None and (here is None or v < here[0]):
            here = (v, str(f))
    return here


def read_memory_limit(*, cgroup_file: str | os.PathLike[str] = CGROUP_FILE,
                      mountinfo_file: str | os.PathLike[str] = MOUNTINFO_FILE
                      ) -> MemoryLimit:
    """The tightest memory limit on the way up from this process's cgroup (v1 and v2),
    with the binding cgroup's usage and inactive file pages, and the least any limited
    cgroup on the way up has left."""
    try:
        dirs = cgroup_dirs("memory", cgroup_file=cgroup_file, mountinfo_file=mountinfo_file)
        own = own_paths(Path(cgroup_file).read_text(), "memory")
    except OSError as e:
        return MemoryLimit(None, "no cgroup limit",
                           notes=(f"{e.filename or cgroup_file}: {e.strerror}; memory "
                                  "budgets use the host's figures",))
    notes: list[str] = []
    tops = {kind: d for kind, d in dirs}   # each hierarchy's last (top) directory
    firsts: set[str] = set()
    # (limit, file, kind, dir) of each cgroup with a limit: its tightest file
    limited: list[tuple[int, str, str, Path]] = []
    for kind, d in dirs:
        is_own = kind not in firsts
        firsts.add(kind)
        if kind == "v2" and not _memory_controller_in(tops[kind]):
            continue  # a unified hierarchy without the memory controller has no limits
        here = _tightest_limit(d, kind, is_own and own.get(kind, "/") != "/", notes)
        if here is not None:
            limited.append((here[0], here[1], kind, d))
    if not limited:
        return MemoryLimit(None, "no cgroup limit", notes=tuple(notes))
    limit, src, kind, d = min(limited, key=lambda x: x[0])
    usage = inactive = None
    least: tuple[int, str] | None = None
    for lim_i, src_i, kind_i, d_i in limited:
        # Every limit on the way up is enforced: a looser ancestor nearly full (its other
        # children's memory) leaves less than the tightest limit does.
        u, ina = cgroup_usage(d_i, kind_i, notes)
        if d_i == d:
            usage, inactive = u, ina
        rem = max(0, lim_i - max(0, (u or 0) - (ina or 0)))
        if least is None or rem < least[0]:
            least = (rem, src_i)
    oom_group = False
    if kind == "v2":
        try:
            oom_group = (d / "memory.oom.group").read_text().strip() == "1"
        except OSError:
            pass
    assert least is not None
    return MemoryLimit(limit, src, kind, usage, inactive, oom_group, tuple(notes),
                       least_remaining_bytes=least[0], least_remaining_source=least[1])


def read_shm(path: str = DEV_SHM) -> ShmSpace:
    """Size and free space of /dev/shm, and whether it is a tmpfs at all."""
    from autotune.blockdev import mount_for

    if not os.path.isdir(path):
        return ShmSpace(path, None, None, None,
                        note=f"{path} does not exist: DataLoader workers cannot share "
                             "batches; budgets allow no worker batches in shared memory")
    m = mount_for(path)
    fstype = m.fstype if m is not None else None
    try:
        st = os.statvfs(path)
    except OSError as e:
        return ShmSpace(path, fstype, None, None, note=f"{path}: {e.strerror}")
    total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    note = None
    if fstype not in ("tmpfs", "ramfs"):
        note = (f"{path} is not a tmpfs ({fstype or 'no mount of its own'}): its free space "
                "is that of the filesystem that holds it")
    return ShmSpace(path, fstype, total, free, note)


def _meminfo() -> tuple[int, int]:
    total = avail = 0
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) * 1024
                elif line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return total, avail


def _writable(path: str) -> bool:
    # access() answers EROFS for a read-only mount even to root: the container case.
    return os.access(path, os.W_OK)


def read_environment(data_path: str | os.PathLike[str] | None = None, *,
                     scratch: str | os.PathLike[str] | None = None, runs_fio: bool = True,
                     shm_path: str = DEV_SHM, proc_sys: str = PROC_SYS,
                     cgroup_file: str | os.PathLike[str] = CGROUP_FILE,
                     mountinfo_file: str | os.PathLike[str] = MOUNTINFO_FILE) -> Environment:
    """Read the environment once (a few small files; milliseconds). `runs_fio`: the
    command runs fio on the data's storage (bench does not: no fio limitation then)."""
    root = os.geteuid() == 0
    total, avail = _meminfo()
    delay_file = os.path.join(proc_sys, "kernel", "task_delayacct")
    try:
        delay_on = Path(delay_file).read_text().strip() == "1"
    except OSError:
        delay_on = False
    ro = None
    data = None
    if data_path is not None and "://" not in str(data_path):
        data = str(data_path)
        try:
            ro = bool(os.statvfs(data).f_flag & os.ST_RDONLY)
        except OSError:
            ro = None
    return Environment(
        cpu=cpu_limit(cgroup_file=cgroup_file, mountinfo_file=mountinfo_file),
        memory=read_memory_limit(cgroup_file=cgroup_file, mountinfo_file=mountinfo_file),
        shm=read_shm(shm_path), host_total_bytes=total, host_available_bytes=avail,
        root=root,
        can_drop_caches=root and _writable(os.path.join(proc_sys, "vm", "drop_caches")),
        delayacct_on=delay_on,
        can_switch_delayacct=root and _writable(delay_file),
        data_path=data, data_read_only=ro,
        scratch_dir=None if scratch is None else str(scratch), runs_fio=runs_fio)
