"""Renderings of results for people (rich tables) and scripts (JSON).

Functions here build renderables and strings; they never print. `autotune.cli` decides
where each goes (stdout, stderr, a file).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from converters.fsutil import write_text_atomic
from converters.units import fmt_bytes, fmt_rate


def _clean(o: Any) -> Any:
    # JSON has no NaN/Infinity: emit null rather than invalid JSON.
    if isinstance(o, float):
        return None if math.isnan(o) or math.isinf(o) else round(o, 4)
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o


def to_json(d: dict) -> str:
    return json.dumps(_clean(d), indent=2, sort_keys=False) + "\n"


def write_json_atomic(path: str | os.PathLike[str], d: dict) -> None:
    """Write JSON to `path` via a temporary file and rename: never a half-written file."""
    write_text_atomic(path, to_json(d))


def _ms(x: float | None) -> str:
    return "-" if x is None else (f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 100 else f"{x:.0f}")


def probe_renderable(r: Any) -> Group:
    """Tables for a ProbeResult: filesystem, fio, replay, verdict."""
    parts: list[Any] = []
    fs = r.filesystem
    head = Text.assemble(("Storage ", "bold"), f"{r.path}: ", (fs.klass, "bold cyan"),
                         f"  ({fs.type or '?'} on {fs.device or fs.source or '?'}"
                         + (f", behaves like {fs.behaves_like}" if fs.behaves_like else "") + ")")
    parts.append(head)
    for e in fs.evidence:
        parts.append(Text(f"  · {e}", style="dim"))
    if r.fio is not None:
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
        parts.append(t)
    else:
        parts.append(Text(f"fio: not run: {r.fio_error}", style="yellow"))
    if r.replay is not None:
        rp = r.replay
        t = Table(title=f"dataset replay ({rp.files_sampled} files, mean "
                        f"{fmt_bytes(rp.mean_file_bytes)}, cold: {rp.cold_method})",
                  title_justify="left")
        for c in ("concurrency", "files/s", "MiB/s", "p50 ms", "p99 ms", "files", "errors"):
            t.add_column(c, justify="right")
        best = rp.best.concurrency
        for lv in rp.by_concurrency:
            mark = " *" if lv.concurrency == best else ""
            t.add_row(f"{lv.concurrency}{mark}", fmt_rate(lv.files_per_s), fmt_rate(lv.mib_per_s),
                      _ms(lv.lat_p50_ms), _ms(lv.lat_p99_ms),
                      f"{lv.files}{' (time)' if lv.cut_short else ''}", str(lv.errors))
        parts.append(t)
    else:
        parts.append(Text(f"replay: not run: {r.replay_error}", style="yellow"))
    v = r.verdict
    parts.append(Text.assemble(("Verdict: ", "bold"), v["summary"]))
    for rule in v["rules"]:
        ok = "[PASS]" if rule["pass"] else "[FAIL]"
        parts.append(Text(f"  {ok} {rule['rule']}: {rule['value']:,}",
                          style="green" if rule["pass"] else "red"))
    for e in v["evidence"]:
        parts.append(Text(f"  · {e}"))
    for a in v["advice"]:
        parts.append(Text(f"  → {a}", style="bold"))
    for w in r.warnings:
        parts.append(Text(f"warning: {w}", style="yellow"))
    return Group(*parts)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}" if x >= 0.1 else f"{x:.1%}"


def _stat(d: dict | None, key: str = "median", fmt: str = "{:,.1f}") -> str:
    if not d or d.get(key) is None:
        return "-"
    return fmt.format(d[key])


def bench_renderable(r: Any) -> Group:
    """Tables for a BenchResult: configuration, figures, system, warnings or failure."""
    parts: list[Any] = []
    c, ds = r.config, r.dataset
    images = ds.get("images")
    head = Text.assemble(("Bench ", "bold"), f"{ds.get('path')}",
                         f" ({images:,} images, {ds.get('format')})" if images else "",
                         "  ", (r.label, "bold cyan" if r.cold else "bold yellow"))
    parts.append(head)
    step = (f"--step {c['step']}" if c.get("step") else
            f"emulated step {c['compute_ms']:g} ms" if c.get("compute_ms") else "no step (compute 0)")
    tr = c.get("transform") or {}
    parts.append(Text(
        f"  preset {c.get('preset') or '-'}: batch {c['batch_size']}, workers {c['num_workers']}, "
        f"prefetch {c['prefetch_factor'] if c.get('prefetch_factor') is not None else '-'}, "
        f"pin_memory {c['pin_memory']}, persistent {c['persistent_workers']}, {step}",
        style="dim"))
    if tr:
        from autotune.data.transforms import TransformSpec
        parts.append(Text(f"  transform: {TransformSpec.from_dict(tr).describe()}", style="dim"))
    if r.failed:
        parts.append(Text.assemble(("FAILED", "bold red"), f" ({r.failure_kind}): {r.reason}"))
        parts.append(Text(f"  → {r.hint}", style="bold"))
    else:
        t = Table(title="measured", title_justify="left", show_header=False)
        t.add_column("figure")
        t.add_column("value", justify="right")
        t.add_column("note", style="dim")
        sp = r.images_per_s_spread or {}
        w = r.window
        t.add_row("images/s", fmt_rate(r.images_per_s),
                  f"median of {w.get('windows')} windows ({fmt_rate(sp.get('min'))}-"
                  f"{fmt_rate(sp.get('max'))}); overall {fmt_rate(r.images_per_s_overall)}")
        t.add_row("data-wait fraction", _pct(r.data_wait_fraction), "time blocked in next() / wall")
        if r.au is not None:
            t.add_row("AU", f"{r.au:.2f}", "step time / wall: "
                      + ("INPUT-BOUND (< 0.90)" if r.input_bound else "not input-bound"))
        else:
            t.add_row("AU", "-", "no step (compute 0): not defined")
        bw = r.batch_wait_ms or {}
        t.add_row("batch wait p50 / p95", f"{_ms(bw.get('p50'))} / {_ms(bw.get('p95'))} ms",
                  f"max {_ms(bw.get('max'))} ms")
        if r.step_ms:
            t.add_row("step p50 / p95", f"{_ms(r.step_ms.get('p50'))} / {_ms(r.step_ms.get('p95'))} ms", "")
        t.add_row("CPU (process tree)", "-" if r.cpu_percent is None else f"{r.cpu_percent:.0f} %",
                  f"% of one core, main + workers; {r.environment.get('cores')} cores usable")
        t.add_row("peak RSS (tree)", "-" if r.peak_rss_mib is None else f"{r.peak_rss_mib:,.0f} MiB",
                  "sum over processes (shared pages counted per process)")
        fb = w.get("first_batch_s")
        t.add_row("window", f"{w.get('seconds', 0):.1f} s",
                  f"{w.get('batches')} batches, {w.get('samples'):,} images"
                  + (" (SHORTENED: end of the first cold pass)" if w.get("shortened") else "")
                  + f"; warm-up {w.get('warmup_batches')} batches in {w.get('warmup_s', 0):.1f} s"
                  + (f", first batch {fb:.1f} s" if fb is not None else ""))
        parts.append(t)
    s = r.system or {}
    if s.get("samples"):
        t = Table(title=f"system ({s.get('scope')}, {s.get('samples')} samples)",
                  title_justify="left")
        for col in ("figure", "median", "p95", "max"):
            t.add_column(col, justify="left" if col == "figure" else "right")
        disk = s.get("disk") or {}
        if "unavailable" in disk:
            t.add_row("disk", disk["unavailable"], "", "")
        else:
            dev = disk.get("device") or "?"
            for key, label in (("reads_per_s", f"{dev} r/s"), ("read_mib_s", f"{dev} rMiB/s"),
                               ("r_await_ms", f"{dev} r_await ms"), ("util_pct", f"{dev} %util")):
                d = disk.get(key)
                if d:
                    t.add_row(label, _stat(d), _stat(d, "p95"), _stat(d, "max"))
        cpu = s.get("cpu") or {}
        for key, label in (("total_pct", "CPU % (all cores)"), ("iowait_pct", "iowait %")):
            if cpu.get(key):
                t.add_row(label, _stat(cpu[key]), _stat(cpu[key], "p95"), _stat(cpu[key], "max"))
        if cpu.get("per_core_pct_mean"):
            t.add_row("CPU % per core (mean)", " ".join(f"{x:.0f}" for x in cpu["per_core_pct_mean"]), "", "")
        gpu = s.get("gpu") or {}
        if "unavailable" in gpu:
            t.add_row("GPU", str(gpu["unavailable"]), "", "")
        else:
            for k, d in gpu.items():
                if k.endswith("util_pct"):
                    t.add_row(k, _stat(d), _stat(d, "p95"), _stat(d, "max"))
        if s.get("shm"):
            t.add_row("/dev/shm used MiB", "", "", f"{s['shm']['used_mib_max']:,.0f} of "
                                                  f"{s['shm']['total_mib']:,.0f}")
        parts.append(t)
    for wmsg in r.warnings:
        parts.append(Text(f"warning: {wmsg}", style="yellow"))
    if r.timeline_file:
        parts.append(Text(f"timeline: {r.timeline_file}", style="dim"))
    return Group(*parts)
