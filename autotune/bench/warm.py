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

The measurement process then runs `autotune.bench.child` as `python -m` would (runpy, as
`__main__`). What it shares with the warm interpreter is modules already imported; no
DataLoader has run there and no file of the dataset has been read. Python's and NumPy's
global random states are seeded again from the OS, as a fresh interpreter's are, and the
variable AUTOTUNE_WARM_START=1 says how it started.

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

WARM_ENV = "AUTOTUNE_WARM_START"
_MAX_MSG = 1 << 20
_ARGV_ROOM = 4096          # bytes of command line a measurement process can show (ps)
_READY_TIMEOUT_S = 120.0   # importing torch from a slow disk on a loaded machine
_FORK_TIMEOUT_S = 30.0

# What every measurement process imports before it says "ready" (child._prepare).
_PRELOAD = ("numpy", "torch", "torch.utils.data", "PIL.Image", "PIL.ImageEnhance", "psutil",
            "autotune.data.torchds", "autotune.data.transforms", "autotune.data.stages",
            "autotune.params", "autotune_converters.registry", "autotune.bench.child")


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
                pass_fds=(theirs.fileno(),), start_new_session=True, env=_child_env())
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
        socket.send_fds(sock, [json.dumps(req).encode()], [out_fd, *pass_fds])
        ans = self._recv(_FORK_TIMEOUT_S)
        if "pid" not in ans:
            raise WarmError(f"the warm interpreter could not fork: {ans.get('error', ans)}")
        proc = ForkedProcess(int(ans["pid"]), cmd)
        if _parent_of(proc.pid) != os.getpid():
            # Not re-parented to us (this process was no subreaper): it could not be
            # waited on. It stops itself on seeing a foreign parent; make sure.
            proc.kill()
            raise WarmError(f"measurement process {proc.pid} was not re-parented to the search")
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


def _child_env() -> dict[str, str]:
    from pathlib import Path

    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parents[2])  # as the runner does for its child
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, env.get("PYTHONPATH")]))
    return env


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
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
    try:
        for name in _PRELOAD:
            importlib.import_module(name)
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
    """Fork the measurement process through an intermediate that exits at once; its pid."""
    r, w = os.pipe()
    mid = os.fork()
    if mid == 0:
        try:
            os.close(r)
            pid = os.fork()
            if pid == 0:
                os.close(w)
                _become(req, fds, sock)  # never returns
            os.write(w, str(pid).encode())
        finally:
            os._exit(0)
    os.close(w)
    try:
        data = os.read(r, 32)
    finally:
        os.close(r)
        os.waitpid(mid, 0)
    if not data:
        raise WarmError("the intermediate process died before forking")
    return int(data)


def _become(req: dict[str, Any], fds: list[int], sock: socket.socket) -> None:
    """In the new process: its descriptors, session and environment, then the child."""
    code = 1
    try:
        sock.close()
        intermediate = os.getppid()
        if req.get("new_session"):
            os.setsid()
        targets = [int(t) for t in req["pass_fds"]]
        top = max([2, *targets]) + 1
        high = [_dup_above(fd, top) for fd in fds]   # out of the way of the target numbers
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(high[0], 1)
        os.dup2(high[0], 2)
        for fd, target in zip(high[1:], targets):
            os.dup2(fd, target)
        keep = {0, 1, 2, *targets}
        for fd in _open_fds():
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        os.environ.clear()
        os.environ.update(req["env"])
        os.environ[WARM_ENV] = "1"
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _reseed()
        # The intermediate exits right after the fork: wait to be re-parented to the
        # search, whose pid the child checks before it measures.
        end = time.monotonic() + 10
        while os.getppid() == intermediate and time.monotonic() < end:
            time.sleep(0.0005)
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


def _show_cmdline(argv: list[str]) -> bool:
    """Show `argv` as this process's command line (/proc/PID/cmdline, ps), as the plain
    start would: tools and people find a search's measurement processes by it. The
    warm interpreter's own command line ends in _ARGV_ROOM spaces; this writes over that
    memory in place (what setproctitle does), in this process's own copy of it."""
    import ctypes

    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])   # arg_start, arg_end (fields 48, 49)
    except (OSError, IndexError, ValueError):
        return False
    data = b"\0".join(os.fsencode(a) for a in argv) + b"\0"
    if start <= 0 or len(data) > end - start:
        return False
    ctypes.memmove(start, data + b"\0" * (end - start - len(data)), end - start)
    return True


def _dup_above(fd: int, low: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD, low)


def _open_fds() -> list[int]:
    try:
        return [int(x) for x in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 256))


def _reseed() -> None:
    import random

    random.seed()
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()


def main(argv: list[str]) -> int:
    sock = socket.socket(fileno=int(argv[1]))
    try:
        _serve(sock, int(argv[2]))
    finally:
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
