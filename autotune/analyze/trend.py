"""Trends over a run: does the data wait grow after the first epoch, spike at epoch
starts, drift over the run, or stall now and then? Each finding is one sentence with
its figures; `findings()` also returns the per-epoch and per-segment tables."""

from __future__ import annotations

from typing import Any

from autotune.analyze.stats import EpochStats, LogHistogram, Timeline

SEGMENTS = 5
SPIKE_FACTOR = 5.0      # a first batch waiting 5x the epoch's usual wait ...
SPIKE_MIN_S = 0.05      # ... and at least 50 ms more
SHIFT_ABS = 0.10        # a data-share change of at least 10 points ...
SHIFT_REL = 1.5         # ... and 1.5x counts as a trend
STALL_FACTOR = 10.0     # p99 wait 10x the median, and at least 0.1 s: stalls
STALL_MIN_S = 0.1
MIN_EPOCH_RECORDS = 5   # an epoch with fewer records says nothing about a trend


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _moved(a: float | None, b: float | None) -> str | None:
    """'grows' / 'falls' when the share moved from a to b by a trend's margin."""
    if a is None or b is None:
        return None
    if b - a >= SHIFT_ABS and b >= a * SHIFT_REL:
        return "grows"
    if a - b >= SHIFT_ABS and a >= b * SHIFT_REL:
        return "falls"
    return None


def findings(epochs: dict[int, EpochStats], timeline: Timeline, data: LogHistogram,
             first_epoch: int | None, loader: Any = None) -> dict[str, Any]:
    """`loader`: the step log's header's loader settings (a stranger's: any type), which
    say what an epoch-start spike can come from."""
    eps = [epochs[k] for k in sorted(epochs)]
    segs = timeline.segments(SEGMENTS)
    out = (_epoch_starts(eps, first_epoch, loader) + _first_epoch_apart(eps) + _over_the_run(segs)
           + _stalls(data))
    if not out:
        out.append("steady: no growth after the first epoch, no spike at epoch starts, no "
                   "drift over the run")
    seg_d = [{"steps": s.n, "data_time_share": s.data_share, "t_start": s.t_first,
              "t_end": s.t_last} for s in segs]
    return {"findings": out, "by_epoch": [e.to_dict() for e in eps[:1000]],
            "epochs_listed": min(len(eps), 1000), "by_segment": seg_d}


def _start_cause(loader: Any) -> str:
    """What an epoch-start spike comes from, by the loader the log's header names."""
    lw = loader if isinstance(loader, dict) else {}
    w = lw.get("num_workers")
    if isinstance(w, int) and not isinstance(w, bool) and w == 0:
        return ("with no workers (num_workers=0) it is the dataset's or the sampler's own "
                "work at an epoch's start, not a worker start")
    if lw.get("persistent_workers") is True:
        return ("the workers are kept (persistent_workers=True), but torch's kept workers "
                "load nothing between epochs: the epoch's first batches are made after "
                "iter() (with a dataset's or sampler's own work at the epoch's start)")
    return ("the DataLoader starts its workers anew each epoch (persistent_workers=True "
            "keeps them)")


def _epoch_starts(eps: list[EpochStats], first_epoch: int | None, loader: Any = None) -> list[str]:
    """The first batch of each epoch against the rest of that epoch."""
    spikes = []
    for e in eps:
        rest_w = e.rest.timed_w
        if e.first_data_s is None or rest_w < 2:
            continue
        usual = e.rest.data / rest_w
        spikes.append((e.epoch, e.first_data_s, usual,
                       e.first_data_s >= SPIKE_FACTOR * usual and e.first_data_s - usual >= SPIKE_MIN_S))
    spiky = [s for s in spikes if s[3]]
    later = [s for s in spiky if s[0] != first_epoch]
    if later and len(later) >= max(1, (len(spikes) - 1) // 2):
        firsts = sorted(s[1] for s in later)
        usual = sorted(s[2] for s in later)
        return [f"data wait spikes at epoch starts: in {len(later)} of {len(spikes) - 1} "
                f"later epoch(s) the first batch waits {firsts[len(firsts) // 2]:.2f} s "
                f"(median) against {usual[len(usual) // 2]:.3f} s per batch otherwise: "
                + _start_cause(loader)]
    if spiky and spiky[0][0] == first_epoch:
        return [f"the first batch of the run waits {spiky[0][1]:.2f} s (worker start-up, "
                "left out as warm-up)"]
    return []


def _first_and_later(eps: list[EpochStats]) -> tuple[list[EpochStats], float | None,
                                                      float | None] | None:
    """The epochs with enough records, the first one's data share and the later ones'
    median (each without its first batch); None where fewer than two such epochs."""
    full = [e for e in eps if e.rest.n >= MIN_EPOCH_RECORDS]
    if len(full) < 2:
        return None
    later = sorted(e.rest.data_share for e in full[1:] if e.rest.data_share is not None)
    return full, full[0].rest.data_share, later[len(later) // 2] if later else None


def _first_epoch_apart(eps: list[EpochStats]) -> list[str]:
    """First epoch against the later ones (page cache, growing dataset, leaks); without
    each epoch's first batch: its spike is the epoch-start finding, not a trend."""
    split = _first_and_later(eps)
    if split is None:
        return []
    full, first, rest = split
    move = _moved(first, rest)
    if move == "grows":
        return [f"data time grows after the first epoch: {_share(first)} of the time in "
                f"epoch {full[0].epoch}, {_share(rest)} (median) later"]
    if move == "falls":
        return [f"data time falls after the first epoch: {_share(first)} in epoch "
                f"{full[0].epoch}, {_share(rest)} (median) later: the first pass read "
                "from storage, later ones mostly from the page cache (the data fits in "
                "RAM; a larger dataset would stay at the first epoch's figure)"]
    return []


def epochs_described(epochs: dict[int, EpochStats]) -> list[str]:
    """The verdict's line on which epochs it describes, where that matters: a first epoch
    whose data wait stands well above the later ones' (its cold pass) is diluted by them in
    the whole run's figures, and a verdict of the later, cached epochs (decode, say) is not
    the first epoch's."""
    split = _first_and_later([epochs[k] for k in sorted(epochs)])
    if split is None or _moved(split[1], split[2]) != "falls":
        return []
    full, first, rest = split
    return [f"this verdict describes epochs {full[0].epoch}-{full[-1].epoch} together: "
            f"epoch {full[0].epoch} alone waited {_share(first)} of its time for data, the "
            f"later ones {_share(rest)} (median), so the first pass (read from storage) is "
            "limited more than the verdict says (`autotune search` measures the cold first "
            "epoch and the later ones apart)"]


def _over_the_run(segs: list[Any]) -> list[str]:
    if len(segs) < 3:
        return []
    a, b = segs[0].data_share, segs[-1].data_share
    move = _moved(a, b)
    if move is None:
        return []
    return [f"over the run the data-time share {move}: {_share(a)} in the first "
            f"fifth, {_share(b)} in the last"]


def _stalls(data: LogHistogram) -> list[str]:
    p50, p99 = data.quantile(0.5), data.quantile(0.99)
    if p50 is not None and p99 is not None and p99 >= STALL_MIN_S and p99 >= STALL_FACTOR * max(p50, 1e-3):
        return [f"data wait stalls now and then: p50 {p50 * 1000:.1f} ms, p99 "
                f"{p99 * 1000:.0f} ms (slow files, cache misses, a worker falling behind)"]
    return []
