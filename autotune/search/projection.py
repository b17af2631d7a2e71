"""`--epochs N`: the run's time with and without conversion and staging, from the whole
run's measured figures (autotune.search.runcache), and whether converting shortens it.

Without conversion the first epoch runs at the first epoch's images/s (cold) and the
others at the later epochs' (warm, or from the page cache's hit rate). With it, the
conversion's cost comes first: one read of every file at the storage ceiling (measured),
no faster than the first epoch reads them, plus the dataset written twice (the conversion,
its staged copy) at the write rate measured in the stage directory; then every epoch at
the rate storage no longer limits. `autotune.search.loop` converts only where this is
shorter, and its decision quotes `text` either way.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from autotune.search.runcache import size_text

__all__ = ["conversion_projection", "project", "write_rate"]


def write_rate(directory: str | os.PathLike[str], nbytes: int = 64 * 2**20) -> float | None:
    """MiB/s of writing `nbytes` (fsynced) to a scratch file in `directory` (created if
    missing; the file removed). None where it cannot be written."""
    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
        f = d / f".autotune-write-rate-{os.getpid()}"
        buf = os.urandom(1 << 20)
        t0 = time.monotonic()
        with open(f, "wb") as fh:
            for _ in range(max(1, nbytes >> 20)):
                fh.write(buf)
            fh.flush()
            os.fsync(fh.fileno())
        secs = time.monotonic() - t0
        f.unlink()
    except OSError:
        return None
    return (nbytes / 2**20) / secs if secs > 0 else None


def _dur(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 120:
        return f"{s / 60:.1f} min"
    return f"{s:,.0f} s"


def project(run: dict[str, Any], epochs: int, samples: int, *, storage_ceiling: float | None,
            decode_ceiling: float | None, demand_ceiling: float | None,
            write_mib_s: float | None, write_measured: bool) -> dict[str, Any]:
    """The run's time for `epochs` epochs of `samples` images without conversion (the
    first epoch at the first epoch's images/s, the rest at the later epochs') and with it
    (the conversion's cost, then every epoch at the rate storage no longer limits), and
    whether converting shortens it; `text` says so either way.

    The conversion's cost: one read of every file at the storage ceiling (files/s,
    measured; no faster than the first epoch's images/s: an estimate on the safe side), plus writing the dataset twice (the conversion, then its staged copy) at
    `write_mib_s` (measured in the stage directory, or assumed: `write_measured`)."""
    first, later = run["first"]["images_per_s"], run["later"]["images_per_s"]
    nbytes = run.get("dataset_bytes") or 0
    without = samples / first + (epochs - 1) * samples / later
    # After conversion and staging on local disk: storage is out of the picture every
    # epoch; the rate is the warm figure where one was measured, else the next ceiling.
    if run.get("method") == "warm" and run["later_measured"]:
        after, after_how = later, "the measured warm rate"
    else:
        caps = {k: v for k, v in (("decode", decode_ceiling), ("demand", demand_ceiling)) if v}
        k = min(caps, key=caps.__getitem__) if caps else None
        after, after_how = ((caps[k], f"the {k} ceiling") if k else (later, "the later epochs' rate"))
    # Conservative: the conversion reads no faster than the first epoch does (its readers
    # are not more than the recommended configuration's), nor than the storage ceiling.
    read_rate = min(storage_ceiling, first) if storage_ceiling else first
    read_s = samples / read_rate
    read_how = (f"one read of {samples:,} files at {read_rate:,.0f} files/s (the storage "
                f"ceiling, {storage_ceiling:,.0f} files/s measured, or the first epoch's rate "
                "where lower)" if storage_ceiling else
                f"one read of {samples:,} files at the first epoch's {first:,.0f} images/s")
    w = write_mib_s or 100.0
    write_s = 2 * nbytes / 2**20 / w
    write_how = (f"writing {size_text(nbytes)} twice (conversion and staged copy) at "
                 f"{w:,.0f} MiB/s ({'measured in the stage directory' if write_measured and write_mib_s else 'assumed'})")
    convert_s = read_s + write_s
    with_ = convert_s + epochs * samples / after
    convert = with_ < without
    text = (f"--epochs {epochs}: without conversion {_dur(without)} (first epoch "
            f"{_dur(samples / first)} at {first:,.0f} images/s, then {epochs - 1} x "
            f"{_dur(samples / later)} at {later:,.0f}); with conversion and staging "
            f"{_dur(with_)} (converting {_dur(convert_s)}: {read_how} + {write_how}; then "
            f"{epochs} x {_dur(samples / after)} at {after:,.0f} images/s, {after_how}): "
            + ("converting shortens the run by " + _dur(without - with_) if convert else
               "converting would not shorten the run (" + _dur(with_ - without)
               + " longer): not converted"))
    return {"epochs": epochs, "samples": samples, "without_s": without, "with_s": with_,
            "convert_s": convert_s, "read_s": read_s, "write_s": write_s,
            "write_mib_s": w, "write_measured": bool(write_measured and write_mib_s),
            "after_images_per_s": after, "convert": convert, "text": text}


def conversion_projection(before: Any, epochs: int,
                          stage_dir: str | os.PathLike[str] | None) -> dict[str, Any] | None:
    """`project()` for a finished search `before` (its `run`, ceilings and size), the write
    rate measured in `stage_dir`; None where the search has no whole-run figures."""
    run = getattr(before, "run", None)
    c = before.ceilings
    if not run or not (run.get("first") or {}).get("images_per_s") \
            or not (run.get("later") or {}).get("images_per_s") or not c.samples:
        return None
    w = write_rate(stage_dir) if stage_dir is not None else None
    return project(run, epochs, c.samples, storage_ceiling=c.valid("storage"),
                   decode_ceiling=c.valid("decode"), demand_ceiling=c.demand,
                   write_mib_s=w, write_measured=w is not None)
