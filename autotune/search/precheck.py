"""The search's settings checked against its space before any trial (autotune.search.session
runs them in prepare()), and the dataset's size before any ceiling (check_samples, from
autotune.search.study): a cold pass too short to measure most configurations (exit 2; when
most fit, a note on the others, skipped), a --seconds or --confirm-seconds too short for the
step (exit 2), and the note that the emulated step scales with the batch. `s` is the
search's Session, its ceilings and space set."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from autotune.bench.config import MIN_WINDOW_BATCHES, BenchConfig
from autotune.errors import UsageError
from autotune.search import recommend as rec_mod


def check_samples(root: Any, n: int, base: BenchConfig, cold: bool,
                  batch_sizes: list[int] | None = None) -> None:
    """A dataset whose cold pass cannot hold even the cheapest configuration's measurement
    is refused as soon as its samples are counted (exit 2), before the probe and the decode
    ceiling (about 14 s) whose figures could change nothing. `batch_sizes`: the space's,
    when it searches them (its smallest is the cheapest). check_window decides the rest
    against the space, which those ceilings shape."""
    ranks, need = base.procs_per_node, base.fewest_batches
    bs = min(batch_sizes) if batch_sizes else base.batch_size
    have = n // ranks // bs
    if not cold or have >= need:
        return
    share = f" (each of {ranks} ranks reads {n // ranks:,})" if ranks > 1 else ""
    which = " (the space's smallest)" if batch_sizes else ""
    raise UsageError(
        f"{root}: {n:,} images{share} make {have} batches of {bs}{which} per cold pass; a "
        f"measurement needs at least {need} ({need - MIN_WINDOW_BATCHES} warm-up + "
        f"{MIN_WINDOW_BATCHES} measured) before the pass ends, in any configuration. Use a "
        f"smaller batch size (at most {max(1, n // ranks // need)}), --warm (later passes "
        "labelled warm), or a larger dataset.", setting="batch_size")


def cold_pass_refused(n: int, batch_size: int, cores: int, ranks: int = 1) -> bool:
    """Whether `autotune search` with its default space and preset, on `cores` cores and
    `ranks` ranks a node (each reads its share, its workers bounded by its share of the
    cores), would refuse a dataset of `n` samples at `batch_size` for its cold pass
    (check_samples, check_window): for analyze's next command, which then carries --warm.
    The worker bound is the cores' (a probe that finds latency to hide raises it, and with
    it the batches deep queues need)."""
    from autotune.search.space import load_space

    base = BenchConfig.from_preset("resnet50", batch_size=batch_size)
    grid = load_space(None, cores=max(1, cores // ranks), cuda=False).grid()
    n //= max(1, ranks)
    out = 0
    for p in grid:
        need, bs = cold_need(base, p)
        out += n // bs < need
    return n // batch_size < base.fewest_batches or out * 2 > len(grid)


def cold_need(base: BenchConfig, params: dict[str, Any]) -> tuple[int, int]:
    """(batches a measurement of `params` needs in one cold pass: its warm-up and the
    fewest a figure is made of; its batch size), from the search's `base` settings."""
    cfg = replace(base, **{k: params[k] for k in ("num_workers", "prefetch_factor",
                                                 "batch_size") if k in params})
    return cfg.effective_warmup + cfg.min_batches, cfg.batch_size


def check_window(s: Any) -> None:
    """A cold pass too short to measure most of the space is said up front (exit 2),
    not decided from noise: a configuration needs its warm-up (at least 5 batches, its
    whole prefetch queue) and 10 measured batches, at least twice the queue, before the
    pass ends. When most fit, the others are skipped (not measured), with a note."""
    n, bs = s.ceilings.samples, s.base.batch_size
    if not s.opts.cold or n is None:
        return
    grid = s.space.grid()
    out = [p for p in grid if s.unfit(p)]
    if not out:
        return
    ranks = s.base.procs_per_node
    needs = sorted(s.needs(p)[0] for p in grid)
    need, cheapest, half = needs[-1], needs[0], needs[(len(needs) + 1) // 2 - 1]
    have = n // ranks // bs
    if len(out) * 2 <= len(grid):
        s.space.notes.append(
            f"{len(out)} of the space's {len(grid)} configurations need more than the "
            f"{have} batches of {bs} in one cold pass over {n:,} images (deep prefetch "
            "queues: warm-up + twice the queue): skipped, not measured")
        return
    share = f" (each of {ranks} ranks reads {n // ranks:,})" if ranks > 1 else ""
    fit = (f"a measurement needs at least {cheapest} ({cheapest - MIN_WINDOW_BATCHES} "
           f"warm-up + {MIN_WINDOW_BATCHES} measured) before the pass ends"
           if len(out) == len(grid) else
           f"only {len(grid) - len(out)} of the space's {len(grid)} configurations can "
           f"be measured in one (their warm-up and at least twice their prefetch queue: "
           f"up to {need} batches)")
    raise UsageError(
        f"{s.root}: {n:,} images{share} make {have} batches of {bs} per cold pass; "
        f"{fit}. Use a smaller batch size (at most {max(1, n // ranks // half)} to "
        "measure half of the space), "
        "--warm (later passes labelled warm), or a larger dataset.", setting="batch_size")


def check_seconds(s: Any) -> None:
    """A --seconds or --confirm-seconds too short for the step is refused up front
    (exit 2) in one line naming the seconds it needs, not found out trial by trial:
    the configuration of the space (or the baseline) that needs the longest window."""
    given = [(f, v) for f, v in (("--seconds", s.opts.seconds),
                                 ("--confirm-seconds", s.opts.confirm_seconds))
             if v is not None]
    if not given:
        return
    grid = s.space.grid()
    if s.opts.baseline:
        grid = [*grid, rec_mod.baseline_params(s.cores_per_rank, s.cuda)]
    cfgs = [s.config(p, seconds=float("inf")) for p in grid]
    worst = max(cfgs, key=lambda c: c.window_needed_s or 0.0)
    for flag, v in given:
        short = worst.short_window(v, flag)
        if short:
            raise UsageError(short, setting="seconds")


def batch_note(s: Any) -> None:
    """Where the space searches batch_size over an emulated step: the note that the step's
    cost scales with the batch (its ms per image is the same at every size)."""
    bss = s.space.choices.get("batch_size")
    if not bss or s.base.step is not None or not s.base.compute_ms:
        return
    per = s.base.compute_ms / s.base.batch_size
    s.space.notes.append(
        f"the emulated step scales with the batch: {s.base.compute_ms:g} ms per batch "
        f"of {s.base.batch_size} is {per:.3g} ms per image, so "
        + ", ".join(f"{b}: {per * b:,.0f} ms" for b in bss)
        + f"; the demand ceiling is {1000 / per:,.0f} images/s at every size (a larger "
        "batch is not free)")
