"""Inline SVG charts whose text never overlaps: every label gets an explicit position
from a layout that knows each label's box.

A browser lays the text out, not this module, so a label's width is estimated from its
length: CHAR_EM em per character is wider than the sans-serif glyphs labels are made of
(DejaVu Sans, Debian's default: digits 0.64 em, lower case about 0.6 em; Liberation
Sans: digits 0.56 em), so boxes placed apart here stay apart on the page
(tests/report/test_html_report.py measures them in Chromium). Rows from the top: title, legend (wrapping), notes (reference values off
the scale), then the plot; reference-line labels inside the plot are pushed apart
vertically; x tick labels are thinned to fit; the left margin holds the widest y tick.
Data marks carry class="mark", legend keys class="key": a test can count what a chart
draws.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
CHAR_EM = 0.7         # estimated width of one character, in em (generous: see above)
FONT = 11             # labels, ticks, legend
TITLE_FONT = 13
ASCENT, DESCENT = 0.8, 0.25   # of the font size, around the baseline
GAP = 3               # pixels kept between two labels


def text_width(s: str, size: float = FONT) -> float:
    """Estimated width of `s` at `size` px (see CHAR_EM)."""
    return len(s) * CHAR_EM * size


@dataclass(frozen=True)
class Box:
    """A label's box on the page: x0 < x1, y0 < y1 (SVG y grows downwards)."""

    x0: float
    y0: float
    x1: float
    y1: float

    def overlaps(self, o: Box) -> bool:
        return self.x0 < o.x1 and o.x0 < self.x1 and self.y0 < o.y1 and o.y0 < self.y1


def text_box(x: float, y: float, s: str, size: float = FONT, anchor: str = "start",
             rotated: bool = False) -> Box:
    """The box of text drawn at (x, y) (its baseline), as the layout estimates it;
    `rotated`: turned -90 degrees about (x, y), reading upwards."""
    w = text_width(s, size)
    if rotated:   # the text runs up the page; its ascent goes left of x
        off = {"start": 0.0, "middle": w / 2, "end": w}[anchor]
        return Box(x - ASCENT * size, y - w + off, x + DESCENT * size, y + off)
    x0 = {"start": x, "middle": x - w / 2, "end": x - w}[anchor]
    return Box(x0, y - ASCENT * size, x0 + w, y + DESCENT * size)


def nice_max(v: float, steps: tuple[float, ...] = (1, 2, 2.5, 5, 10)) -> float:
    """The round number (one of `steps` x 10^k) at or above v."""
    if v <= 0:
        return 1.0
    e = 10 ** math.floor(math.log10(v))
    for m in steps:
        if v <= m * e:
            return m * e
    return 10 * e


def axis_top(v: float) -> float:
    """The y axis's top for data up to v: four round steps (0, 150, 300, 450, 600 rather
    than 0, 62, 125, 188, 250)."""
    return 4 * nice_max(v / 4, (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10))


def fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 10 else f"{v:.2g}"


def _text(x: float, y: float, s: str, *, size: int = FONT, anchor: str = "start",
          extra: str = "") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"{extra}>'
            f'{html.escape(s)}</text>')


def _rows(widths: list[float], x0: float, x1: float) -> list[list[tuple[int, float]]]:
    """Items of these widths placed left to right from x0, 14 px apart, a new row
    before x1: rows of (item index, x)."""
    rows: list[list[tuple[int, float]]] = [[]]
    x = x0
    for i, w in enumerate(widths):
        if rows[-1] and x + w > x1:
            rows.append([])
            x = x0
        rows[-1].append((i, x))
        x += w + 14
    return [r for r in rows if r]


def spread(wanted: list[float], lo: float, hi: float, step: float) -> list[float]:
    """Baselines as close to `wanted` as possible, each at least `step` from the next,
    within [lo, hi] (a label's baseline; `step` = its height plus GAP). Keeps order."""
    order = sorted(range(len(wanted)), key=lambda i: wanted[i])
    ys = [min(max(wanted[i], lo), hi) for i in order]
    for k in range(1, len(ys)):           # downwards: no label above its predecessor
        ys[k] = max(ys[k], ys[k - 1] + step)
    if ys and ys[-1] > hi:                # pushed out at the bottom: push back up
        ys[-1] = hi
        for k in range(len(ys) - 2, -1, -1):
            ys[k] = min(ys[k], ys[k + 1] - step)
    out = [0.0] * len(wanted)
    for k, i in enumerate(order):
        out[i] = ys[k]
    return out


@dataclass
class _Frame:
    """The plot area inside the chart and its scales."""

    width: float
    height: float
    pad_l: float
    pad_r: float
    pad_t: float
    pad_b: float
    xmin: float
    xmax: float
    ymax: float

    @property
    def pw(self) -> float:
        return self.width - self.pad_l - self.pad_r

    @property
    def ph(self) -> float:
        return self.height - self.pad_t - self.pad_b

    def X(self, x: float) -> float:
        return self.pad_l + (x - self.xmin) / (self.xmax - self.xmin) * self.pw

    def Y(self, v: float) -> float:
        return self.pad_t + self.ph - (v / self.ymax) * self.ph


