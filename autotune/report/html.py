"""A self-contained HTML report (inline SVG plots, no scripts, no external files).

Built from the JSON a command writes, so a report can be regenerated from saved results.
Plots are drawn by autotune.report.svg rather than with a plotting library: a few simple
charts do not justify a dependency, and the page must open anywhere, offline. What a
person looks for first comes first: the dataset by name, the verdict, the recommendation
as code (the DataLoader call and `autotune.loader_kwargs`), each rank's figures when
several ranks were measured, then the charts and the trials.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any

from autotune.params import cells, shown
from autotune.report.svg import nice_max, svg_chart, svg_stacked_bars

__all__ = ["dataset_name", "render", "search_section", "svg_chart"]

# Directory names that say nothing alone: "imagenet/train" names a dataset, "train" not.
_GENERIC = {"train", "val", "valid", "validation", "test", "images", "data", "dataset",
            "shards", "wds", "lmdb", "staged"}


def _timeline(path: str | None) -> list[dict[str, Any]]:
    if not path:
        return []
    try:
        return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def _get(d: dict[str, Any] | None, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _sec_ticks(pts: list[tuple[float, Any]]) -> list[int]:
    end = int(max((x for x, _ in pts), default=0))
    step = max(1, nice_max(end / 8) if end > 8 else 1)
    return list(range(0, end + 1, int(step)))


def _table(rows: list[list[Any]], head: list[str]) -> str:
    h = "".join(f"<th>{html.escape(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


def _n(v: Any, f: str = ",.0f") -> str:
    return "-" if v is None else format(v, f)


def dataset_name(d: dict[str, Any]) -> str:
    """What a person calls the dataset: the user's factory where one built it, else the
    last directory of its path (with its parent where that one says nothing alone)."""
    opts = d.get("options") or {}
    path = os.path.normpath(str(d.get("dataset") or "?"))
    parts = [p for p in path.split(os.sep) if p]
    name = "/".join(parts[-2:]) if len(parts) > 1 and parts[-1].lower() in _GENERIC else (
        parts[-1] if parts else path)
    factory = opts.get("dataset_factory")
    return f"{factory.rsplit('/', 1)[-1]} on {name}" if factory else name


def _dataset_line(d: dict[str, Any]) -> str:
    opts = d.get("options") or {}
    ceil = d.get("ceilings") or {}
    bits = [f"format {d['dataset_format']}" if d.get("dataset_format") else "",
            f"{ceil['samples']:,} samples" if ceil.get("samples") else "",
            f"factory {opts['dataset_factory']}" if opts.get("dataset_factory") else "",
            (f"{opts['procs_per_node']} ranks per node" if (opts.get("procs_per_node") or 1) > 1
             else "")]
    extra = ", ".join(b for b in bits if b)
    return (f"<p class='dataset'>Dataset <b>{html.escape(dataset_name(d))}</b>: "
            f"<code>{html.escape(str(d.get('dataset')))}</code>"
            + (f" ({html.escape(extra)})" if extra else "") + "</p>")


def _kwargs_line(d: dict[str, Any]) -> str:
    """`autotune.loader_kwargs(...)` and what it returns, where the JSON has the dict."""
    kw = d.get("loader_kwargs")
    if not isinstance(kw, dict) or not kw:
        return ""
    out = (d.get("options") or {}).get("out")
    where = os.path.join(out, "search.json") if out else "search.json"
    body = ", ".join(f"{k!s}={v!r}" for k, v in kw.items())
    # A batch size the user never chose (the preset's): loader_kwargs wants theirs.
    bs = ", batch_size=your_batch_size" if d.get("batch_size_from") == "preset" else ""
    return ("<p>In code:</p><pre class='kwargs'>"
            + html.escape(f'loader = DataLoader(dataset, **autotune.loader_kwargs("{where}"{bs}))\n'
                          f"# = DataLoader(dataset, {body})") + "</pre>")


def _train_block(d: dict[str, Any]) -> str:
    """The lines that train on the recommended data (autotune.open_dataset)."""
    t = d.get("train")
    if not isinstance(t, dict) or not t.get("code"):
        return ""
    return (f"<h3>Train on it</h3><p>The data: <code>{html.escape(str(t.get('dataset')))}</code>"
            f" ({html.escape(str(t.get('format')))}).</p>"
            f"<pre class='train'>{html.escape(t['code'])}</pre>")


def _rank_part(rec: dict[str, Any]) -> tuple[str, str]:
    """The recommendation's figures per rank (several ranks per node): text and chart."""
    per = [r for r in (rec.get("per_rank") or []) if isinstance(r, dict)]
    if not per:
        return "", ""
    ips = [(r.get("rank", i), r.get("images_per_s")) for i, r in enumerate(per)]
    known = [v for _, v in ips if v is not None]
    slow = min(known) if known else None
    text = (f"<h3>Per rank ({len(per)} ranks on the node)</h3>"
            + (f"<p>Every step waits for the slowest rank: the node delivers {len(per)} x "
               f"{_n(slow)} = {_n(len(per) * slow)} images/s (the ranks' sum: "
               f"{_n(sum(known))}).</p>" if slow is not None else "")
            + _table([[r.get("rank", i), _n(r.get("images_per_s")), _n(r.get("au"), ".2f"),
                       _n(r.get("data_wait_fraction"), ".2f"), _n(r.get("batches"), "d")]
                      for i, r in enumerate(per)],
                     ["rank", "images/s", "AU", "data wait", "batches"]))
    chart = svg_chart([{"name": "images/s", "points": ips}], title="Recommended: images/s per rank",
                      xlabel="rank", ylabel="images/s", bars=True,
                      hlines=[("slowest", slow, "#d62728")] if slow else None)
    return text, chart


