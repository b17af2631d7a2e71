"""A pool that failed for a reason of autotune's (autotune.online.failure): the epoch carries
on at once at a configuration that needs less. The index batches the failed pools had taken
but not delivered go back to the stream, so nothing is lost or repeated (an IterableDataset
loses the rest of that epoch instead)."""

from __future__ import annotations

from typing import Any

from autotune import openfiles
from autotune.online import failure
from autotune.online.config import Config
from autotune.online.controller import Controller, emit
from autotune.online.limits import room_fits
from autotune.online.stream import length_of


def recover_or_raise(dl: Any, exc: Exception) -> None:
    """Carry the epoch of `dl` (an autotune.DataLoader) on at a configuration that needs
    less when `exc` is a failure of a pool autotune chose; re-raise it otherwise."""
    serving = [p for p in dl._pools if p.recoverable]
    why_ = failure.classify(exc, [w for p in serving for w in p.procs()]) if serving else None
    if why_ is None:
        if not serving and dl._pools and dl._pools[0].config.num_workers and (
                yours := failure.classify(exc, [])) is not None:
            _say_nothing_less(dl, dl._pools[0].config, yours)  # the user's pool
        raise exc
    failed = dl._pools[0].config if dl._pools[0].recoverable else serving[0].config
    for p in serving:
        # Before the choice reads this process's open files, and before a new pool forks
        # with them: the failed pool's batches received ahead of their turn (~900 files).
        p.drop_held()
    to = fallback(dl, failed, why_)
    if to is None:
        _say_nothing_less(dl, failed, why_)
        raise exc
    back = _stop_all(dl)
    dl._target = to
    if dl._sync is not None:
        # Every rank's controller hears of it at the next decision step and falls back
        # alike there; until then the agreed configuration (which sets that step) stays.
        dl._sw.note_failed(failed, to)
    else:
        dl._sw.agreed = to
        if isinstance(dl._ctl, Controller):  # tuning or not: the failed one stays out
            dl._ctl.fell_back(failed, to, why_.detail)
    pos = dl._epoch.pos
    lose = dl._iterable and pos > 0  # a new pool starts the dataset's iterator again
    if lose:
        lost = f"the rest of this epoch is lost ({pos} batches delivered"
        total = length_of(dl.dataset)
        lost += f" of about {total // max(1, dl.batch_size or 1)})" if total else ")"
        tail = f"; {lost}, the next epoch starts at {to.short()}"
    else:
        tail = (f"; the epoch carries on at {to.short()} from batch {pos} "
                f"({back} batches in flight fetched again, none lost or repeated)")
    alone = not to.num_workers
    if alone:
        tail += "; every later batch of this run is made in the training process" + (
            f": to give it workers back, {openfiles.fix()}" if why_.kind == "files"
            else _shm_fix(dl, failed, why_))
    # At WARNING where it leaves no worker, as the start point's fit says it: the loss the
    # user installed autotune.DataLoader for, which a user without logging set up saw
    # nothing of.
    emit("fell-back", f"{failed.short()} failed ({why_.detail}): not tried again in this "
         f"run{tail}", warn=alone, config=to.kwargs(), failed=failed.kwargs(),
         kind=why_.kind, why=why_.detail, refetched=back, delivered=pos)
    if lose:
        dl._epoch.epoch_cfg = to
        raise StopIteration  # Epoch.next ends the epoch
    pool = dl._epoch.new_pool(to)
    dl._pools = [pool]
    dl._meter.reset(dl._window(to), skip=to.queue, group=to.num_workers)
    pool.open(dl._epoch.stream, pos)


def _shm_fix(dl: Any, failed: Config, why_: failure.PoolFailure) -> str:
    """What gives workers back after /dev/shm refused `failed`'s batches: the /dev/shm it
    needs, and what the other autotune.DataLoaders of this process hold there now (a
    validation loader's batches beside the training loader's)."""
    if why_.kind != "shm":
        return ""
    from autotune.online.budget import shm_held_by_others
    from autotune.online.limits import mib, shm_need
    from autotune.shmfit import needed_bytes

    per, held = dl._batch_bytes, shm_held_by_others(dl)
    ranks = max(1, dl._local or 1)
    need = (f"{shm_need(needed_bytes(failed.num_workers, failed.prefetch_factor, per), ranks)}"
            f" would hold {failed.short()}" if per else
            f"/dev/shm had no room for the batches of {failed.short()}")
    beside = (f", beside the {mib(held)} the batches of another autotune.DataLoader of this "
              "process hold there now" if held else "")
    return (f": {need}{beside} (docker run --shm-size, or a smaller batch element: uint8, "
            "normalised on the accelerator)")


