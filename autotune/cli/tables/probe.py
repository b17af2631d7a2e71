"""The table of `autotune probe`: filesystem, fio, replay, verdict."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from autotune.cli.tables import _ms, environment_texts, printable
from autotune_base.units import fmt_bytes, fmt_rate


def probe_renderable(r: Any, gate: Any = None) -> Group:
    """Tables for a ProbeResult: filesystem, fio, replay, verdict; and the gate's outcome
    (an autotune.probe.gate.GateResult) when one was asked for."""
    parts: list[Any] = _filesystem_texts(r)
    parts += environment_texts(getattr(r, "environment", None))
    obj = getattr(r, "object", None)
    if obj is not None:
        # Object storage: its GETs and ranged reads stand for fio and the replay.
        parts.append(_object_table(obj))
        parts.append(_range_part(obj))
    else:
        parts.append(_fio_part(r))
        parts += _replay_parts(r)
    parts += _verdict_texts(r.verdict)
    for w in r.warnings:
        parts.append(Text(f"warning: {w}", style="yellow"))
    if gate is not None:
        parts += _gate_texts(gate)
    return Group(*parts)


def _filesystem_texts(r: Any) -> list[Any]:
    """The storage class of the filesystem under the path, and its evidence."""
    fs = r.filesystem
    head = Text.assemble(("Storage ", "bold"), f"{printable(r.path)}: ", (fs.klass, "bold cyan"),
                         f"  ({fs.type or '?'} on {fs.device or fs.source or '?'}"
                         + (f", behaves like {fs.behaves_like}" if fs.behaves_like else "") + ")")
    return [head] + [Text(f"  · {printable(e)}", style="dim") for e in fs.evidence]


def _fio_part(r: Any) -> Any:
    """fio's sequential and random jobs, or why fio did not run."""
    if r.fio is None:
        return Text(f"fio: not run: {r.fio_error}", style="yellow")
    t = Table(title=f"fio ({'direct' if r.fio.direct else 'BUFFERED'}, {r.fio.ioengine}, "
                    f"{fmt_bytes(r.fio.file_bytes)} scratch file, {r.fio.runtime_s:g} s/job)",
              title_justify="left")
    for c in ("job", "IOPS", "MiB/s", "lat mean ms", "p50 ms", "p99 ms", "device saw"):
        t.add_column(c, justify="right" if c != "job" else "left")
    for j, label in ((r.fio.seq_read, "seq read 1 MiB x4"),
                     (r.fio.rand_read, "rand read 4 KiB qd64 x4")):
        saw = ("-" if j.device_bytes is None
               else f"{j.device_bytes / j.io_bytes:.0%}" if j.io_bytes else "-")
        t.add_row(label + ("" if j.plausible else " [red](implausible)[/]"), fmt_rate(j.iops),
                  fmt_rate(j.bw_mib_s), _ms(j.lat_mean_ms), _ms(j.lat_p50_ms),
                  _ms(j.lat_p99_ms), saw)
    return t


def _replay_parts(r: Any) -> list[Any]:
    """The dataset replay's cold and steady passes (the ceiling starred), or why it did not
    run."""
    rp = r.replay
    if rp is None:
        return [Text(f"replay: not run: {r.replay_error}", style="yellow")]
    t = Table(title=f"dataset replay ({rp.files_sampled} files, mean "
                    f"{fmt_bytes(rp.mean_file_bytes)}, cold: {rp.cold_method})",
              title_justify="left")
    for c in ("pass", "concurrency", "files/s", "MiB/s", "p50 ms", "p99 ms", "files",
              "errors"):
        t.add_column(c, justify="right")
    ceil = rp.ceiling[0]
    for which, levels in (("cold", rp.by_concurrency), ("steady", rp.steady)):
        for lv in levels:
            mark = " *" if lv is ceil else ""
            t.add_row(which, f"{lv.concurrency}{mark}", fmt_rate(lv.files_per_s),
                      fmt_rate(lv.mib_per_s), _ms(lv.lat_p50_ms), _ms(lv.lat_p99_ms),
                      f"{lv.files}{' (time)' if lv.cut_short else ''}", str(lv.errors))
    # Said of the pass that ran: a steady pass exists only after drop_caches (root); the
    # footnote named it under a fadvise-only replay too.
    how = ("steady: page cache dropped, inodes kept, as in a long run" if rp.steady
           else "page cache kept: --warm" if rp.cold_method == "warm"
           else f"cold: {rp.cold_method}")
    return [t, Text(f"  * the storage ceiling: the {rp.ceiling[1]} pass ({how})", style="dim")]


