"""CPU % and RSS of a process tree: a root (the training process) plus every descendant
(DataLoader workers, their helpers), robust to processes appearing and exiting between
samples.

Cost matters (the monitor must stay under 1 % of a core). psutil's
`children(recursive=True)` reads /proc/<pid>/stat of *every* process on each call, and
psutil's cpu_times() + memory_info() cost ~100 us per process (two files plus Python
overhead). Instead, per sample, we:
  * list /proc once (one getdents; no per-process reads),
  * read /proc/<pid>/stat (utime, stime, starttime) and statm (RSS) per tree member,
  * read the parent pid only of processes never seen before (a process's parent changes
    only when it is orphaned, so one look is enough); outsiders are remembered by their
    /proc/<pid> inode, which changes when a pid is reused;
  * count the open files of each member (a stat of /proc/<pid>/fd, or before Linux 6.2 a
    listing of it: 0.7 ms for 2,000 files) and read the limits of the one that holds the
    most (/proc/<pid>/limits).
A tree member is identified by (pid, starttime), so a reused pid is never mistaken for it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import NamedTuple

from autotune.monitor.records import Unavailable, record_dict

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def pid_alive(pid: int) -> bool:
    """Process `pid` exists and is not a zombie (its /proc/PID/stat state); where /proc
    hides other users' processes (hidepid), whether a signal could find it."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    except PermissionError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@dataclass(frozen=True)
class TreeUsage:
    """One interval of a process tree.

    cpu_pct is in percent of ONE core (like top): 250 means 2.5 cores busy. A process
    born between two samples counts in full; one that exits loses its CPU time since the
    previous sample (a reaped process can no longer be read). Resolution: 1 clock tick
    (10 ms) per process per interval, i.e. 2 % of a core at 0.5 s.
    """

    root_pid: int
    root_alive: bool
    processes: int         # live processes in the tree at this sample (zombies excluded)
    started: int           # processes that joined since the previous sample
    exited: int            # processes that left since the previous sample
    cpu_pct: float
    rss_bytes: int         # sum of RSS (shared pages counted once per process)
    # Sum of PSS (a page shared by n processes counts 1/n in each): what the tree holds
    # of the memory its cgroup is charged, forked DataLoader workers' shared pages once.
    # None where a member's smaps_rollup could not be read (kernel before 4.14, another
    # user's process).
    pss_bytes: int | None = None
    # The process of the tree that held the most open files at this sample, its count and
    # its soft and hard RLIMIT_NOFILE (`ulimit -n`; None: unlimited). With torch's default
    # sharing strategy every tensor of a batch in flight is an open file in the worker
    # that made it and in the process that takes it. A sample, not a peak: a batch
    # handed over between two samples is not seen. None: not counted (another user's
    # processes).
    open_files: int | None = None
    open_files_pid: int | None = None
    open_files_limit: int | None = None
    open_files_hard: int | None = None

    def to_dict(self) -> dict:
        return record_dict(self)


class ProcStat(NamedTuple):
    """The fields of /proc/<pid>/stat the monitor needs."""

    ppid: int
    cpu_ticks: int      # utime + stime (children excluded)
    starttime: int      # clock ticks after boot: with the pid, identifies the process
    zombie: bool


def read_proc(path: str, size: int = 4096) -> bytes | None:
    """Up to `size` bytes of a /proc file, or None when it is gone or unreadable."""
    # os.open/os.read: a third of the cost of open().read() (no io object layers), which
    # matters at one or two reads per process per sample.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_proc_stat(pid: int) -> ProcStat | None:
    """Parse /proc/<pid>/stat; None when the process is gone or unreadable."""
    data = read_proc(f"/proc/{pid}/stat")
    if not data:
        return None
    # comm (field 2) may contain spaces and parentheses: split after the LAST ')'.
    # rest[0] is field 3 (state), so field n is rest[n - 3].
    rest = data[data.rfind(b")") + 2:].split()
    try:
        return ProcStat(ppid=int(rest[1]), cpu_ticks=int(rest[11]) + int(rest[12]),
                        starttime=int(rest[19]), zombie=rest[0] in (b"Z", b"X"))
    except (IndexError, ValueError):
        return None


