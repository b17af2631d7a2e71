"""The summary of `autotune stage`."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text

from autotune.cli.tables import printable


def stage_renderable(d: dict[str, Any]) -> Group:
    """From StageResult.to_dict()."""
    parts = []
    if d["verify_only"]:
        parts.append(Text(f"verified {d['files']} file(s) in {printable(d['dst'])}: "
                          f"{len(d['failures'])} bad; {d['bytes_verified'] / 2**20:,.1f} MiB "
                          f"read back in {d['seconds']:.1f} s", style="bold"))
    else:
        vs = f" ({d['vs_source_seq']:.0%} of the source's sequential read)" if d.get("vs_source_seq") else ""
        parts.append(Text(f"staged {printable(d['src'])} -> {printable(d['dst'])}: "
                          f"{d['copied']} copied, {d['skipped']} "
                          f"already verified, {d['bytes_copied'] / 2**20:,.1f} MiB in "
                          f"{d['seconds']:.1f} s = {d['mib_per_s']:,.1f} MiB/s{vs}; verify "
                          f"{d['verify']}", style="bold"))
    if d.get("node_rank") is not None:
        parts.append(Text(f"  the copy for node {d['node_rank']} of {d['nnodes']}: the shards its "
                          "ranks read (node.json says so)"))
    for f in d["failures"]:
        parts.append(Text(f"  {printable(f['file'])}: {printable(f['reason'])}", style="red"))
    if not d["verify_only"] and d["failures"]:
        parts.append(Text("partial: manifest.json not written; rerun `autotune stage` to resume",
                          style="yellow"))
    return Group(*parts)
