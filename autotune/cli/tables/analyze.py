"""A terminal rendering of an Analysis (rich renderables; the CLI prints them)."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from autotune.analyze.analysis import Analysis
from autotune.cli.tables import budget_texts, printable

_STYLE = {"compute": "bold green", "storage": "bold red", "decode": "bold red",
          "loader": "bold yellow", "unknown": "bold magenta"}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}" if x < 0.1 else f"{x:.0%}"


def _ms(x: float | None) -> str:
    if x is None:
        return "-"
    ms = x * 1000
    return f"{ms:.3g} ms" if ms < 100 else f"{ms:,.0f} ms"


def verdict_lines(a: Analysis) -> list[Text]:
    """The verdict block: summary, evidence, next command, advice."""
    v = a.verdict
    out = [Text.assemble(("Verdict: ", "bold"), (v.bottleneck, _STYLE.get(v.bottleneck, "bold")),
                         f" - {printable(v.summary)}")]
    out += [Text(f"  · {printable(e)}") for e in v.evidence]
    out.append(Text.assemble(("  next: ", "bold"), (printable(v.next_command), "cyan")))
    out += [Text(f"  → {printable(x)}", style="dim") for x in v.advice]
    return out


def run_lines(run: dict[str, Any] | None) -> list[Text]:
    """What the monitor's run.json adds: the disk it watched, a job that failed (and
    /dev/shm, the open-files or the memory limit when it was the likely cause), one stopped (Ctrl-C, a scheduler's SIGTERM) or
    whose end is unknown; a job that ended well says nothing more."""
    if not run:
        return []
    out = []
    disk = run.get("disk")
    if disk and disk.get("measured"):
        where = f"{disk['path']}, " if disk.get("path") else ""
        out.append(Text(f"  disk watched: {printable(disk.get('device') or '?')} ({printable(where)}"
                        f"from {disk['from']})", style="dim"))
    if run.get("outcome") == "unknown":
        out.append(Text(f"job: how it ended is unknown ({printable(run['status'])}: the "
                        "monitor was killed before it): the verdict describes only the steps "
                        "before it", style="bold yellow"))
    if run.get("outcome") == "stopped":
        secs = run.get("seconds")
        after = f" after {secs:,.1f} s" if isinstance(secs, (int, float)) else ""
        out.append(Text(f"job: stopped ({printable(run['status'])}){after}: the verdict "
                        "describes the steps before it", style="dim"))
    if run.get("outcome") == "failed":
        out.append(Text(f"job: FAILED ({printable(run['status'])}): " + (
            "the verdict is its failure (every step logged was start-up)"
            if run.get("verdict_is_failure") else
            "the verdict describes only the steps before it"), style="bold red"))
        for key, what in (("shm", "/dev/shm"), ("files", "the open-files limit"),
                          ("memory", "the memory limit")):
            if run.get(key):
                how = ("the likely cause" if key == "shm" or run[key].get("log_line")
                       or run[key].get("counted") else "may have been the cause")
                out.append(Text(f"  {what}: {how} (see the warning for the fix)", style="red"))
    return out


def analysis_renderable(a: Analysis) -> Group:
    parts: list[Any] = []
    ln = a.lines
    head = Text.assemble(("Analysis ", "bold"), printable(a.log), f"  (format {a.format}; "
                         f"{ln['parsed']:,} of {ln['total']:,} lines parsed)")
    parts.append(head)
    if ln["skipped_by_reason"]:
        parts.append(Text("  skipped: " + ", ".join(f"{printable(k)} {v:,}" for k, v in
                                                    ln["skipped_by_reason"].items()), style="dim"))
    if a.share_from and a.share_from.get("figures"):
        parts.append(Text(f"  share from {a.share_from['figures']}", style="dim"))
    t = Table(show_header=False, title="steps", title_justify="left")
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_row("steps measured", f"{a.steps:,} ({a.batches:,} batches; {a.warmup_steps} warm-up "
              f"left out; {a.epochs} epoch(s)" + (f"; {a.ranks} ranks" if a.ranks > 1 else "") + ")")
    t.add_row("data-time share", _pct(a.data_time_share) if a.data_time_share is not None
              else "- (the log has no data-loading time)")
    if a.steady_data_time_share is not None and a.epoch_starts:
        st = a.epoch_starts
        t.add_row("  steady (without epoch starts)", _pct(a.steady_data_time_share))
        t.add_row("  epoch starts", f"{st['lines']} line(s), data wait {_ms(st['mean_wait_s'])}"
                  f" per batch vs {_ms(st['steady_mean_wait_s'])} steady")
    t.add_row("AU (step / wall)", _pct(a.au) + ("  input-bound" if a.au is not None and a.au < 0.9 else ""))
    t.add_row("step time p50 / p95", f"{_ms(a.step_time_s.get('p50'))} / {_ms(a.step_time_s.get('p95'))}")
    short = a.step_time_shortest_rank_s
    if short:
        t.add_row("  the shortest rank's, p50 / p95", f"{_ms(short.get('p50'))} / "
                  f"{_ms(short.get('p95'))}")
    t.add_row("data wait p50 / p95", f"{_ms(a.data_wait_s.get('p50'))} / {_ms(a.data_wait_s.get('p95'))}")
    t.add_row("images/s", "-" if a.images_per_s is None else f"{a.images_per_s:,.0f}")
    t.add_row("batch size", f"{a.batch_size if a.batch_size else '-'} ({a.batch_size_source})")
    parts.append(t)
    parts.append(Text("trend", style="bold"))
    parts += [Text(f"  · {printable(f)}") for f in a.trend.get("findings", [])]
    s = a.system
    if s is not None:
        parts.append(Text(f"system ({s.samples} of {s.samples_total} monitor samples, joined by "
                          f"{s.joined_by})", style="bold"))
        for sec, why in s.unavailable.items():
            parts.append(Text(f"  {sec}: not measured ({why})", style="dim"))
        parts += budget_texts(s.budget)
    parts += run_lines(a.run)
    parts += verdict_lines(a)
    for w in a.warnings:
        parts.append(Text(f"warning: {printable(w)}", style="yellow"))
    return Group(*parts)
