"""Ranks on a node: the measurement process as a launcher of N rank processes.

With `procs_per_node` N > 1 the measurement process starts N rank processes (the same
`autotune.bench.child`, each told its rank), as torchrun starts a job's ranks: each with
its own DataLoader over its share of the samples (DistributedSampler for a map-style
dataset; RANK/WORLD_SIZE for an iterable one, which splits itself) and its own step. They
share the launcher's process group, so the runner's monitor sees every rank's tree (CPU,
memory summed) and its hard timeout kills them all.

The launcher keeps the runner's protocol: it says "ready" when every rank has imported
its libraries (so the cache drop happens once, before any rank reads), passes "go" to
all, relays rank 0's progress, and writes one result holding every rank's. A rank that
dies fails the measurement naming the rank and its exit status; the others are stopped.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from autotune.bench.procs import StatusPipe, write_status

RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


class _Rank:
    def __init__(self, rank: int, world: int, spec: dict[str, Any], tmp: Path) -> None:
        self.rank = rank
        self.spec_path = tmp / f"rank{rank}.spec.json"
        self.result_path = tmp / f"rank{rank}.result.json"
        self.spec_path.write_text(json.dumps({**spec, "rank": rank, "world": world,
                                              "parent_pid": os.getpid()}))
        status_r, status_w = os.pipe()
        go_r, self.go_w = os.pipe()
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "autotune.bench.child", str(self.spec_path),
             str(self.result_path), str(status_w), str(go_r)],
            stdin=subprocess.DEVNULL, pass_fds=(status_w, go_r), env=env)
        os.close(status_w)
        os.close(go_r)
        self.status = StatusPipe(status_r)
        self.ready = False

    @property
    def done(self) -> bool:
        return self.status.eof

    def result(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.result_path.read_text())
        except (OSError, ValueError):
            return None


def launch(spec: dict[str, Any], world: int, status_fd: int, go_fd: int,
           out: dict[str, Any]) -> None:
    """Run `world` ranks to the end; fills `out` with rank 0's result plus `ranks`."""
    tmp = Path(spec.get("tmp") or os.path.dirname(os.path.abspath(sys.argv[1])))
    ranks = [_Rank(r, world, spec, tmp) for r in range(world)]
    out["phase"] = "startup"
    try:
        _wait(ranks, lambda rk, line: setattr(rk, "ready", rk.ready or line == "ready"),
              until=lambda: all(rk.ready for rk in ranks), status_fd=status_fd)
        out["marks"]["ready"] = time.monotonic()
        write_status(status_fd, "ready")
        if not os.read(go_fd, 1):
            raise SystemExit(3)  # the runner is gone
        out["marks"]["go"] = time.monotonic()
        for rk in ranks:
            os.write(rk.go_w, b"g")
        out["phase"] = "measure"
        _wait(ranks, lambda rk, line: _relay(rk, line, world, status_fd),
              until=lambda: all(rk.proc.poll() is not None for rk in ranks),
              status_fd=status_fd)
    finally:
        for rk in ranks:
            if rk.proc.poll() is None:
                rk.proc.kill()
            rk.proc.wait()
    results = [rk.result() for rk in ranks]
    _combine(out, ranks, results)


def _relay(rk: _Rank, line: str, world: int, status_fd: int) -> None:
    """Rank 0's progress stands for the node's; a tick's images are the node's estimate."""
    if rk.rank != 0:
        return
    word, _, arg = line.partition(" ")
    if word == "tick":
        secs, images = arg.split()
        write_status(status_fd, f"tick {secs} {int(images) * world}")
    elif word in ("warmup", "measure"):
        write_status(status_fd, line)


def _wait(ranks: list[_Rank], on_line: Any, *, until: Any, status_fd: int) -> None:
    """Read every rank's status lines until `until()`; a rank that exits with an error
    stops the others (its result names the failure)."""
    while not until():
        live = [rk for rk in ranks if not rk.done]
        if live:
            ready, _, _ = select.select([rk.status.fd for rk in live], [], [], 0.2)
            for rk in live:
                if rk.status.fd in ready:
                    for line in rk.status.read(0):
                        on_line(rk, line)
        else:
            time.sleep(0.05)
        dead = [rk for rk in ranks if rk.proc.poll() not in (None, 0)]
        if dead:
            for rk in ranks:
                if rk.proc.poll() is None:
                    rk.proc.send_signal(signal.SIGKILL)
            return


def _combine(out: dict[str, Any], ranks: list[_Rank], results: list[dict[str, Any] | None]) -> None:
    failed = [(rk, r) for rk, r in zip(ranks, results) if r is None or not r.get("ok")]
    # The rank that failed on its own first, not the ones the launcher then stopped.
    failed.sort(key=lambda f: f[0].proc.returncode == -signal.SIGKILL and f[1] is None)
    first = results[0] or {}
    for k in ("torch", "cuda", "dataset", "epoch_batches", "images", "nofile_limit",
              "stop_reason", "epochs", "warmup_done", "warmup_wait_s", "batches", "window_io",
              "extended_s", "stages"):
        if k in first:
            out[k] = first[k]
    out["marks"].update({k: v for k, v in (first.get("marks") or {}).items()
                         if k not in ("ready", "go")})
    out["ranks"] = [{"rank": rk.rank, "pid": rk.proc.pid, "returncode": rk.proc.returncode,
                     "ok": bool(r and r.get("ok")), "batches": (r or {}).get("batches"),
                     "marks": (r or {}).get("marks"), "stop_reason": (r or {}).get("stop_reason"),
                     "error": (r or {}).get("error")} for rk, r in zip(ranks, results)]
    out["warnings"].extend(w for r in results if r for w in r.get("warnings", [])
                           if w not in out["warnings"])
    if failed:
        rk, r = failed[0]
        err = (r or {}).get("error") or {}
        code = rk.proc.returncode
        status = f"killed by signal {-code}" if code is not None and code < 0 else f"exit status {code}"
        why = (f"{err.get('type')}: {err.get('message')}" if err else
               f"{status} before writing a result")
        raise RankFailed(f"rank {rk.rank} of {len(ranks)} (pid {rk.proc.pid}) failed: {why}; "
                         "the other ranks were stopped", err.get("phase") or "rank")


class RankFailed(Exception):
    def __init__(self, message: str, phase: str) -> None:
        super().__init__(message)
        self.phase = phase