def svg_chart(series: list[dict[str, Any]], *, title: str, xlabel: str, ylabel: str,
              hlines: list[tuple[str, float, str]] | None = None, width: int = 560,
              height: int = 300, bars: bool = False, x_ticks: list[Any] | None = None) -> str:
    """Scatter/line/bar chart. series: [{name, points[(x, y)], color?, mode: 'line'|'points'}];
    hlines: reference lines (label, value, color); one far above the data (over 2x its
    top) would flatten it and is named in a note row instead."""
    pts = [p for s in series for p in s["points"] if p[1] is not None]
    xs = [p[0] for p in pts] or [0, 1]
    top = max([p[1] for p in pts] + [1e-9])
    hl = [h for h in (hlines or []) if h[1]]
    off = [(n, v) for n, v, _ in hl if pts and v > 2 * top]
    hl = [h for h in hl if not pts or h[1] <= 2 * top]
    ymax = axis_top(max([top] + [v for _, v, _ in hl]) * 1.05)
    yticks = [ymax * i / 4 for i in range(5)]
    pad_l = max(48.0, max(text_width(fmt(v)) for v in yticks) + 30)
    colors = [s.get("color") or PALETTE[k % len(PALETTE)] for k, s in enumerate(series)]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="{FONT}">',
           _text(width / 2, 16, title, size=TITLE_FONT, anchor="middle",
                 extra=' font-weight="bold"')]
    pad_t = _key_rows(out, [str(s["name"]) for s in series], colors,
                      [f"off scale: {n} {fmt(v)}" for n, v in off], pad_l, width - 16.0)
    xmin, xmax = min(xs), max(xs)
    if bars:
        xmin, xmax = xmin - 0.6, xmax + 0.6
    elif xmax == xmin:
        xmin, xmax = xmin - 1, xmax + 1
    elif x_ticks is None:   # points off the axes
        m = (xmax - xmin) * 0.05
        xmin, xmax = xmin - m, xmax + m
    fr = _Frame(width, height, pad_l, 16.0, pad_t, 46.0, xmin, xmax, ymax)
    _axes(out, fr, yticks, x_ticks if x_ticks is not None else sorted(set(xs)), xlabel, ylabel)
    _ref_lines(out, fr, hl)
    _marks(out, fr, series, colors, bars)
    out.append("</svg>")
    return "".join(out)


def _key_rows(out: list[str], names: list[str], colors: list[str], notes: list[str],
              left: float, right: float) -> float:
    """Legend rows, then note rows, under the title: outside the plot, nothing to collide
    with. Returns the plot's top."""
    line_h = FONT * (ASCENT + DESCENT) + GAP
    y = 16 + DESCENT * TITLE_FONT + GAP + ASCENT * FONT
    for row in _rows([14 + text_width(n) for n in names], left, right):
        for k, x in row:
            out.append(f'<rect class="key" x="{x:.1f}" y="{y - 9:.1f}" width="10" height="10" '
                       f'fill="{colors[k]}"/>' + _text(x + 14, y, names[k]))
        y += line_h
    for row in _rows([text_width(n) for n in notes], left, right):
        for k, x in row:
            out.append(_text(x, y, notes[k], extra=' fill="#888"'))
        y += line_h
    return y - ASCENT * FONT + 4


def _axes(out: list[str], fr: _Frame, yticks: list[float], ticks: list[Any], xlabel: str,
          ylabel: str) -> None:
    X, Y, right, bottom = fr.X, fr.Y, fr.width - fr.pad_r, fr.pad_t + fr.ph
    for v in yticks:
        out.append(f'<line x1="{fr.pad_l:.1f}" x2="{right:.1f}" y1="{Y(v):.1f}" '
                   f'y2="{Y(v):.1f}" stroke="#ddd"/>')
        out.append(_text(fr.pad_l - 6, Y(v) + 4, fmt(v), anchor="end"))
    if len(ticks) > 1:   # every k-th tick, so that neighbouring labels keep GAP * 3 apart
        widest = max(text_width(fmt(t)) for t in ticks)
        room = (X(ticks[-1]) - X(ticks[0])) / (len(ticks) - 1)
        ticks = ticks[::max(1, math.ceil((widest + 3 * GAP) / max(room, 1e-9)))]
    for xv in ticks:
        out.append(_text(X(xv), bottom + 16, fmt(xv), anchor="middle"))
    out.append(f'<line x1="{fr.pad_l:.1f}" x2="{fr.pad_l:.1f}" y1="{fr.pad_t:.1f}" '
               f'y2="{bottom:.1f}" stroke="#333"/>')
    out.append(f'<line x1="{fr.pad_l:.1f}" x2="{right:.1f}" y1="{bottom:.1f}" '
               f'y2="{bottom:.1f}" stroke="#333"/>')
    out.append(_text(fr.pad_l + fr.pw / 2, fr.height - 8, xlabel, anchor="middle"))
    out.append(f'<text transform="translate(14,{fr.pad_t + fr.ph / 2:.1f}) rotate(-90)" x="0" '
               f'y="0" font-size="{FONT}" text-anchor="middle">{html.escape(ylabel)}</text>')