def _trial_name(rec: dict[str, Any]) -> str:
    n = rec.get("trial")
    return f"trial {n}" if isinstance(n, int) and n >= 0 else "the baseline"


def _trial_charts(ok: list[dict[str, Any]], hl: list[tuple[str, float, str]]) -> list[str]:
    """The optimization history, images/s against num_workers, AU per trial."""
    hist_pts = [(t["number"], t["images_per_s"]) for t in ok]
    best_line, cur = [], None
    for x, y in sorted(hist_pts):
        cur = y if cur is None else max(cur, y)
        best_line.append((x, cur))
    charts = [svg_chart([{"name": "trial", "points": hist_pts},
                         {"name": "best so far", "points": best_line, "mode": "line"}],
                        title="Optimization history", xlabel="trial", ylabel="images/s", hlines=hl)]
    by_pf: dict[Any, list] = {}
    for t in ok:
        by_pf.setdefault(t["params"].get("prefetch_factor"), []).append(
            (t["params"]["num_workers"], t["images_per_s"]))
    # prefetch_factor is None without workers: that series is "no workers", not "None"
    charts.append(svg_chart([{"name": f"prefetch {k}" if k is not None else "no workers", "points": v}
                             for k, v in sorted(by_pf.items(), key=lambda kv: (kv[0] is not None, kv[0] or 0))],
                            title="images/s against num_workers", xlabel="num_workers",
                            ylabel="images/s", hlines=hl))
    au_pts = [(t["number"], t["au"]) for t in ok if t["au"] is not None]
    if au_pts:
        charts.append(svg_chart([{"name": "AU", "points": au_pts}], title="AU per trial",
                                xlabel="trial", ylabel="AU", bars=True,
                                hlines=[("input-bound below", 0.9, "#d62728")]))
    return charts


