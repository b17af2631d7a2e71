"""A self-contained HTML report (inline SVG plots, no scripts, no external files).

Built from the JSON a command writes, so a report can be regenerated from saved results.
Plots are drawn here rather than with a plotting library: four simple charts do not
justify a dependency, and the page must open anywhere, offline.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

from autotune.params import cells, shown

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    e = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * e:
            return m * e
    return 10 * e


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 10 else f"{v:.2g}"


def svg_chart(series: list[dict[str, Any]], *, title: str, xlabel: str, ylabel: str,
              hlines: list[tuple[str, float, str]] | None = None, width: int = 560,
              height: int = 300, bars: bool = False, x_ticks: list[Any] | None = None) -> str:
    """Scatter/line/bar chart. series: [{name, points[(x, y)], color?, mode: 'line'|'points'}]."""
    pad_l, pad_r, pad_t, pad_b = 64, 16, 34, 46
    pts = [p for s in series for p in s["points"] if p[1] is not None]
    hl = hlines or []
    xs = [p[0] for p in pts] or [0, 1]
    top = max([p[1] for p in pts] + [1e-9])
    # Reference lines far above the data would flatten it: keep those within 2x of it in
    # scale and name the others in the title area.
    off = [(n, v) for n, v, _ in hl if v and pts and v > 2 * top]
    hl = [h for h in hl if h[1] and (not pts or h[1] <= 2 * top)]
    ymax = _nice_max(max([top] + [v for _, v, _ in hl]) * 1.05)
    xmin, xmax = min(xs), max(xs)
    if bars:
        xmin, xmax = xmin - 0.6, xmax + 0.6
    elif xmax == xmin:
        xmin, xmax = xmin - 1, xmax + 1
    pw, ph = width - pad_l - pad_r, height - pad_t - pad_b

    def X(x: float) -> float:
        return pad_l + (x - xmin) / (xmax - xmin) * pw

    def Y(y: float) -> float:
        return pad_t + ph - (y / ymax) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13" font-weight="bold">'
           f'{html.escape(title)}</text>']
    for i in range(5):
        yv = ymax * i / 4
        out.append(f'<line x1="{pad_l}" x2="{width - pad_r}" y1="{Y(yv):.1f}" y2="{Y(yv):.1f}" '
                   'stroke="#ddd"/>')
        out.append(f'<text x="{pad_l - 6}" y="{Y(yv) + 4:.1f}" text-anchor="end">{_fmt(yv)}</text>')
    ticks = x_ticks if x_ticks is not None else sorted(set(xs))
    if len(ticks) > 12:
        step = math.ceil(len(ticks) / 12)
        ticks = ticks[::step]
    for xv in ticks:
        out.append(f'<text x="{X(xv):.1f}" y="{pad_t + ph + 16}" text-anchor="middle">{_fmt(xv)}</text>')
    out.append(f'<line x1="{pad_l}" x2="{pad_l}" y1="{pad_t}" y2="{pad_t + ph}" stroke="#333"/>')
    out.append(f'<line x1="{pad_l}" x2="{width - pad_r}" y1="{pad_t + ph}" y2="{pad_t + ph}" stroke="#333"/>')
    out.append(f'<text x="{pad_l + pw / 2}" y="{height - 8}" text-anchor="middle">{html.escape(xlabel)}</text>')
    out.append(f'<text transform="translate(14,{pad_t + ph / 2}) rotate(-90)" text-anchor="middle">'
               f'{html.escape(ylabel)}</text>')
    if off:
        note = "off scale: " + ", ".join(f"{n} {_fmt(v)}" for n, v in off)
        out.append(f'<text x="{width - pad_r}" y="{pad_t - 3}" text-anchor="end" fill="#888">'
                   f'{html.escape(note)}</text>')
    for label, v, color in hl:
        if v and v <= ymax:
            out.append(f'<line x1="{pad_l}" x2="{width - pad_r}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" '
                       f'stroke="{color}" stroke-dasharray="5,4"/>')
            out.append(f'<text x="{width - pad_r - 2}" y="{Y(v) - 3:.1f}" text-anchor="end" '
                       f'fill="{color}">{html.escape(label)} {_fmt(v)}</text>')
    nser = max(1, len(series))
    for k, s in enumerate(series):
        color = s.get("color") or PALETTE[k % len(PALETTE)]
        sp = [(x, y) for x, y in s["points"] if y is not None]
        if bars:
            bw = pw / max(1, (xmax - xmin)) * 0.8 / nser
            for x, y in sp:
                x0 = X(x) - bw * nser / 2 + k * bw
                out.append(f'<rect x="{x0:.1f}" y="{Y(y):.1f}" width="{bw:.1f}" '
                           f'height="{Y(0) - Y(y):.1f}" fill="{color}"><title>{_fmt(x)}: {y:.3g}</title></rect>')
        elif s.get("mode") == "line" and len(sp) > 1:
            d = " ".join(f"{'M' if i == 0 else 'L'}{X(x):.1f},{Y(y):.1f}" for i, (x, y) in enumerate(sp))
            out.append(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="1.8"/>')
        else:
            for x, y in sp:
                out.append(f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="4" fill="{color}" '
                           f'fill-opacity="0.8"><title>{_fmt(x)}: {y:,.1f}</title></circle>')
        lx = pad_l + 8 + k * 120
        out.append(f'<rect x="{lx}" y="{pad_t - 12}" width="10" height="10" fill="{color}"/>'
                   f'<text x="{lx + 14}" y="{pad_t - 3}">{html.escape(str(s["name"]))}</text>')
    out.append("</svg>")
    return "".join(out)


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
    step = max(1, _nice_max(end / 8) if end > 8 else 1)
    return list(range(0, end + 1, int(step)))


def _table(rows: list[list[Any]], head: list[str]) -> str:
    h = "".join(f"<th>{html.escape(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


def _n(v: Any, f: str = ",.0f") -> str:
    return "-" if v is None else format(v, f)


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
    charts.append(svg_chart([{"name": f"prefetch {k}", "points": v}
                             for k, v in sorted(by_pf.items(), key=lambda kv: (kv[0] is not None, kv[0] or 0))],
                            title="images/s against num_workers", xlabel="num_workers",
                            ylabel="images/s", hlines=hl))
    au_pts = [(t["number"], t["au"]) for t in ok if t["au"] is not None]
    if au_pts:
        charts.append(svg_chart([{"name": "AU", "points": au_pts}], title="AU per trial",
                                xlabel="trial", ylabel="AU", bars=True,
                                hlines=[("input-bound below", 0.9, "#d62728")]))
    rec = d.get("recommended") or {}
    rec_trial = next((t for t in trials if t["number"] == rec.get("trial")), None)
    # The recommendation's own window (a confirmation's, when confirmed); the baseline is
    # not in trials.
    tl = _timeline(rec.get("timeline_file") or (rec_trial or {}).get("timeline_file"))
    if tl:
        t0 = tl[0]["time"]
        cpu = [(s["time"] - t0, _get(s, "proc", "cpu_pct")) for s in tl]
        rps = [(s["time"] - t0, _get(s, "disk", "reads_per_s")) for s in tl]
        util = [(s["time"] - t0, _get(s, "disk", "util_pct")) for s in tl]
        charts.append(svg_chart([{"name": "loader CPU %", "points": cpu, "mode": "line"},
                                 {"name": "disk %util", "points": util, "mode": "line"}],
                                title=f"Recommended trial {rec.get('trial')}: CPU and disk",
                                xlabel="seconds", ylabel="%", x_ticks=_sec_ticks(cpu)))
        if any(y for _, y in rps):
            charts.append(svg_chart([{"name": "disk reads/s", "points": rps, "mode": "line"}],
                                    title=f"Recommended trial {rec.get('trial')}: disk r/s",
                                    xlabel="seconds", ylabel="r/s", x_ticks=_sec_ticks(rps)))
    v = d.get("verdict") or {}
    cols = shown([t["params"] for t in d["trials"]])
    hosts = d.get("hosts") or []
    many = len(hosts) > 1 or any(len(g.get("hostnames") or []) > 1 for g in hosts)
    order = {g.get("key"): i for i, g in enumerate(hosts)}
    # Grouped by class of hosts (this host's first): figures compare only within a group.
    listed = sorted(d["trials"], key=lambda t: (order.get((t.get("host") or {}).get("key"), -1),
                                                t["number"])) if many else d["trials"]
    rows = [[t["number"], *([(t.get("host") or {}).get("hostname", "")] if many else []),
             *cells(t["params"], cols), t["state"],
             _n(t["images_per_s"]), _n(t["au"], ".2f"), _n(t["data_wait_fraction"], ".2f"),
             _n(t["peak_rss_mib"]), t.get("reason") or ""] for t in listed]
    parts = [f"<h2>{html.escape(title)}</h2>",
             f"<p class='verdict'><b>{html.escape(v.get('bottleneck', '?'))}</b>: "
             f"{html.escape(v.get('summary', ''))}</p>",
             "<ul>" + "".join(f"<li>{html.escape(e)}</li>" for e in v.get("evidence", []))
             + "".join(f"<li><b>{html.escape(a)}</b></li>" for a in v.get("advice", [])) + "</ul>",
             "<h3>Recommendation</h3>",
             f"<pre>{html.escape(d.get('snippet') or '-')}</pre>",
             f"<p>{_n(rec.get('images_per_s'))} images/s, AU {_n(rec.get('au'), '.2f')}"
             + (f" (confirmed in a {rec['window_s']:g} s window)" if rec.get("window_s") else "")
             + f"; baseline (rule of thumb) {_n(cbase.get('images_per_s'))} images/s"
             + (f" (its {cbase['window_s']:g} s window)" if cbase.get("window_s") else "")
             + f"; gain {_n(d.get('gain_vs_baseline'), '.2f')}x. "
             f"Stopped: {html.escape(d.get('stop_reason', ''))}.</p>",
             "<h3>Ceilings</h3><ul>" + "".join(f"<li>{html.escape(e)}</li>" for e in ceil.get("evidence", [])) + "</ul>",
             "<div class='charts'>" + "".join(charts) + "</div>",
             *(_hosts_html(hosts, d.get("storage", "")) if many else []),
             "<h3>Trials</h3>",
             _table(rows, ["#", *(["host"] if many else []), *(c.column for c in cols), "state",
                           "images/s", "AU", "data wait", "peak RSS MiB", "reason"])]
    if d.get("confirmed"):
        crow = [[c["number"], *cells(c["params"], cols),
                 _n(c.get("first_images_per_s")), _n(c.get("window_s"), "g"), c["state"],
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
           ".charts svg{margin:6px;border:1px solid #eee}.verdict{font-size:15px}")
    body = "\n".join(search_section(d, t) for t, d in sections)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{css}</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>")