def read_rss_bytes(pid: int) -> int:
    """Resident set size from /proc/<pid>/statm (0 when gone).

    Not the rss field of /proc/<pid>/stat: since the per-CPU mm counters, that one is an
    unsummed approximation (measured here: 31 pages low on 2 cores; the error grows with
    the core count), while statm, like VmRSS and psutil, sums them exactly.
    """
    data = read_proc(f"/proc/{pid}/statm")
    try:
        return int(data.split()[1]) * _PAGE if data else 0
    except (IndexError, ValueError):
        return 0


def read_pss_bytes(pid: int) -> int | None:
    """Proportional set size from /proc/<pid>/smaps_rollup; 0 when the process is gone,
    None when it is there but unreadable (another user's, a kernel before 4.14).

    A forked DataLoader worker shares its parent's pages (torch's libraries, the
    dataset's index): RSS counts them once per process, PSS divides them among the
    processes that share them, so the tree's PSS is what its cgroup is charged for them.
    """
    return read_rollup_bytes(pid, ("Pss",))


def read_rollup_bytes(pid: int, fields: tuple[str, ...]) -> int | None:
    """The sum of `fields` of /proc/<pid>/smaps_rollup ("Pss", "Private_Dirty",
    "Anonymous" ...), as read_pss_bytes reads Pss: 0 when the process is gone, None when
    unreadable or a field is missing."""
    data = read_proc(f"/proc/{pid}/smaps_rollup", 8192)
    if not data:
        # Gone since the listing, or exiting (its memory already released: an empty
        # smaps_rollup and statm's 0 while /proc/PID is still there, as a worker of a
        # pool not kept between epochs ends): nothing to count. Else unreadable. The
        # exiting case made one sample of a bench in three None, and the peak RSS
        # (3x PSS: the shared pages once per worker) then judged --max-memory.
        if not os.path.exists(f"/proc/{pid}") or read_rss_bytes(pid) == 0:
            return 0
        return None
    want = {f.encode() + b":" for f in fields}
    total, seen = 0, 0
    for line in data.splitlines():
        key = line.split(b" ", 1)[0]
        if key in want:
            try:
                total += int(line.split()[1]) * 1024
            except (IndexError, ValueError):
                return None
            seen += 1
    return total if seen == len(want) else None


def count_open_files(pid: int) -> int | None:
    """How many files process `pid` holds open (/proc/<pid>/fd); None when it is gone or
    not ours to read."""
    path = f"/proc/{pid}/fd"
    try:
        # Linux 6.2 on gives the count as the folder's size: one stat, not a listing (0.7 ms
        # for 2,000 files); before, the size is 0 and the listing counts.
        return os.stat(path).st_size or len(os.listdir(path))
    except OSError:
        return None


def read_nofile(pid: int) -> tuple[int | None, int | None] | None:
    """Process `pid`'s soft and hard open-files limits from /proc/<pid>/limits (None for
    "unlimited"); None when they cannot be read."""
    return parse_nofile(read_proc(f"/proc/{pid}/limits") or b"")


def parse_nofile(data: bytes) -> tuple[int | None, int | None] | None:
    """The "Max open files" line of a /proc/<pid>/limits text: (soft, hard), None for
    "unlimited"; None when there is no such line or it does not parse."""
    for line in data.splitlines():
        if line.startswith(b"Max open files"):
            words = line.split()
            try:
                soft, hard = words[3], words[4]
                return (None if soft == b"unlimited" else int(soft),
                        None if hard == b"unlimited" else int(hard))
            except (IndexError, ValueError):
                return None
    return None


def _most_open_files(pids: list[int]) -> dict[str, int | None]:
    """The open-files figures of TreeUsage: the process of `pids` that holds the most."""
    counted = [(n, p) for p in pids if (n := count_open_files(p)) is not None]
    if not counted:
        return {}
    n, pid = max(counted)
    limits = read_nofile(pid) or (None, None)
    return {"open_files": n, "open_files_pid": pid, "open_files_limit": limits[0],
            "open_files_hard": limits[1]}


def _add(total: int | None, part: int | None) -> int | None:
    return None if total is None or part is None else total + part


def _list_proc() -> dict[int, int]:
    """pid -> /proc/<pid> inode for every process (threads are not listed)."""
    out: dict[int, int] = {}
    with os.scandir("/proc") as it:
        for e in it:
            if e.name.isdigit():
                out[int(e.name)] = e.inode()
    return out


@dataclass
class _Member:
    starttime: int
    cpu_ticks: int