def _timeline_charts(rec: dict[str, Any], trials: list[dict[str, Any]]) -> list[str]:
    """The recommendation's own window (a confirmation's, when confirmed): CPU and disk."""
    charts: list[str] = []
    rec_trial = next((t for t in trials if t["number"] == rec.get("trial")), None)
    # The baseline is not in trials.
    tl = _timeline(rec.get("timeline_file") or (rec_trial or {}).get("timeline_file"))
    if tl:
        t0 = tl[0]["time"]
        cpu = [(s["time"] - t0, _get(s, "proc", "cpu_pct")) for s in tl]
        rps = [(s["time"] - t0, _get(s, "disk", "reads_per_s")) for s in tl]
        util = [(s["time"] - t0, _get(s, "disk", "util_pct")) for s in tl]
        charts.append(svg_chart([{"name": "loader CPU %", "points": cpu, "mode": "line"},
                                 {"name": "disk %util", "points": util, "mode": "line"}],
                                title=f"Recommended, {_trial_name(rec)}: CPU and disk",
                                xlabel="seconds", ylabel="%", x_ticks=_sec_ticks(cpu)))
        if any(y for _, y in rps):
            charts.append(svg_chart([{"name": "disk reads/s", "points": rps, "mode": "line"}],
                                    title=f"Recommended, {_trial_name(rec)}: disk r/s",
                                    xlabel="seconds", ylabel="r/s", x_ticks=_sec_ticks(rps)))
    return charts


BUDGET_COLORS = {"on CPU": "#2ca02c", "runnable": "#ff7f0e", "I/O": "#d62728",
                 "storage wait": "#9467bd", "asleep": "#c7c7c7"}


def budget_chart(budget: dict[str, Any] | None, title: str) -> str | None:
    """A stacked bar per process class: where each one's wall time went (None: no budget)."""
    from autotune.monitor.timebudget import CLASSES, LABELS, STATES, TimeBudget

    if not budget or not budget.get("available"):
        return None
    b = TimeBudget.from_dict(budget)
    rows = []
    for name in CLASSES:
        c = b.cls(name)
        if c is not None:
            sh = c.display_shares()
            rows.append((f"{name} ({c.processes} procs, {c.threads} threads)",
                         [(LABELS[s], sh[s]) for s in STATES]))
    if not rows:
        return None
    return svg_stacked_bars(rows, title=title, colors=BUDGET_COLORS,
                            notes=[b.source_text(), *([b.psi_text()] if b.psi_text() else [])])


STAGE_COLORS = {"read": "#d62728", "decode": "#9467bd", "transform": "#1f77b4",
                "collate": "#ff7f0e"}


def stage_chart(stages: dict[str, Any] | None, title: str) -> str | None:
    """autotune's pipeline by stage (autotune.data.stages): one bar of the loading
    processes' pipeline time, split into read, decode, transform and collate."""
    from autotune.data.stages import STAGES, busy_text

    if not stages:
        return None
    ms = stages["ms_per_sample"]
    notes = [f"per sample: read {ms['read']:.2g} ms, decode {ms['decode']:.2g} ms, "
             f"transform {ms['transform']:.2g} ms"]
    if stages.get("collate_ms_per_batch"):
        notes.append(f"collate {stages['collate_ms_per_batch']:.2g} ms per batch")
    if stages.get("busy") is not None:
        notes.append(busy_text(stages))
    return svg_stacked_bars([(f"pipeline time ({stages['samples']:,} samples)",
                              [(s, stages["share"][s]) for s in STAGES])],
                            title=title, colors=STAGE_COLORS, notes=notes)


def _budget_charts(rec: dict[str, Any], trials: list[dict[str, Any]]) -> list[str]:
    """The recommended trial's time budget (its window's system figures) and, for
    autotune's own pipeline, its stage budget."""
    rec_trial = next((t for t in trials if t["number"] == rec.get("trial")), None)
    budget = ((rec_trial or {}).get("system_figures") or {}).get("budget")
    charts = [budget_chart(budget, f"Recommended, {_trial_name(rec)}: where the time goes"),
              stage_chart((rec_trial or {}).get("stages"),
                          f"Recommended, {_trial_name(rec)}: the pipeline's stages")]
    return [c for c in charts if c]


