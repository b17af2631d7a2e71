"""A warm interpreter for a search's measurement processes: torch imported once, and each
measurement process forked from it instead of started from nothing.

A search measures each configuration in a fresh process (autotune.bench.runner), and each
of those spent about 2 s importing torch before it could measure: on 2 cores, 40 % of a
small search. `WarmStarter.popen` starts the same measurement process, with the same
arguments, file descriptors, environment and session, but forked from `python -m
autotune.bench.warm`, a child of the search that has imported what every measurement
imports and does nothing else:

    search ──(socket: argv, env, fds)──> warm interpreter ── fork ──> intermediate
                                                                        └─ fork ──> measurement
    the intermediate exits at once, so the measurement process is re-parented to the
    search (a child subreaper while it measures, autotune.bench.procs): the search's own
    child, waited on by pid, killed by process group, as with subprocess.Popen.

The measurement process waits until the search has seen it is its child (a lease: a
pipe the search writes one byte to, or closes, and then it exits), then runs
`autotune.bench.child` as `python -m` would (runpy, as `__main__`). What it shares with
the warm interpreter is modules already imported; no DataLoader has run there and no file
of the dataset has been read. So that its memory reads as a plain start's, it maps in the
library pages the warm interpreter had mapped (a fork copies no page-table entries of
file mappings: without this its RSS would miss what importing torch touched). NumPy's
global generator is seeded again from the OS, as a fresh interpreter's is; warnings
raised while the libraries were imported are raised again in it (where the measurement
records them); AUTOTUNE_WARM_START=1 says how it started. What it inherits besides the
environment (limits, CPU affinity, cgroup, umask) is the warm interpreter's, taken when
the search's first measurement started it; a search changes none of them between
measurements.

Only a search uses it (many measurements in one process; `autotune bench` measures once),
and only where the caller gave no popen= of its own. If the warm interpreter cannot start
or answer, that measurement and the rest start the plain way, and `fallback` says why.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from autotune.bench.procs import child_env, stat_fields

WARM_ENV = "AUTOTUNE_WARM_START"
_MAX_MSG = 1 << 20
_ARGV_ROOM = 4096          # bytes of command line a measurement process can show (ps)
_READY_TIMEOUT_S = 120.0   # importing torch from a slow disk on a loaded machine
_FORK_TIMEOUT_S = 30.0

# What every measurement process imports before it says "ready" (child._prepare);
# not autotune.bench.child itself, which runpy runs as __main__ afresh.
_PRELOAD = ("numpy", "torch", "torch.utils.data", "PIL.Image", "PIL.ImageEnhance", "psutil",
            "autotune.data.torchds", "autotune.data.transforms", "autotune.data.stages",
            "autotune.params", "autotune_converters.registry", "autotune.bench.procs")
_MADV_POPULATE_READ = 22

# Set in the warm interpreter once it has imported _PRELOAD (inherited by each fork).
import_warnings: list[tuple[type[Warning], str]] = []
_resident: list[tuple[int, int]] = []     # (address, bytes) of mapped-in file pages
_library_fds: set[int] = set()            # descriptors the libraries opened


class WarmError(OSError):
    """The warm interpreter could not start or fork (the caller starts plainly instead)."""


class ForkedProcess:
    """A measurement process started by the warm interpreter: the Popen calls the bench
    runner makes (pid, poll, wait, returncode) on a child of this process."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid, self.args = pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its status is lost
                self.returncode = -signal.SIGKILL
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        delay = 0.001
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            time.sleep(delay)
            delay = min(0.05, delay * 2)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class WarmStarter:
    """Starts measurement processes from one warm interpreter (see the module docstring).

    `popen` has subprocess.Popen's signature as the bench runner calls it; `close()` ends
    the warm interpreter (a search closes it when it ends). Thread-safe.
    """

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self.fallback: str | None = None   # why measurements start the plain way, if they do
        self.forked = 0

    def __enter__(self) -> WarmStarter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def popen(self, cmd: list[str], **kw: Any) -> Any:
        with self._lock:
            if self.fallback is None:
                try:
                    return self._fork(cmd, **kw)
                except (OSError, ValueError) as e:
                    self.fallback = f"the warm interpreter failed ({e}); measurement processes start plainly"
                    self._close()
        return subprocess.Popen(cmd, **kw)

    def _start(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "autotune.bench.warm", str(theirs.fileno()), str(os.getpid()),
                 " " * _ARGV_ROOM],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),), start_new_session=True,
                env=child_env(dict(os.environ)))
        finally:
            theirs.close()
        self._sock = ours
        msg = self._recv(_READY_TIMEOUT_S)
        if msg.get("ready") is not True:
            raise WarmError(f"the warm interpreter did not start: {msg.get('error', msg)}")
        return ours

    def _recv(self, timeout: float) -> dict[str, Any]:
        assert self._sock is not None
        self._sock.settimeout(timeout)
        try:
            data = self._sock.recv(_MAX_MSG)
        except socket.timeout:
            raise WarmError(f"no answer from the warm interpreter in {timeout:g} s") from None
        if not data:
            raise WarmError("the warm interpreter exited")
        return json.loads(data)

    def _fork(self, cmd: list[str], *, stdin: Any = None, stdout: Any = None, stderr: Any = None,
              start_new_session: bool = False, pass_fds: tuple[int, ...] = (),
              env: dict[str, str] | None = None) -> ForkedProcess:
        if cmd[1:3] != ["-m", "autotune.bench.child"]:
            raise ValueError(f"not a measurement process: {cmd[:3]}")
        if stdin not in (None, subprocess.DEVNULL) or stderr not in (None, subprocess.STDOUT):
            raise ValueError("stdin must be DEVNULL and stderr STDOUT")
        out_fd = stdout.fileno() if hasattr(stdout, "fileno") else None
        if out_fd is None:
            raise ValueError("stdout must be a file")
        sock = self._start()
        req = {"argv": cmd[3:], "pass_fds": list(pass_fds), "new_session": start_new_session,
               "env": dict(os.environ if env is None else env)}
        lease_r, lease_w = os.pipe()
        try:
            try:
                socket.send_fds(sock, [json.dumps(req).encode()], [out_fd, lease_r, *pass_fds])
            finally:
                os.close(lease_r)
            ans = self._recv(_FORK_TIMEOUT_S)
            if "pid" not in ans:
                raise WarmError(f"the warm interpreter could not fork: {ans.get('error', ans)}")
            proc = ForkedProcess(int(ans["pid"]), cmd)
            if _parent_of(proc.pid) != os.getpid():
                # Not re-parented to us (this process was no subreaper): it could not be
                # waited on. Closing the lease unanswered makes it exit.
                raise WarmError(f"measurement process {proc.pid} was not re-parented to the search")
            os.write(lease_w, b"g")
        except BaseException:
            # A reply may still be on its way (an interrupt between send and receive):
            # this socket's next answer would belong to this request. Start afresh.
            self._close()
            raise
        finally:
            os.close(lease_w)
        self.forked += 1
        return proc

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._sock is not None:
            self._sock.close()   # EOF: the warm interpreter exits
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None


