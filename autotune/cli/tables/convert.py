"""The summary of `autotune convert`."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from autotune.cli.tables import printable
from autotune_converters import registry
from autotune_base.units import fmt_bytes


def convert_summary(res: Any) -> Group:
    """From a ConvertResult: counts, sizes, rate, skipped files."""
    t = Table(title=f"autotune convert: {printable(res.dst, markup=True)} ({res.format})",
              title_justify="left",
              show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    unit = registry.get(res.format).writer_class().output_noun
    ranked = getattr(res, "rank", None) is not None and not res.finalized
    if getattr(res, "world_size", None) and res.world_size > 1 or ranked:
        who = f"rank {res.rank} of {res.world_size}" if res.rank is not None \
            else f"finalize ({res.world_size} ranks)"
        t.add_row("ranks", who)
        t.add_row("manifest.json", "published" if res.finalized else
                  "not yet: waiting for rank(s) " + ", ".join(map(str, res.waiting_for[:10]))
                  + " (the last rank to finish, or --finalize, publishes it)")
    if getattr(res, "engine", "local") != "local":
        t.add_row("engine", res.engine)
    t.add_row("samples" + (" (this rank's units)" if ranked else ""),
              f"{res.samples:,} in {res.classes:,} classes")
    t.add_row("skipped", f"{len(res.skipped):,}")
    for kind, n in sorted(res.skipped_by_kind.items(), key=lambda kv: -kv[1]):
        t.add_row(f"  {printable(kind, markup=True)}", f"{n:,}")
    if res.ignored:
        t.add_row("ignored (no image extension)", f"{res.ignored:,}")
    t.add_row(unit, f"{res.shards:,}, {fmt_bytes(res.output_bytes)}")
    t.add_row("source", f"{res.source_files:,} files, {fmt_bytes(res.source_bytes)}")
    if res.reencoded:
        t.add_row("re-encoded", f"{res.reencoded:,} images, {fmt_bytes(res.bytes_saved)} saved")
    up = getattr(res, "upload", None)
    if up:
        # The time row is the conversion's; the upload's own time is here.
        t.add_row("uploaded", f"{up['uploaded']:,} files, {fmt_bytes(up['bytes_uploaded'])}"
                  + (f" in {up['seconds']:,.1f} s" if up.get("seconds") else "")
                  + (f"; {up['kept']:,} already in the bucket" if up["kept"] else "")
                  + (f"; {len(up['aborted']):,} stale multipart upload(s) aborted"
                     if up["aborted"] else ""))
    if res.already_complete:
        t.add_row("time", "already complete: nothing to do")
    elif up and up.get("work_was_complete"):
        t.add_row("time", f"{res.seconds:,.1f} s (the conversion was already complete in the "
                  "work folder: this run uploaded it)")
    else:
        t.add_row("time", f"{res.seconds:,.1f} s"
                  + (f" (resumed: {res.resumed_units} units kept)" if res.resumed_units else ""))
        t.add_row("rate", f"{res.images_per_s:,.0f} images/s, {res.mb_per_s:,.1f} MB/s read")
    parts: list[Any] = [t]
    for w in res.warnings:
        parts.append(Text(f"warning: {printable(w)}", style="yellow"))
    first = res.skipped[:10]
    for s in first:
        parts.append(Text(f"skipped: {printable(s['path'])}: {printable(s['reason'])}",
                          style="dim"))
    if len(res.skipped) > len(first):
        parts.append(Text(f"... and {len(res.skipped) - len(first)} more in "
                          f"{printable(res.manifest)}",
                          style="dim"))
    return Group(*parts)