def _trials_table(trials: list[dict[str, Any]], cols: Any, hosts: list[dict[str, Any]],
                  many: bool) -> str:
    """Every trial; grouped by class of hosts (this host's first) where several measured:
    figures compare only within a group."""
    order = {g.get("key"): i for i, g in enumerate(hosts)}
    listed = sorted(trials, key=lambda t: (order.get((t.get("host") or {}).get("key"), -1),
                                           t["number"])) if many else trials
    rows = [[t["number"], *([(t.get("host") or {}).get("hostname", "")] if many else []),
             *cells(t["params"], cols), t["state"],
             _n(t["images_per_s"]), _n(t["au"], ".2f"), _n(t["data_wait_fraction"], ".2f"),
             _n(t["peak_rss_mib"]), t.get("reason") or ""] for t in listed]
    return _table(rows, ["#", *(["host"] if many else []), *(c.column for c in cols), "state",
                         "images/s", "AU", "data wait", "peak RSS MiB", "reason"])


def _run_part(run: dict[str, Any] | None) -> str:
    """The whole run (search.json `run`): which epochs the verdict describes."""
    if not isinstance(run, dict) or not run.get("regime"):
        return ""
    first, later = run.get("first") or {}, run.get("later") or {}
    rows = [["first (cold)", _n(first.get("images_per_s")), first.get("bottleneck") or "-",
             "measured (the search's trials)"],
            ["later", _n(later.get("images_per_s")), later.get("bottleneck") or "-",
             f"{run.get('method') or '-'}"
             + ("" if run.get("hit_rate") is None else f", hit rate {run['hit_rate']:.0%}")
             + ("" if run.get("later_measured") else " (not measured)")]]
    return (f"<p><b>Whole run</b>: {html.escape(run['regime'])}</p>"
            + _table(rows, ["epochs", "images/s", "limit", "how"]))


def _environment_part(d: dict[str, Any]) -> str:
    """What the job's container allowed, as the header of the command said it: the report
    is what gets shared, and a 'cold' figure made without drop_caches must say so there."""
    env = d.get("environment") or {}
    cpu, mem, shm = env.get("cpu") or {}, env.get("memory") or {}, env.get("shm") or {}
    bits = []
    if cpu.get("cores"):
        bits.append(f"cpu {cpu['cores']:g} usable core(s) ({cpu.get('source', '?')})")
    if mem.get("limit_bytes"):
        bits.append(f"memory limit {mem['limit_bytes'] / 2**30:.1f} GiB ({mem.get('source', '?')})")
    if shm.get("total_bytes") is not None:
        bits.append(f"/dev/shm {shm['total_bytes'] / 2**20:,.0f} MiB")
    out = f"<p>Environment: {html.escape('; '.join(bits))}</p>" if bits else ""
    return out + "".join(f"<p class='verdict'><b>limitation</b>: {html.escape(x)}</p>"
                         for x in env.get("limitations") or [])