def _parent_of(pid: int) -> int | None:
    fields = stat_fields(pid)
    try:
        return int(fields[1]) if fields else None
    except (IndexError, ValueError):
        return None


# -- the warm interpreter ----------------------------------------------------------------


def _serve(sock: socket.socket, search_pid: int) -> None:
    import ctypes
    import importlib

    # Die with the search; never take the terminal's Ctrl-C (the search handles it).
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != search_pid:
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import warnings

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for name in _PRELOAD:
                importlib.import_module(name)
        import_warnings[:] = [(w.category, str(w.message)) for w in caught]
        torch = sys.modules["torch"]
        if torch.cuda.is_initialized():  # a fork after CUDA's start is unusable
            raise WarmError("CUDA was initialised while importing")
        _resident[:] = _resident_file_ranges()
        _library_fds.update(set(_open_fds()) - {0, 1, 2, sock.fileno()})
    except BaseException as e:  # noqa: BLE001 - said to the search, which starts plainly
        sock.send(json.dumps({"error": f"{type(e).__name__}: {e}"}).encode())
        return
    sock.send(b'{"ready": true}')
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MSG, 16)
        except OSError:
            return
        if not msg:
            return  # the search closed its end
        try:
            pid = _fork_one(json.loads(msg), fds, sock)
            ans: dict[str, Any] = {"pid": pid}
        except Exception as e:  # noqa: BLE001
            ans = {"error": f"{type(e).__name__}: {e}"}
        finally:
            for fd in fds:
                os.close(fd)
        sock.send(json.dumps(ans).encode())


def _fork_one(req: dict[str, Any], fds: list[int], sock: socket.socket) -> int:
    """Fork the measurement process through an intermediate that exits at once; its pid,
    written by the process itself once its session and descriptors are set (as Popen
    returns only then)."""
    r, w = os.pipe()
    mid = os.fork()
    if mid == 0:
        try:
            os.close(r)
            if os.fork() == 0:
                _become(req, fds, sock, w)  # never returns
        finally:
            os._exit(0)
    os.close(w)
    try:
        data = os.read(r, 32)
    finally:
        os.close(r)
        os.waitpid(mid, 0)
    if not data:
        raise WarmError("the measurement process died before it was set up")
    return int(data)


