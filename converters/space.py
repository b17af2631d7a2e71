"""Room for a conversion: what it will still write, against the free space of DST's
filesystem, checked once before the first unit is written.

A disk that fills mid-run costs the user the run and leaves them the clean-up; the
conversion knows from its plan what it will write, so it says so before it starts. What
is still to write is the source bytes of the units not yet written (a resume counts only
those), plus the format's overhead (tar headers and padding, LMDB pages and index: about
`SAMPLE_OVERHEAD` a sample, `UNIT_OVERHEAD` a unit, measured here as 3.8 KiB and 2.5 KiB a
sample for WebDataset and LMDB) and `MARGIN` for the manifest and the work folder's
records. With --max-side the source bytes are only an upper bound (re-encoded images are
usually far smaller): nothing is refused then. The free space is what this user may write (statvfs f_bavail x f_frsize).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune_base.errors import NoRoom
from autotune_base.units import fmt_bytes

SAMPLE_OVERHEAD = 4 << 10  # bytes a sample beyond its image bytes (tar members, LMDB pages)
UNIT_OVERHEAD = 8 << 10    # a shard's or batch's end, its record, its manifest entry
MARGIN = 1 << 20           # the manifest and the work folder


@dataclass(frozen=True)
class Room:
    """What a conversion will still write into DST and what DST's filesystem has free."""

    need: int        # bytes still to write, overhead and margin included
    source: int      # of which: source bytes of the units still to write
    free: int        # bytes this user may still write on DST's filesystem
    units: int       # units still to write
    upper_bound: bool  # --max-side: re-encoded images usually take less than `source`

    @property
    def fits(self) -> bool:
        return self.need <= self.free


def room_for(dst: Path, plan: Any, pending: list[int], max_side: int | None) -> Room | None:
    """The Room of the units `pending` of `plan` in `dst`; None when the filesystem does
    not say how much is free (statvfs refused)."""
    try:
        st = os.statvfs(dst)
    except OSError:
        return None
    source = sum(plan.unit_sizes[u] for u in pending)
    samples = sum(len(plan.unit_range(u)) for u in pending)
    need = source + samples * SAMPLE_OVERHEAD + len(pending) * UNIT_OVERHEAD + MARGIN
    return Room(need=need if pending else 0, source=source, free=st.f_bavail * st.f_frsize,
                units=len(pending), upper_bound=max_side is not None)


def check_room(dst: Path, plan: Any, pending: list[int], max_side: int | None,
               resumed: int) -> Room | None:
    """Room for the pending units, or NoRoom (a UsageError) naming DST, both figures and the fix
    before anything of them is written. `resumed`: units an earlier run wrote."""
    room = room_for(dst, plan, pending, max_side)
    # With --max-side the source bytes only bound what re-encoding writes (a 7.5 MiB folder
    # at --max-side 64 fits in 2 MiB): no refusal of a conversion that may well fit.
    if room is None or room.fits or room.upper_bound:
        return room
    left = (f"; {len(pending)} of {plan.units} units are left after a resume" if resumed
            else "")
    kept = "Nothing more was written" if resumed else "Nothing was written"
    raise NoRoom(
        f"{dst}: not enough free space: this conversion will still write about "
        f"{fmt_bytes(room.need)} ({fmt_bytes(room.source)} of source data plus the format's "
        f"overhead{left}) and the filesystem has {fmt_bytes(room.free)} free; free "
        f"space there, or choose a DST on another disk. {kept}.")


__all__ = ["MARGIN", "NoRoom", "Room", "SAMPLE_OVERHEAD", "UNIT_OVERHEAD", "check_room", "room_for"]