def search_section(d: dict[str, Any], title: str) -> str:
    """One search's part of the report (the loop of a later issue puts two side by side)."""
    trials = [t for t in d["trials"] if t["state"] not in ("duplicate", "skipped")]
    here = (d.get("host") or {}).get("key")
    # The charts compare figures: this host's class only (other hosts are listed below).
    ok = [t for t in trials if t["state"] == "complete" and t["images_per_s"] is not None
          and (here is None or (t.get("host") or {}).get("key", here) == here)]
    ceil = d["ceilings"]
    hl = [(k, ceil.get(k), c) for k, c in (("storage", "#d62728"), ("decode", "#9467bd"),
                                           ("demand", "#2ca02c")) if ceil.get(k)]
    base = d.get("baseline") or {}
    # Against a confirmed recommendation, the baseline's confirmation (like against like).
    cbase = (d.get("baseline_confirmed") if (d.get("recommended") or {}).get("window_s") else None) or base
    if base.get("images_per_s"):
        hl.append(("baseline", base["images_per_s"], "#7f7f7f"))
    rec = d.get("recommended") or {}
    charts = _trial_charts(ok, hl) + _timeline_charts(rec, trials) + _budget_charts(rec, trials)
    v = d.get("verdict") or {}
    cols = shown([t["params"] for t in d["trials"]])
    hosts = d.get("hosts") or []
    many = len(hosts) > 1 or any(len(g.get("hostnames") or []) > 1 for g in hosts)
    rank_text, rank_chart = _rank_part(rec)
    if rank_chart:
        charts.append(rank_chart)
    parts = [f"<h2>{html.escape(title)}</h2>", _dataset_line(d), _environment_part(d),
             f"<p class='verdict'><b>{html.escape(v.get('bottleneck', '?'))}</b>: "
             f"{html.escape(v.get('summary', ''))}</p>",
             "<ul>" + "".join(f"<li>{html.escape(e)}</li>" for e in v.get("evidence", []))
             + "".join(f"<li><b>{html.escape(a)}</b></li>" for a in v.get("advice", [])) + "</ul>",
             _run_part(d.get("run")),
             (f"<p class='verdict'><b>NOT COLD</b>: {html.escape(d['cold_reason'])}</p>"
              if d.get("cold") is False and d.get("cold_reason") else ""),
             "<h3>Recommendation</h3>",
             f"<pre>{html.escape(d.get('snippet') or '-')}</pre>", _kwargs_line(d),
             _train_block(d),
             f"<p>{_n(rec.get('images_per_s'))} images/s, AU {_n(rec.get('au'), '.2f')}"
             + (f" (confirmed in a {rec['window_s']:.1f} s window)" if rec.get("window_s") else "")
             + f"; baseline (rule of thumb) {_n(cbase.get('images_per_s'))} images/s"
             + (f" (its {cbase['window_s']:.1f} s window)" if cbase.get("window_s") else "")
             + f"; gain {_n(d.get('gain_vs_baseline'), '.2f')}x. "
             f"Stopped: {html.escape(d.get('stop_reason', ''))}.</p>", rank_text,
             "<h3>Ceilings</h3><ul>" + "".join(f"<li>{html.escape(e)}</li>" for e in ceil.get("evidence", [])) + "</ul>",
             "<div class='charts'>" + "".join(charts) + "</div>",
             *(_hosts_html(hosts, d.get("storage", "")) if many else []),
             "<h3>Trials</h3>",
             _trials_table(d["trials"], cols, hosts, many)]
    if d.get("confirmed"):
        crow = [[c["number"], *cells(c["params"], cols),
                 _n(c.get("first_images_per_s")), _n(c.get("window_s"), ".1f"), c["state"],
                 _n(c["images_per_s"]), _n(c["au"], ".2f")] for c in d["confirmed"]]
        parts += ["<h3>Confirmed: measured again in a longer window</h3>",
                  _table(crow, ["#", *(c.column for c in cols), "first images/s", "window s",
                                "state", "images/s", "AU"])]
    return "\n".join(parts)


def _hosts_html(hosts: list[dict[str, Any]], storage: str) -> list[str]:
    """The hosts that measured a shared study, by class (CPU model, cores, storage class):
    the recommendation comes from this host's class only."""
    rows = [["this host's" if g.get("this_host") else "", ", ".join(g.get("hostnames") or []),
             g.get("cpu_model") or "?", g.get("cores") or "?", g.get("storage_class") or "?",
             g.get("trials", 0), _n(g.get("best_images_per_s"))] for g in hosts]
    return [f"<h3>Hosts sharing the study ({html.escape(storage)})</h3>",
            "<p>Trials are compared only between hosts of one class; the recommendation above "
            "is for this host's class.</p>",
            _table(rows, ["class", "hosts", "CPU model", "cores", "storage class", "trials",
                          "best images/s"])]


def render(sections: list[tuple[str, dict[str, Any]]], title: str = "autotune search") -> str:
    css = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;color:#222}"
           "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;"
           "padding:3px 6px;text-align:right}pre{background:#f4f4f4;padding:8px}"
           ".charts svg{margin:6px;border:1px solid #eee}.verdict{font-size:15px}"
           ".dataset{font-size:15px}")
    body = "\n".join(search_section(d, t) for t, d in sections)
    # The dataset by name in the heading and the browser tab (the first section's: a
    # before/after report converts and stages that same dataset).
    if sections:
        title = f"{title}: {dataset_name(sections[0][1])}"
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{css}</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>")