def _verdict_texts(v: dict[str, Any]) -> list[Text]:
    """The verdict's summary, each rule passed or failed, the evidence, the advice."""
    parts = [Text.assemble(("Verdict: ", "bold"), v["summary"])]
    for rule in v["rules"]:
        ok = "[PASS]" if rule["pass"] else "[FAIL]"
        parts.append(Text(f"  {ok} {rule['rule']}: {rule['value']:,}",
                          style="green" if rule["pass"] else "red"))
    parts += [Text(f"  · {e}") for e in v["evidence"]]
    parts += [Text(f"  → {a}", style="bold") for a in v["advice"]]
    return parts


def _gate_texts(gate: Any) -> list[Text]:
    """The gate's outcome and each of its checks."""
    style = {"passed": "bold green", "failed": "bold red"}.get(gate.outcome, "bold yellow")
    parts = [Text.assemble(("Gate: ", "bold"), (gate.outcome.upper(), style))]
    for c in gate.checks:
        seen = "not measured" if c.measured is None else f"measured {c.measured:,.0f}"
        parts.append(Text(f"  [{c.outcome}] {c.flag} {c.threshold:g} {c.unit}: {seen}"))
    return parts


def _range_part(o: Any) -> Any:
    """The ranged reads of an s3:// probe's large object, or the note why there are none."""
    rp = o.ranged
    if rp is None:
        return Text(f"ranged reads: {printable(o.ranged_note or 'not measured')}", style="dim")
    t = Table(title=f"Ranged GETs of {printable(rp.key)} ({fmt_bytes(rp.size)}; {rp.why}; If-Match its "
                    "ETag)", title_justify="left")
    for c in ("range", "in flight", "MiB/s", "GETs/s", "first byte p50 ms", "p99 ms", "GETs",
              "errors"):
        t.add_column(c, justify="right")
    for lv in rp.levels:
        t.add_row(fmt_bytes(lv.range_bytes), str(lv.concurrency), fmt_rate(lv.mib_per_s),
                  fmt_rate(lv.gets_per_s), _ms(lv.first_byte_p50_ms), _ms(lv.first_byte_p99_ms),
                  str(lv.gets), str(lv.errors))
    return t


def _object_table(o: Any) -> Table:
    """The GETs of an s3:// probe, one row per concurrency."""
    t = Table(title=f"GETs of the dataset's objects ({o.objects:,} listed, mean "
                    f"{fmt_bytes(o.mean_object_bytes)}; LIST {o.list_keys_per_s:,.0f} keys/s in "
                    f"{o.list_pages} page(s); cold: {o.cold_method})", title_justify="left")
    for c in ("in flight", "GETs/s", "MiB/s", "first byte p50 ms", "p99 ms", "object p50 ms",
              "p99 ms", "GETs", "errors"):
        t.add_column(c, justify="right")
    best = o.best if o.by_concurrency else None
    for lv in o.by_concurrency:
        t.add_row(f"{lv.concurrency}{' *' if lv is best else ''}", fmt_rate(lv.gets_per_s),
                  fmt_rate(lv.mib_per_s), _ms(lv.first_byte_p50_ms), _ms(lv.first_byte_p99_ms),
                  _ms(lv.object_p50_ms), _ms(lv.object_p99_ms), str(lv.gets), str(lv.errors))
    return t