def _become(req: dict[str, Any], fds: list[int], sock: socket.socket, w: int) -> None:
    """In the new process: its session, descriptors and environment; its pid to the warm
    interpreter; the lease; then the child."""
    code = 1
    try:
        sock.close()
        if req.get("new_session"):
            os.setsid()
        targets = [int(t) for t in req["pass_fds"]]
        top = max([2, *targets, *_library_fds]) + 1
        # Out of the way of the numbers they must end up at, first.
        out, lease, *passed = (_dup_above(fd, top) for fd in fds)
        w = _dup_above(w, top)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        for fd, target in zip(passed, targets):
            os.dup2(fd, target)
        keep = {0, 1, 2, *targets, *_library_fds, lease, w}
        for fd in _open_fds():
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        os.write(w, str(os.getpid()).encode())
        os.close(w)
        os.environ.clear()
        os.environ.update(req["env"])
        os.environ[WARM_ENV] = "1"
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _reseed()
        # The search answers once it has seen this process re-parented to it (so the
        # child's check of its parent holds); it closes the lease unanswered otherwise.
        if os.read(lease, 1) != b"g":
            raise SystemExit(3)
        os.close(lease)
        _map_in(_resident)
        _show_cmdline([sys.executable, "-m", "autotune.bench.child", *req["argv"]])
        import runpy

        sys.argv = ["autotune.bench.child", *req["argv"]]
        runpy.run_module("autotune.bench.child", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - into the measurement's log, as python -m would
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _resident_file_ranges() -> list[tuple[int, int]]:
    """(address, bytes) runs of this process's file mappings whose pages are mapped in
    (/proc/self/pagemap's present bit; readable without privileges)."""
    import numpy as np

    page = os.sysconf("SC_PAGE_SIZE")
    spans = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[4] != "0" and parts[5].startswith("/"):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                spans.append((lo, hi))
    out: list[tuple[int, int]] = []
    with open("/proc/self/pagemap", "rb") as pm:
        for lo, hi in spans:
            pm.seek(lo // page * 8)
            present = (np.frombuffer(pm.read((hi - lo) // page * 8), dtype=np.uint64) >> 63) & 1
            edges = np.flatnonzero(np.diff(np.concatenate(([0], present.astype(np.int8), [0]))))
            out += [(lo + int(a) * page, int(b - a) * page) for a, b in zip(edges[::2], edges[1::2])]
    return out


def _map_in(ranges: list[tuple[int, int]]) -> None:
    """Map in the pages of `ranges` (already in the page cache: the warm interpreter
    holds them mapped), as the plain start's imports did."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = os.sysconf("SC_PAGE_SIZE")
    for addr, size in ranges:
        if libc.madvise(addr, size, _MADV_POPULATE_READ) != 0:
            if ctypes.get_errno() != 22:  # EINVAL: a kernel before 5.14; else unmapped
                continue
            for a in range(addr, addr + size, page):  # one byte a page
                ctypes.string_at(a, 1)


def _show_cmdline(argv: list[str]) -> bool:
    """Show `argv` as this process's command line (/proc/PID/cmdline, ps), as the plain
    start would: tools and people find a search's measurement processes by it. The
    warm interpreter's own command line ends in _ARGV_ROOM spaces; this writes over that
    memory in place, in this process's own copy of it, as setproctitle does: the words
    joined by spaces, then a NUL, and the area's last byte not NUL, which tells the
    kernel to show the text up to that NUL (psutil then splits it at the spaces)."""
    import ctypes

    try:
        fields = stat_fields() or []
        start, end = int(fields[45]), int(fields[46])   # arg_start, arg_end (fields 48, 49)
    except (IndexError, ValueError):
        return False
    text = b" ".join(os.fsencode(a) for a in argv) + b"\0"
    room = end - start
    if start <= 0 or len(text) >= room:
        return False
    ctypes.memmove(start, text + b"\0" * (room - len(text) - 1) + b" ", room)
    return True


def _dup_above(fd: int, low: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD, low)


def _open_fds() -> list[int]:
    """This process's open descriptors (not the one the listing itself used)."""
    try:
        listed = [int(x) for x in os.listdir("/proc/self/fd")]
    except OSError:
        listed = list(range(3, 256))
    out = []
    for fd in listed:
        try:
            os.fstat(fd)
        except OSError:
            continue
        out.append(fd)
    return out


def _reseed() -> None:
    import random

    random.seed()
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()


def main(argv: list[str]) -> None:
    sock = socket.socket(fileno=int(argv[1]))
    try:
        _serve(sock, int(argv[2]))
    finally:
        sock.close()
        # No interpreter finalization: libtorch's static destructors page in code never
        # used (seconds on a throttled disk), as the measurement process skips them too.
        os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
