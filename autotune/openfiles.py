"""The open-files limit a pool's processes run under (RLIMIT_NOFILE, `ulimit -n`).

With torch's default sharing strategy on Linux ("file_descriptor") every tensor of a batch
a worker has made is an open file in that worker until the training process takes the
batch, and one in the training process while it rebuilds it. Over the limit a worker's
queue thread fails with EMFILE and drops the batch: the epoch then waits for it for ever
(torch's default timeout=0), or the training process fails with "received 0 items of
ancdata". A user who gave no num_workers loads in the training process and never meets
this; the workers autotune starts must not bring it.

Measured on Linux with torch 2.13 (one worker, a step slower than the loading, the queue
full): a worker's peak was about 25 + T x (P + 0.75) descriptors for T tensors a batch and
prefetch_factor P (T=48: 100, 157, 253, 445 for P = 1, 2, 4, 8; T=96, P=4: 493), the
training process's its own files plus about T (a rebuilt tensor keeps its file open while
it lives: the batch in the step's hands) while the batches came in order; one failed at
ulimit -n 210 with T=64, 2 workers 1 batch ahead, so `main_needs` counts every batch that
may arrive ahead of its turn too. A forked worker also starts with every file the training
process holds then (500 files opened before the loader: its worker started with 515), so a
worker's count includes the training process's own files where workers fork. Both stay
above what was measured: a worker fewer than the limit would allow costs some speed, a
worker over it the run.
"""

from __future__ import annotations

import os
import resource
from typing import Any

WORKER_OWN = 32   # a worker's files before any batch: interpreter, libraries, pipes (25 seen)
OWN_ALLOWANCE = 64  # the training process's own files where they are not read (a DDP step)
ENOUGH = 65536    # an open-files limit no loader of ours comes near


def fix(here: bool = True, job: tuple[int | None, int | None] | None = None) -> str:
    """The fix for a pool the limit cuts. A soft limit below the hard one (a container's
    1024 under 524288) can be raised without privilege, in the job's shell: said with the
    figure; otherwise the container's or the scheduler's limit must change. `job`: the
    job's own (soft, hard), None for unlimited (what the monitor read from its
    /proc/PID/limits), in place of this process's. `here` False and no `job`: the limit is
    not this process's (a search's --max-open-files), both ways are named."""
    inf = resource.RLIM_INFINITY
    if job is not None:
        soft, hard = (inf if x is None else x for x in job)
    else:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if job is None and not here:
        how = (f"`ulimit -n {ENOUGH}` in the job's shell, docker run --ulimit nofile="
               f"{ENOUGH}:{ENOUGH}, or LimitNOFILE=")
    elif soft != inf and (hard == inf or hard > soft):
        to = ENOUGH if hard == inf else min(hard, ENOUGH)
        if to <= soft:   # already above ENOUGH: the figure that raises it
            to = soft * 4 if hard == inf else min(hard, soft * 4)
        how = (f"`ulimit -n {to}` in the job's shell: its hard limit is "
               f"{'unlimited' if hard == inf else f'{hard:,}'}, so no privilege is needed")
    else:
        how = (f"`ulimit -n` is at its hard limit: docker run --ulimit nofile={ENOUGH}:"
               f"{ENOUGH}, or LimitNOFILE= or the scheduler's limit")
    return (f"raise the open-files limit ({how}), or call torch.multiprocessing."
            "set_sharing_strategy('file_system') first")


def limit() -> int | None:
    """This process's soft RLIMIT_NOFILE, which its workers inherit; None: no limit."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _shares_by_fd() -> bool:
    import torch.multiprocessing as mp

    return mp.get_sharing_strategy() == "file_descriptor"


def open_now() -> int:
    """The files this process holds open now (its own, the user's included)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 64


def forks() -> bool:
    """Whether workers start by fork (Linux's default before Python 3.14), and so inherit
    every file the training process holds when they start: 500 files opened before the
    loader made a worker start with 515. A loader's own multiprocessing_context is not
    seen here: with spawn or forkserver the count errs high."""
    import multiprocessing as mp

    # get_context() would fix the default for good: a later set_start_method would raise.
    return (mp.get_start_method(allow_none=True) or mp.get_all_start_methods()[0]) == "fork"


def worker_needs(tensors: int, prefetch_factor: int | None, inherited: int = 0) -> int:
    """A worker's open files at its peak: its own, those it inherited from the process that
    forked it, and prefetch_factor + 1 batches' tensors."""
    return WORKER_OWN + inherited + tensors * ((prefetch_factor or 2) + 1)


def main_needs(tensors: int, workers: int, ahead: int, own: int | None = None) -> int:
    """The training process's: what it holds now, and one open file per tensor of every
    batch it has taken and not yet freed (a rebuilt tensor keeps its file open while it
    lives): the batch the step holds, the one being rebuilt, and up to `ahead` more that
    workers handed over before the one the loop waits for (kept until their turn, in
    order); each worker's pipes. `own`: the process's own files (default: read now)."""
    return (open_now() if own is None else own) + tensors * (ahead + 2) + 4 * workers + 8


def over(cfg: Any, tensors: int, also: Any = None, own: int | None = None) -> str | None:
    """Why `cfg`'s pool (with `also`'s beside it during a switch) would run past the
    open-files limit, with `tensors` tensors a batch; None when it fits, when there is no
    limit, no worker, no tensor counted, or the sharing strategy is "file_system". `own`:
    main_needs'."""
    lim = limit()
    if lim is None or not tensors or not cfg.num_workers or not _shares_by_fd():
        return None
    mine = open_now() if own is None else own
    inherited = mine if forks() else 0
    w = worker_needs(tensors, cfg.prefetch_factor, inherited)
    if w > lim:
        return (f"{cfg.short()}: a worker would hold about {w:,} open files ({tensors:,} "
                f"tensors a batch, {(cfg.prefetch_factor or 2) + 1} batches"
                + (f", {inherited:,} inherited from this process" if inherited else "")
                + f"), over this process's limit of {lim:,} (ulimit -n)")
    pools = [c for c in (cfg, also) if c is not None and c.num_workers]
    m = main_needs(tensors, sum(c.num_workers for c in pools),
                   sum(c.num_workers * (c.prefetch_factor or 2) for c in pools) - 1, mine)
    if m > lim:
        return (f"{cfg.short()}: the training process would hold about {m:,} open files "
                f"(its own {mine:,}, the tensors of the "
                f"batches it may hold, {tensors:,} a batch, the workers' pipes), over its "
                f"limit of {lim:,} (ulimit -n)")
    return None
