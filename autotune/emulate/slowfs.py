"""Network-filesystem latency, emulated: a FUSE mirror of SRC at MNT that delays requests.

Each open and each read request waits `delay_ms` before it is served (lookup, getattr and
readdir too with `delay_metadata=True`; by default they do not, as NFS caches attributes).
Delays overlap between concurrent requests, so 8 readers of small files get several
times the files/s of one reader, as on NFS. Data is not cached across opens.

Server (foreground until SIGINT/SIGTERM, then unmounts):
    python -m autotune.emulate.slowfs SRC MNT --delay-ms 5 [-- CMD ...]
From Python (a separate server process, unmounted and reaped on exit):
    with SlowMount(src, mnt, delay_ms=5.0) as m: ...read under m.mnt...
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from autotune.blockdev import mountinfo
from autotune.emulate._cleanup import undo_on_exit
from autotune.errors import AutotuneError, NotPermitted, UsageError


def mount_type(real_mnt: str) -> str | None:
    """Filesystem type mounted exactly at `real_mnt` (a resolved path), or None.

    Reads /proc/self/mountinfo only: a stat of a FUSE mountpoint would block on a hung
    server. The topmost mount wins when several are stacked.
    """
    found = None
    for e in mountinfo():
        if e.mountpoint == real_mnt:
            found = e.fstype
    return found


def fuse_unavailable_reason() -> str | None:
    """Why a slowfs mount cannot work here, or None when it can (for skips and errors)."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse (load the fuse module, or pass --device /dev/fuse to the container)"
    try:
        import pyfuse3  # noqa: F401
        import trio  # noqa: F401
    except ImportError as e:
        return f"pyfuse3/trio not importable ({e}); `pip install 'autotune-loader[emulate]'` (builds against libfuse3-dev)"
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        return "fusermount3 not found (install the fuse3 package)"
    return None


class SlowMount:
    """Mount `src` read-only at `mnt` with `delay_ms` per open/read, in a server process.

    Args:
        src: directory to mirror.
        mnt: empty directory to mount on (created, and removed again, if missing).
        delay_ms: added to every open and read request (and metadata requests when
            `delay_metadata`).
        max_tasks: most requests the server handles at once.
        allow_other: let other users read the mount (needs root or user_allow_other).
        timeout_s: how long to wait for the mount to appear.

    On exit (also when the body raises) the mount is removed (`fusermount3 -u`, then
    `umount -l` if busy) and the server process reaped.
    """

    def __init__(self, src: str | os.PathLike[str], mnt: str | os.PathLike[str],
                 delay_ms: float = 5.0, *, delay_metadata: bool = False, max_tasks: int = 64,
                 allow_other: bool = False, timeout_s: float = 10.0) -> None:
        if delay_ms < 0:
            raise UsageError(f"delay_ms={delay_ms}: must be >= 0")
        self.src = os.path.abspath(src)
        self.mnt = os.path.abspath(mnt)
        self.delay_ms = float(delay_ms)
        self.delay_metadata = delay_metadata
        self.max_tasks = max_tasks
        self.allow_other = allow_other
        self.timeout_s = timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self._real_mnt = ""
        self._made_mnt = False
        self._stderr: tempfile._TemporaryFileWrapper[bytes] | None = None

    @property
    def mounted(self) -> bool:
        """Whether the slowfs mount is live at `mnt`."""
        return bool(self._real_mnt) and (mount_type(self._real_mnt) or "").startswith("fuse")

    def server_stderr(self) -> str:
        """What the server process has written to stderr so far."""
        if self._stderr is None:
            return ""
        self._stderr.flush()
        return Path(self._stderr.name).read_text(errors="replace").strip()

    def __enter__(self) -> SlowMount:
        if not os.path.isdir(self.src):
            raise UsageError(f"{self.src}: not a directory (slowfs mirrors a directory)")
        reason = fuse_unavailable_reason()
        if reason:
            raise NotPermitted(f"cannot mount slowfs at {self.mnt}: {reason}")
        if not os.path.exists(self.mnt):
            os.makedirs(self.mnt)
            self._made_mnt = True
        self._real_mnt = os.path.realpath(self.mnt)
        if mount_type(self._real_mnt) is not None:
            raise UsageError(f"{self.mnt}: already a mountpoint; unmount it or pick another")
        self._start()
        try:
            self._wait_mounted()
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        undo_on_exit(self._stop, exc)

    def _start(self) -> None:
        cmd = [sys.executable, "-m", "autotune.emulate", "slowfs", self.src, self.mnt,
               "--delay-ms", repr(self.delay_ms), "--max-tasks", str(self.max_tasks),
               "--parent-pid", str(os.getpid())]
        if self.delay_metadata:
            cmd.append("--delay-metadata")
        if self.allow_other:
            cmd.append("--allow-other")
        env = dict(os.environ)
        # The server must import this very autotune, installed or not.
        repo = str(Path(__file__).resolve().parents[2])  # the checkout or site dir holding autotune/
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, env.get("PYTHONPATH")]))
        self._stderr = tempfile.NamedTemporaryFile(prefix="slowfs-", suffix=".err")
        # Own session: a Ctrl-C aimed at the caller must not kill the server before the
        # caller has unmounted; the caller's exit path stops it.
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=self._stderr, env=env, start_new_session=True)

    def _wait_mounted(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.timeout_s
        while not self.mounted:
            if self.proc.poll() is not None:
                raise AutotuneError(f"slowfs server exited with status {self.proc.returncode} "
                                    f"before mounting {self.src} at {self.mnt}: "
                                    f"{self.server_stderr() or '(no stderr)'}")
            if time.monotonic() > deadline:
                raise AutotuneError(f"slowfs did not mount {self.mnt} within {self.timeout_s:g} s"
                                    f"; server stderr: {self.server_stderr() or '(none)'}")
            time.sleep(0.02)

    def _unmount(self) -> None:
        if not self.mounted:
            return
        if shutil.which("fusermount3"):
            subprocess.run(["fusermount3", "-u", self.mnt], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=False)
        if self.mounted and shutil.which("umount"):
            # Busy (an open file, a cwd inside): detach now, the kernel frees it later.
            subprocess.run(["umount", "-l", self.mnt], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=False)

    def _stop(self) -> None:
        try:
            self._unmount()
            if self.proc is not None:
                # A clean unmount ends the server's loop by itself; a lazily detached one
                # lives on while files are open, so ask it to stop (it unmounts, exits),
                # and SIGKILL a server stuck in a request.
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    if self.proc.poll() is None:
                        self.proc.send_signal(sig)
                    try:
                        self.proc.wait(timeout=5.0)
                        break
                    except subprocess.TimeoutExpired:
                        continue
            self._unmount()  # a killed server leaves a dead mount ("not connected")
            if self.mounted:
                raise AutotuneError(f"{self.mnt}: slowfs still mounted after fusermount3 -u "
                                    f"and umount -l; run `umount -l {self.mnt}` as root")
        finally:
            if self._stderr is not None:
                self._stderr.close()
                self._stderr = None
            if self._made_mnt and not self.mounted:
                try:
                    os.rmdir(self.mnt)
                    self._made_mnt = False
                except OSError:
                    pass

