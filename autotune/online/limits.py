"""What a configuration may hold, for the controller (autotune.online.controller): the
memory budget (workers' own memory plus the batches in flight, both pools counted during a switch's
overlap), the /dev/shm budget its batches fill, and the start point shrunk until it fits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune import openfiles
from autotune.online.config import Config
from autotune.online.memory import footprint


@dataclass(frozen=True)
class MemoryFigures:
    """What the budget check needs, measured by the loader when asked."""

    per_worker: int   # a worker's own bytes (USS measured, or the estimate before any)
    per_batch: int    # bytes of one batch
    measured: bool    # per_worker was read from the pool's workers
    tensors: int = 0  # tensors in one batch: open files in flight (autotune.openfiles)
    # The figure is an estimate no forked worker starts at (autotune.online.memory): one
    # worker may be started to measure it where only that estimate refuses it.
    try_one: bool = False


def shm_fits(shm: int | None, cfg: Config, per_batch: int, also: Config | None = None) -> bool:
    """Whether `cfg`'s live batches (and `also`'s, alive beside it during a switch) fit
    in the /dev/shm budget `shm`; True while the batch or the budget is unknown; never with
    workers in a budget of 0 (no /dev/shm: workers cannot hand a batch over)."""
    from autotune.shmfit import needed_bytes

    if shm is None or not cfg.num_workers:
        return True
    if shm <= 0:
        return False
    if not per_batch:
        return True
    need = needed_bytes(cfg.num_workers, cfg.prefetch_factor, per_batch)
    if also is not None and also.num_workers:
        need += needed_bytes(also.num_workers, also.prefetch_factor, per_batch)
    return need <= shm


def shm_room(ctl: Any) -> int | None:
    """The controller `ctl`'s /dev/shm budget less what the process's other
    autotune.DataLoaders hold beside it now (autotune.online.budget; None: unknown, not
    checked): a validation loader started while the training loader's batches fill
    /dev/shm has only what they leave."""
    shm, beside = getattr(ctl, "shm", None), getattr(ctl, "beside", None)
    if shm is None or beside is None:
        return shm
    return max(0, shm - beside())


def room_fits(ctl: Any, cfg: Config, per_batch: int) -> bool:
    """Whether `cfg`'s live batches fit in the controller `ctl`'s /dev/shm room
    (shm_room, shm_fits)."""
    return shm_fits(shm_room(ctl), cfg, per_batch)


def no_worker_text(ctl: Any, cfg: Config, fitted: Config, per_batch: int) -> str:
    """What the start point's fit adds when it leaves no worker ("" while `fitted` has
    some): every batch is then made in the training process, the loss the user installed
    autotune.DataLoader for, so it names what would give workers back (said at WARNING)."""
    if fitted.num_workers:
        return ""
    if room_fits(ctl, Config(1, 1, False, cfg.pin_memory), per_batch):
        return "; every batch is made in the training process"
    from autotune.shmfit import needed_bytes

    need = needed_bytes(cfg.num_workers, cfg.prefetch_factor, per_batch)
    return (f"; every batch is made in the training process: "
            f"{shm_need(need, getattr(ctl, 'shm_ranks', 1))} would hold {cfg.short()} "
            "(docker run --shm-size, or a smaller batch)")


def shm_need(need: int, ranks: int) -> str:
    """The free /dev/shm that holds `need` bytes of one rank's batches, said for the node
    when `ranks` ranks share it (a --shm-size of one rank's need leaves each half)."""
    if ranks <= 1:
        return f"{mib(need)} of free /dev/shm"
    return (f"{mib(need * ranks)} of free /dev/shm for this node's {ranks} ranks "
            f"({mib(need)} each)")


def say_fit(ctl: Any, cfg: Config, fitted: Config, per_batch: int | None) -> None:
    """The "fit" decision: the start point is `fitted`, not `cfg`, to stay within the
    controller `ctl`'s budgets; `per_batch` is the first batch's bytes (None: cut before
    any batch, by the budgets alone: a /dev/shm share of nothing leaves no worker whatever
    the batch). At WARNING when no worker is left."""
    from autotune.online.decisions import emit

    shm = f"{mib(ctl.shm or 0)} of /dev/shm" if ctl.shm is not None else "/dev/shm unchecked"
    held = ctl.beside() if ctl.shm is not None and ctl.beside is not None else 0
    if held:
        shm = (f"{mib(shm_room(ctl) or 0)} of /dev/shm left beside the {mib(held)} the "
               "batches of another autotune.DataLoader of this process hold there now")
    files = openfiles.over(cfg, ctl.memory().tensors) if per_batch is not None else None
    if files:
        text = (f"start at {fitted.short()} instead of {cfg.short()}: {files}; "
                + ("every batch is made in the training process: " if not fitted.num_workers
                   else "") + f"to give it more, {openfiles.fix()}")
    elif per_batch is not None:
        text = (f"start at {fitted.short()} instead of {cfg.short()}: the first batch is "
                f"{mib(per_batch)}, and {cfg.short()} would hold more in /dev/shm or memory "
                f"than the budget ({shm}, {mib(ctl.budget)} of memory)"
                + no_worker_text(ctl, cfg, fitted, per_batch))
    else:
        text = (f"{cfg.short()} cut to {fitted.short()} before the first batch: this rank's "
                f"budgets are {shm} and {mib(ctl.budget)} of memory" + _cut_by(ctl, fitted))
    emit("fit", text, warn=not fitted.num_workers, config=fitted.kwargs(), old=cfg.kwargs(),
         batch_bytes=per_batch, shm_budget=ctl.shm, budget=ctl.budget)


def _cut_by(ctl: Any, fitted: Config) -> str:
    """Which budget left `fitted` without a worker before the first batch ("" while it has
    some): /dev/shm where not even one worker's batch has room, else memory."""
    if fitted.num_workers:
        return ""
    if not room_fits(ctl, Config(1, 1, False, fitted.pin_memory), 0):
        return ("; workers hand their batches over through /dev/shm, so every batch is "
                "made in the training process until it has room (docker run --shm-size, "
                "or fewer ranks on the node)")
    mem = ctl.memory()
    return (f"; a worker's memory, {mib(mem.per_worker)} "
            + ("measured" if mem.measured else "estimated (this process's anonymous "
               "memory)") + " each, is over the memory budget, so every batch is made in "
            "the training process (memory_budget=, or a higher memory limit, gives it room)")


def fit(ctl: Any, cfg: Config) -> Config:
    """`cfg`, or fewer workers (the last step before none: one worker, one batch ahead)
    until it fits the controller `ctl`'s memory and /dev/shm budgets, and a shorter queue
    first where the open-files limit is what it runs past (a batch's files are in flight
    per batch ahead); the settings given stay, and a loader that needs a worker
    (ctl.min_workers) keeps one, one batch ahead."""
    mem = ctl.memory()
    cfg = _fewer_files_ahead(ctl, cfg, mem.tensors)
    if "num_workers" in ctl.fixed:
        return cfg
    least = ctl.min_workers()
    while cfg.num_workers and (footprint(
            cfg.num_workers, cfg.prefetch_factor, mem.per_worker, mem.per_batch) > ctl.budget
            or not room_fits(ctl, cfg, mem.per_batch) or openfiles.over(cfg, mem.tensors)):
        if measure_one(ctl, cfg, mem):
            break
        if cfg.num_workers == 1 and (cfg.prefetch_factor or 2) > 1 and \
                "prefetch_factor" not in ctl.fixed:
            cfg = ctl.make(1, 1)  # one worker, one batch ahead: the last step before none
        elif cfg.num_workers > least:
            cfg = ctl.make(cfg.num_workers - 1, cfg.prefetch_factor)
        else:
            break
    return cfg


def measure_one(ctl: Any, cfg: Config, mem: MemoryFigures) -> bool:
    """Whether `cfg`, one forked worker as few batches ahead as it may go, is kept although
    the estimate of a worker's memory is over the budget: that estimate (everything the
    worker could copy) is what no forked worker starts at (17-20 MiB of its own, measured,
    against a 395 MiB estimate, with torch 2.14.1), and with no worker none is ever
    measured, so the loader would stay without one for good. Its batches must fit the
    memory budget and /dev/shm as they are, and it goes first where memory runs out: the
    OOM killer's first choice, and a pool autotune chose falls back to none."""
    if not (mem.try_one and not mem.measured and cfg.num_workers == 1):
        return False
    if (cfg.prefetch_factor or 2) > 1 and "prefetch_factor" not in ctl.fixed:
        return False   # one batch ahead first
    return (footprint(1, cfg.prefetch_factor, 0, mem.per_batch) <= ctl.budget
            and room_fits(ctl, cfg, mem.per_batch) and not openfiles.over(cfg, mem.tensors))


def _fewer_files_ahead(ctl: Any, cfg: Config, tensors: int) -> Config:
    """`cfg` with its prefetch_factor halved (unless given) while the open-files limit is
    what it runs past: both the workers' files and the training process's grow with the
    batches ahead, and fewer batches ahead keep the workers' parallelism."""
    while cfg.num_workers and (cfg.prefetch_factor or 2) > 1 and \
            "prefetch_factor" not in ctl.fixed and openfiles.over(cfg, tensors):
        cfg = ctl.make(cfg.num_workers, (cfg.prefetch_factor or 2) // 2)
    return cfg


def over_budget(cand: Config, cur: Config, mem: MemoryFigures, budget: int,
                shm: int | None) -> str | None:
    """Why a switch from `cur` to `cand` is refused (None: it fits): both pools are alive
    during its overlap, in memory and in /dev/shm."""
    need = (footprint(cur.num_workers, cur.prefetch_factor, mem.per_worker, mem.per_batch)
            + footprint(cand.num_workers, cand.prefetch_factor, mem.per_worker,
                        mem.per_batch))
    if not shm_fits(shm, cand, mem.per_batch, also=cur):
        from autotune.shmfit import needed_bytes

        need_shm = needed_bytes(cand.num_workers, cand.prefetch_factor, mem.per_batch)
        beside = (needed_bytes(cur.num_workers, cur.prefetch_factor, mem.per_batch)
                  if cur.num_workers else 0)
        return (f"{cand.short()} would hold {mib(need_shm)} of batches in /dev/shm "
                f"({mib(mem.per_batch)} each)"
                + (f", {mib(need_shm + beside)} with the current pool's beside it during "
                   "the switch" if beside else "")
                + f", over its budget of {mib(shm or 0)}")
    # The files this process holds as a fixed allowance, not as read now: the ranks of a
    # DDP job must take the same decision from the same figures, and each holds others.
    if files := openfiles.over(cand, mem.tensors, also=cur, own=openfiles.OWN_ALLOWANCE):
        return files
    if need <= budget:
        return None
    return (f"{cand.short()} needs {mib(need)} during the switch (workers' own "
            f"{mib(mem.per_worker)} each{'' if mem.measured else ', estimated'}, batch "
            f"{mib(mem.per_batch)}), over the memory budget of {mib(budget)}")


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"
