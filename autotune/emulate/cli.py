"""Command lines for scripts/throttle and scripts/slowfs (the only printing in emulate/).

    throttle --path DIR --read-iops N [--read-bps B] [--drop-caches] -- CMD ...
    slowfs SRC MNT --delay-ms MS [--delay-metadata] [-- CMD ...]

With a CMD, the exit status is CMD's (128+N when killed by signal N); 1 on an error of
ours, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence

from autotune.cli.args import positive_int, size
from autotune.errors import AutotuneError, UsageError

def _split_cmd(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def _run_forwarding(start: Callable[[], subprocess.Popen[bytes]]) -> int:
    """Start the command and wait for it, letting it (not us) react to Ctrl-C first.

    The terminal's SIGINT reaches the command directly (same process group); we ignore it
    so that our cleanup runs after the command has exited, and forward SIGTERM/SIGHUP.
    """
    proc = start()
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, lambda signum, _f: proc.send_signal(signum))
    try:
        rc = proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return 128 - rc if rc < 0 else rc


def _fail(prog: str, err: AutotuneError) -> int:
    print(f"{prog}: error: {err}", file=sys.stderr)
    return err.exit_code


def throttle_main(argv: Sequence[str] | None = None) -> int:
    """scripts/throttle: run CMD with the disk behind --path capped."""
    from autotune.emulate.throttle import IoThrottle

    p = argparse.ArgumentParser(
        prog="throttle", usage="throttle --path DIR --read-iops N [options] -- CMD ...",
        description="Run CMD in a cgroup that caps I/O to the disk holding DIR (root only). "
                    "Page-cache hits are not capped: use --drop-caches for cold reads.")
    p.add_argument("--path", required=True, help="a directory on the disk to cap")
    p.add_argument("--read-iops", type=positive_int("--read-iops"))
    p.add_argument("--read-bps", type=size("--read-bps"), help="bytes/s, e.g. 50M")
    p.add_argument("--write-iops", type=positive_int("--write-iops"))
    p.add_argument("--write-bps", type=size("--write-bps"))
    p.add_argument("--drop-caches", action="store_true",
                   help="sync and drop the page cache before CMD starts")
    p.add_argument("--name", help="label in the cgroup name")
    own, cmd = _split_cmd(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(own)
    if not cmd:
        p.error("missing the command: add -- CMD ...")
    try:
        with IoThrottle(args.path, read_iops=args.read_iops, read_bps=args.read_bps,
                        write_iops=args.write_iops, write_bps=args.write_bps,
                        name=args.name) as cap:
            if args.drop_caches:
                from autotune.cache import drop_caches
                drop_caches()
            return _run_forwarding(lambda: cap.popen(cmd))
    except FileNotFoundError:
        print(f"throttle: error: command not found: {cmd[0]}", file=sys.stderr)
        return 127
    except AutotuneError as e:
        return _fail("throttle", e)


def slowfs_main(argv: Sequence[str] | None = None) -> int:
    """scripts/slowfs: mount SRC at MNT with a delay; run CMD, or serve until Ctrl-C."""
    p = argparse.ArgumentParser(
        prog="slowfs", usage="slowfs SRC MNT --delay-ms MS [options] [-- CMD ...]",
        description="Mirror SRC read-only at MNT through FUSE, adding MS to every open and "
                    "read (metadata too with --delay-metadata). With CMD: mount, run it, "
                    "unmount. Without: serve in the foreground until Ctrl-C.")
    p.add_argument("src")
    p.add_argument("mnt")
    p.add_argument("--delay-ms", type=float, required=True)
    p.add_argument("--delay-metadata", action="store_true",
                   help="also delay lookup, getattr and readdir")
    p.add_argument("--max-tasks", type=positive_int("--max-tasks"), default=64,
                   help="most requests served at once (default 64)")
    p.add_argument("--allow-other", action="store_true", help="let other users read it")
    p.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)  # set by SlowMount
    own, cmd = _split_cmd(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(own)
    if args.delay_ms < 0:
        p.error("--delay-ms must be >= 0")
    try:
        if cmd:
            from autotune.emulate.slowfs import SlowMount

            with SlowMount(args.src, args.mnt, args.delay_ms, delay_metadata=args.delay_metadata,
                           max_tasks=args.max_tasks, allow_other=args.allow_other):
                try:
                    return _run_forwarding(lambda: subprocess.Popen(cmd))
                except FileNotFoundError:
                    print(f"slowfs: error: command not found: {cmd[0]}", file=sys.stderr)
                    return 127
        return _serve(args)
    except AutotuneError as e:
        return _fail("slowfs", e)


def _serve(args: argparse.Namespace) -> int:
    from autotune.emulate.slowfs import fuse_unavailable_reason, mount_type

    if not os.path.isdir(args.src) or not os.path.isdir(args.mnt):
        raise UsageError(f"SRC {args.src} and MNT {args.mnt} must both be existing directories")
    if mount_type(os.path.realpath(args.mnt)) is not None:
        raise UsageError(f"{args.mnt}: already a mountpoint; unmount it or pick another")
    reason = fuse_unavailable_reason()
    if reason:
        raise AutotuneError(f"cannot mount slowfs: {reason}")
    from autotune.emulate._fusefs import serve

    if args.parent_pid is None:
        what = "open/read/lookup/getattr/readdir" if args.delay_metadata else "open/read"
        print(f"slowfs: {args.src} mounted read-only at {args.mnt}, {args.delay_ms:g} ms per "
              f"{what}; Ctrl-C to unmount", file=sys.stderr)
    try:
        serve(args.src, args.mnt, args.delay_ms, delay_metadata=args.delay_metadata,
              max_tasks=args.max_tasks, allow_other=args.allow_other, parent_pid=args.parent_pid)
    except RuntimeError as e:  # pyfuse3: "fuse_session_mount failed" (libfuse said why above)
        raise AutotuneError(f"cannot mount {args.src} at {args.mnt}: {e}") from e
    except KeyboardInterrupt:
        pass
    return 0