def _ref_lines(out: list[str], fr: _Frame, hl: list[tuple[str, float, str]]) -> None:
    """Reference lines; their labels above the line, pushed apart where two would touch."""
    line_h = FONT * (ASCENT + DESCENT) + GAP
    right = fr.width - fr.pad_r
    ys = spread([fr.Y(v) - 3 for _, v, _ in hl], fr.pad_t + ASCENT * FONT + 1,
                fr.pad_t + fr.ph - DESCENT * FONT - 1, line_h)
    for (label, v, color), ly in zip(hl, ys):
        out.append(f'<line class="ref" x1="{fr.pad_l:.1f}" x2="{right:.1f}" y1="{fr.Y(v):.1f}" '
                   f'y2="{fr.Y(v):.1f}" stroke="{color}" stroke-dasharray="5,4"/>')
        out.append(_text(right - 2, ly, f"{label} {fmt(v)}", anchor="end",
                         extra=f' fill="{color}"'))


def _marks(out: list[str], fr: _Frame, series: list[dict[str, Any]], colors: list[str],
           bars: bool) -> None:
    X, Y = fr.X, fr.Y
    nser = max(1, len(series))
    for k, s in enumerate(series):
        color = colors[k]
        sp = [(x, v) for x, v in s["points"] if v is not None]
        if bars:
            bw = fr.pw / max(1, (fr.xmax - fr.xmin)) * 0.8 / nser
            for x, v in sp:
                x0 = X(x) - bw * nser / 2 + k * bw
                out.append(f'<rect class="mark" x="{x0:.1f}" y="{Y(v):.1f}" width="{bw:.1f}" '
                           f'height="{Y(0) - Y(v):.1f}" fill="{color}"><title>{fmt(x)}: {v:.3g}'
                           '</title></rect>')
        elif s.get("mode") == "line" and len(sp) > 1:
            d = " ".join(f"{'M' if i == 0 else 'L'}{X(x):.1f},{Y(v):.1f}" for i, (x, v) in enumerate(sp))
            out.append(f'<path class="mark" d="{d}" fill="none" stroke="{color}" stroke-width="1.8"/>')
        else:
            for x, v in sp:
                out.append(f'<circle class="mark" cx="{X(x):.1f}" cy="{Y(v):.1f}" r="4" '
                           f'fill="{color}" fill-opacity="0.8"><title>{fmt(x)}: {v:,.1f}</title>'
                           '</circle>')


def svg_stacked_bars(rows: list[tuple[str, list[tuple[str, float]]]], *, title: str,
                     colors: dict[str, str] | None = None, width: int = 560,
                     notes: list[str] | None = None) -> str:
    """Horizontal stacked bars, one per row (label, [(part, share 0..1)]), on a 0-100 %
    axis: the time budget's picture (a bar per process class). The label stands above its
    bar; parts over 100 % in all (several busy threads) are scaled to the bar and the
    total named in the label. Each part carries class="mark" with a <title>; the legend
    keys class="key"; notes (grey) wrap under the legend."""
    names = list(dict.fromkeys(p for _, parts in rows for p, _ in parts))
    cols = [(colors or {}).get(n) or PALETTE[k % len(PALETTE)] for k, n in enumerate(names)]
    x0, x1 = 8.0, width - 16.0
    out = ["", _text(width / 2, 16, title, size=TITLE_FONT, anchor="middle",
                     extra=' font-weight="bold"')]
    y = _key_rows(out, names, cols, notes or [], x0, x1) + 4
    bar_h = 18.0
    for label, parts in rows:
        total = sum(max(0.0, v) for _, v in parts)
        label += f" (sum {total:.0%}: several busy threads)" if total > 1.005 else ""
        y += ASCENT * FONT
        out.append(_text(x0, y, label))
        y += DESCENT * FONT + GAP
        x, scale = x0, max(1.0, total)
        for name, v in parts:
            w = max(0.0, v) / scale * (x1 - x0)
            if w > 0:
                out.append(f'<rect class="mark" x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" '
                           f'height="{bar_h:.1f}" fill="{cols[names.index(name)]}"><title>'
                           f'{html.escape(label)}: {html.escape(name)} {v:.0%}</title></rect>')
            x += w
        y += bar_h + 2 * GAP
    for pct in (0, 25, 50, 75, 100):
        xp = x0 + pct / 100 * (x1 - x0)
        anchor = "start" if pct == 0 else "end" if pct == 100 else "middle"
        out.append(f'<line x1="{xp:.1f}" x2="{xp:.1f}" y1="{y - 4:.1f}" y2="{y:.1f}" '
                   'stroke="#333"/>' + _text(xp, y + 13, f"{pct} %", anchor=anchor))
    out[0] = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y + 22:.0f}" '
              f'font-family="sans-serif" font-size="{FONT}">')
    out.append("</svg>")
    return "".join(out)
