"""The table of `autotune bench`: configuration, figures, system, warnings or failure."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from autotune.cli.tables import _ms, _pct, _stat, budget_texts, environment_texts, printable
from autotune_base.units import fmt_rate


def bench_renderable(r: Any) -> Group:
    """Tables for a BenchResult: configuration, figures, system, warnings or failure."""
    parts: list[Any] = []
    c, ds = r.config, r.dataset
    images = ds.get("images")
    head = Text.assemble(("Bench ", "bold"), printable(ds.get('path')),
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
    parts += environment_texts(r.environment)
    if r.failed:
        parts.append(Text.assemble(("FAILED", "bold red"),
                                   f" ({r.failure_kind}): {printable(r.reason)}"))
        parts.append(Text(f"  → {printable(r.hint)}", style="bold"))
    else:
        parts.append(_measured(r))
    s = r.system or {}
    if s.get("samples"):
        parts.append(_system(s))
    parts += budget_texts((s.get("figures") or {}).get("budget"))
    quota = (s.get("figures") or {}).get("cpu_quota")
    if quota and quota.get("cores") is not None:   # a quota bound the measurement
        from autotune.monitor.quota import quota_line

        parts.append(Text(quota_line(quota)))
    if r.stages:
        from autotune.data.stages import stage_line

        parts.append(Text("pipeline stages (autotune's own, timed in each loading process)",
                          style="bold"))
        parts.append(Text(f"  {stage_line(r.stages)}"))
    for wmsg in r.warnings:
        parts.append(Text(f"warning: {printable(wmsg)}", style="yellow"))
    if r.timeline_file:
        parts.append(Text(f"timeline: {printable(r.timeline_file)}", style="dim"))
    return Group(*parts)


def _measured(r: Any) -> Table:
    """images/s, data wait, AU, batch and step times, CPU, RSS, the window."""
    t = Table(title="measured", title_justify="left", show_header=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_column("note", style="dim")
    sp = r.images_per_s_spread or {}
    w = r.window
    t.add_row("images/s", fmt_rate(r.images_per_s),
              f"whole window; {w.get('windows')} sub-windows {fmt_rate(sp.get('min'))}-"
              f"{fmt_rate(sp.get('max'))} (median {fmt_rate(sp.get('median'))})")
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
              f"% of one core, main + workers; {_usable(r.environment)}")
    t.add_row("peak RSS (tree)", "-" if r.peak_rss_mib is None else f"{r.peak_rss_mib:,.0f} MiB",
              "sum over processes (shared pages counted per process)")
    fb = w.get("first_batch_s")
    t.add_row("window", f"{w.get('seconds', 0):.1f} s",
              f"{w.get('batches')} batches, {w.get('samples'):,} images"
              + (" (SHORTENED: end of the first cold pass)" if w.get("shortened") else "")
              + (f" (kept open {w['extended_s']:.1f} s past --seconds for the batches a "
                 "figure needs)" if w.get("extended_s") else "")
              + f"; warm-up {w.get('warmup_batches')} batches in {w.get('warmup_s', 0):.1f} s"
              + (f", first batch {fb:.1f} s" if fb is not None else ""))
    return t


def _usable(env: dict[str, Any]) -> str:
    """The CPU the tree may use as the header's cpu: line counts it: a 0.5-core quota is
    0.5, not the worker count's whole core (49 % of one core is then the whole quota)."""
    cpu = env.get("cpu") or {}
    cores = cpu.get("cores", env.get("cores"))
    if not isinstance(cores, (int, float)):
        return "usable cores unknown"
    src = str(cpu.get("source") or "")
    return (f"{cores:g} core(s) usable"
            + (" (the cgroup CPU quota)" if src.startswith("cgroup CPU quota") else ""))


def _system(s: dict[str, Any]) -> Table:
    """What the monitor saw: disk, CPU, GPU, /dev/shm (median, p95, max)."""
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
    return t