def _say_nothing_less(dl: Any, failed: Config, why_: failure.PoolFailure) -> None:
    """Before torch's error is raised (the user's settings leave nothing less to try): at
    WARNING, that the failure was /dev/shm's (what the user's setting holds there) or the
    open-files limit's, and the fix, as the start point's fit says it (limits.say_fit)."""
    mine = {k: dl._fixed[k] for k in ("num_workers", "prefetch_factor") if k in dl._fixed}
    given = ", ".join(f"{k}={v}" for k, v in mine.items())
    if why_.kind == "files":
        emit("no-fallback", f"{failed.short()} failed ({why_.detail}); {given} as given "
             "leaves nothing less within the open-files limit, so torch's error is raised. "
             f"To run it, {openfiles.fix()}; or give fewer num_workers", warn=True,
             config=failed.kwargs(), why=why_.detail)
    if why_.kind != "shm":
        return
    from autotune.shmfit import needed_bytes

    per = dl._batch_bytes
    need = ""
    if per:
        pf = failed.prefetch_factor if "prefetch_factor" in mine else 1  # the least
        held = needed_bytes(failed.num_workers, pf, per)
        need = (f": batches of {per / 2**20:,.0f} MiB, about {held / 2**20:,.0f} MiB of "
                f"/dev/shm at num_workers={failed.num_workers}, prefetch_factor={pf}")
    emit("no-fallback", f"{failed.short()} failed ({why_.detail}); {given} as given "
         f"leaves nothing less to try, so torch's error is raised{need}. Give the job more "
         "/dev/shm (docker run --shm-size), fewer num_workers, or a smaller batch element "
         "(uint8, normalised on the accelerator)", warn=True, config=failed.kwargs(),
         why=why_.detail)


def _stop_all(dl: Any) -> int:
    """Every pool's undelivered index batches back to the stream, the switch and the burst
    under way dropped, the pools retired: how many batches went back."""
    pools = dl._pools + ([dl._sw.pending] if dl._sw.pending is not None else [])
    back = 0
    for p in pools:
        back += p.lease.give_back()
    dl._sw.drop()
    dl._budget.deferred = None
    dl._budget.cancel()
    for p in pools:
        dl._epoch.retire(p)
    dl._pools = []
    return back


def fallback(dl: Any, failed: Config, why_: failure.PoolFailure) -> Config | None:
    """What the loop carries on at: the last configuration that served a full window and
    needs less than `failed`, else fewer workers and a shorter queue, down to loading in
    this process (one worker with a worker_init_fn); None when the user's own settings
    leave nothing less."""
    ctl = dl._ctl if isinstance(dl._ctl, Controller) else None
    if why_.kind == "shm" and ctl is not None and dl._batch_bytes:
        from autotune.shmfit import needed_bytes

        # /dev/shm held less than the budget said (another process, a smaller mount):
        # nothing needing as much is within the room, with the other loaders' batches
        # where they are now (limits.shm_room subtracts them).
        need = needed_bytes(failed.num_workers, failed.prefetch_factor, dl._batch_bytes)
        held = ctl.beside() if ctl.beside is not None else 0
        ctl.shm = min(ctl.shm if ctl.shm is not None else need + held, need - 1 + held)

    # Within the open-files limit first, from a batch's tensors (none before a first
    # batch); where nothing less fits it (the user's num_workers), the largest less all
    # the same: the count errs high (8 workers 1 deep ran at ulimit -n 1024 with 128
    # tensors a batch), and what else is left is torch's error.
    tensors = getattr(getattr(dl, "_budget", None), "tensors", 0)
    for files in ((tensors, 0) if tensors else (0,)):
        if (to := _less_than(dl, ctl, failed, files)) is not None:
            return to
    return None


def _less_than(dl: Any, ctl: Controller | None, failed: Config, tensors: int) -> Config | None:
    """The first configuration that needs less than `failed`: the last that served a full
    window, else fewer workers and a shorter queue; with `tensors`, within the open-files
    limit too."""
    def less(c: Config) -> bool:
        return (c != failed and c.num_workers <= failed.num_workers
                and c.queue <= failed.queue
                and (ctl is None or ctl.needs_as_much(c) is None)
                and (ctl is None or room_fits(ctl, c, dl._batch_bytes or 0))
                and not (tensors and c.num_workers and openfiles.over(c, tensors)))

    for seen in (dl._latest, dl._first):
        if seen is not None and less(seen.config):
            return seen.config
    w, pf = failed.num_workers, failed.prefetch_factor or 2
    make = ctl.make if ctl is not None else (
        lambda n, p: Config(n, p if n else None, failed.persistent_workers,
                            failed.pin_memory))
    # With a worker_init_fn, this process only as the last resort: the dataset may work only
    # in workers; but without num_workers given, torch's default (0) would run it here.
    least = int(dl.worker_init_fn is not None)
    while w > 0:
        nw = w if "num_workers" in dl._fixed else max(least, w // 2)
        npf = pf if "prefetch_factor" in dl._fixed else max(1, pf // 2)
        if (nw, npf) == (w, pf):
            break  # the user's own settings, or one worker: nothing less in workers
        w, pf = nw, npf
        cand = make(w, pf)
        if less(cand):
            return cand
    if least and w and "num_workers" not in dl._fixed and less(last := make(0, None)):
        return last
    return None