class ProcessTree:
    """Samples CPU % and RSS of `root_pid` and all its descendants.

    The first `sample()` is the baseline and returns None; each later one covers the time
    since the previous. Raises ProcessLookupError at construction if `root_pid` is gone.
    """

    def __init__(self, root_pid: int, *, pss: bool = False) -> None:
        st = read_proc_stat(root_pid)
        if st is None or st.zombie:
            raise ProcessLookupError(f"no running process with pid {root_pid}")
        self.root_pid = root_pid
        # PSS (smaps_rollup walks a process's page tables: about 0.2 ms for 4 GiB resident,
        # more with small pages) only where asked: a bench's own tree, not a user's whole
        # training job of dozens of processes sampled twice a second.
        self._pss = pss
        self._root_start = st.starttime
        self._members: dict[int, _Member] = {}
        self._others: dict[int, int] = {}      # pid -> /proc inode, outside the tree
        self._last_mono: float | None = None

    @property
    def pids(self) -> list[int]:
        """The pids currently in the tree (root first when alive)."""
        return sorted(self._members, key=lambda p: (p != self.root_pid, p))

    def sample(self, now_mono: float) -> TreeUsage | Unavailable | None:
        """Measure the interval ending at `now_mono` (time.monotonic())."""
        first = self._last_mono is None
        listing = _list_proc()
        # Outsiders that exited, or whose pid now belongs to another process, are forgotten.
        self._others = {p: i for p, i in self._others.items() if listing.get(p) == i}
        ticks, rss, pss, exited = self._update_members(listing)
        joined, new = self._join_new(listing, first)
        for p in joined:
            st = new[p]
            assert st is not None
            self._members[p] = _Member(st.starttime, st.cpu_ticks)
            # Born after the previous sample: all its CPU time is in this interval.
            ticks += 0 if first else st.cpu_ticks
            rss += read_rss_bytes(p)
            pss = _add(pss, read_pss_bytes(p)) if self._pss else None

        last, self._last_mono = self._last_mono, now_mono
        if last is None:
            return None
        if not self._members:
            return Unavailable(f"process {self.root_pid} and all its descendants have exited")
        dt = now_mono - last
        return TreeUsage(
            root_pid=self.root_pid,
            root_alive=self.root_pid in self._members,
            processes=len(self._members),
            started=len(joined),
            exited=exited,
            cpu_pct=ticks / _CLK_TCK / dt * 100.0 if dt > 0 else 0.0,
            rss_bytes=rss,
            pss_bytes=pss,
            **_most_open_files(list(self._members)),
        )

    def _update_members(self, listing: dict[int, int]) -> tuple[int, int, int | None, int]:
        """The members' CPU ticks since the last sample, their RSS, their PSS (None when
        one could not be read) and how many exited."""
        ticks = 0
        rss = 0
        pss: int | None = 0
        exited = 0
        for pid, m in list(self._members.items()):
            st = read_proc_stat(pid) if pid in listing else None
            if st is None or st.zombie or st.starttime != m.starttime:
                del self._members[pid]
                exited += 1
                if st is not None and st.starttime == m.starttime:
                    self._others[pid] = listing[pid]   # a zombie: do not rediscover it
                continue
            ticks += max(0, st.cpu_ticks - m.cpu_ticks)
            m.cpu_ticks = st.cpu_ticks
            rss += read_rss_bytes(pid)
            pss = _add(pss, read_pss_bytes(pid)) if self._pss else None
        return ticks, rss, pss, exited

    def _join_new(self, listing: dict[int, int], first: bool
                  ) -> tuple[list[int], dict[int, ProcStat | None]]:
        """New processes whose parent is in the tree (joined, in order), and every new one."""
        # Join the tree if their parent is in it (fixpoint, since a child and its
        # grandchild can both be new in the same sample).
        new = {p: read_proc_stat(p) for p in listing
               if p not in self._members and p not in self._others}
        tree = set(self._members)
        if first:
            st = new.get(self.root_pid)
            if st is not None and st.starttime == self._root_start and not st.zombie:
                tree.add(self.root_pid)
        joined: list[int] = [self.root_pid] if self.root_pid in tree and first else []
        pending = {p: st for p, st in new.items()
                   if st is not None and not st.zombie and p not in tree}
        changed = True
        while changed:
            changed = False
            for p, st in list(pending.items()):
                if st.ppid in tree:
                    tree.add(p)
                    joined.append(p)
                    del pending[p]
                    changed = True
        for p in new:
            if p not in tree:
                self._others[p] = listing[p]
        return joined, new
