"""The HTML report of a real search, opened in a real browser (Debian's chromium, headless):
every chart draws marks, no two labels of a chart overlap as the browser lays them out,
the page logs no error and loads nothing from outside; its screenshot is kept in
out/report-screenshot.png (CI artifact). The layout is also checked without a browser on
charts made to collide (reference values a few percent apart, long legends, off-scale
notes, dense ticks)."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from autotune.report import html as report_html
from autotune.report.svg import FONT, svg_chart, text_box

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "out"

# Measures, in the page as the browser laid it out, each chart's marks and its labels'
# boxes (screen space: the rotated axis label too); the result goes into the DOM, which
# --dump-dom prints. Only a copy of the report gets it: the report has no script.
MEASURE = """<script>
const charts = [...document.querySelectorAll('svg')].map(svg => {
  const box = e => { const r = e.getBoundingClientRect();
                     return {s: e.textContent, x0: r.left, y0: r.top, x1: r.right, y1: r.bottom}; };
  const texts = [...svg.querySelectorAll('text')].map(box);
  const overlaps = [];
  for (let a = 0; a < texts.length; a++) for (let b = a + 1; b < texts.length; b++) {
    const p = texts[a], q = texts[b];
    if (p.x0 < q.x1 - 0.5 && q.x0 < p.x1 - 0.5 && p.y0 < q.y1 - 0.5 && q.y0 < p.y1 - 0.5)
      overlaps.push([p.s, q.s]);
  }
  const r = svg.getBoundingClientRect();
  const outside = texts.filter(t => t.x0 < r.left - 0.5 || t.x1 > r.right + 0.5 ||
                                    t.y0 < r.top - 0.5 || t.y1 > r.bottom + 0.5).map(t => t.s);
  return {title: texts.length ? texts[0].s : '', marks: svg.querySelectorAll('.mark').length,
          texts: texts.length, overlaps: overlaps, outside: outside};
});
const pre = document.createElement('pre');
pre.id = 'autotune-measure';
pre.textContent = JSON.stringify(charts);
document.body.appendChild(pre);
</script>"""


# -- the layout, without a browser ---------------------------------------------------------

def _texts(svg: str) -> list[tuple[str, object]]:
    """(text, estimated box) of every <text> of a chart, from its own attributes."""
    out = []
    for m in re.finditer(r"<text([^>]*)>([^<]*)</text>", svg):
        attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', m.group(1)))
        size = float(attrs.get("font-size", FONT))
        anchor = attrs.get("text-anchor", "start")
        s = m.group(2)
        tr = re.match(r"translate\(([-\d.]+),([-\d.]+)\) rotate\(-90\)", attrs.get("transform", ""))
        if tr:
            out.append((s, text_box(float(tr.group(1)), float(tr.group(2)), s, size, anchor,
                                    rotated=True)))
        else:
            out.append((s, text_box(float(attrs["x"]), float(attrs["y"]), s, size, anchor)))
    return out


def _collisions(svg: str) -> list[tuple[str, str]]:
    t = _texts(svg)
    return [(a, b) for i, (a, p) in enumerate(t) for b, q in t[i + 1:] if p.overlaps(q)]


CROWDED = [
    # today's report: the baseline a hair above the storage ceiling, decode off the scale
    dict(series=[{"name": "trial", "points": [(0, 250), (1, 262)]},
                 {"name": "best so far", "points": [(0, 250), (1, 262)], "mode": "line"}],
         hlines=[("storage", 470, "#d62728"), ("decode", 2694, "#9467bd"),
                 ("baseline", 471, "#7f7f7f")]),
    # four reference lines within 3 % of each other, two off-scale notes, a long legend
    dict(series=[{"name": f"prefetch {k} (persistent workers)", "points": [(w, 900 + w) for w in range(0, 65, 4)]}
                 for k in (1, 2, 4, 8)],
         hlines=[("storage", 1000, "#d62728"), ("demand", 1010, "#2ca02c"),
                 ("baseline", 1020, "#7f7f7f"), ("decode", 1030, "#9467bd"),
                 ("storage (fio)", 25000, "#000"), ("decode (probe)", 31000, "#000")]),
    # large figures on the y axis, 200 trials on the x axis
    dict(series=[{"name": "trial", "points": [(i, 20000 + 37 * i) for i in range(200)]}],
         hlines=[("baseline", 21000, "#7f7f7f")]),
    # reference lines at the very top and bottom of the plot
    dict(series=[{"name": "AU", "points": [(0, 0.95), (1, 0.02)]}],
         hlines=[("input-bound below", 0.9, "#d62728"), ("floor", 0.01, "#000")], bars=True),
]


@pytest.mark.parametrize("case", CROWDED, ids=["today", "four-lines", "big-numbers", "edges"])
def test_the_layout_keeps_every_label_apart(case):
    svg = svg_chart(title="images/s against num_workers", xlabel="num_workers",
                    ylabel="images/s", **case)
    assert _collisions(svg) == []
    for s, b in _texts(svg):   # and on the canvas
        assert b.x0 >= 0 and b.x1 <= 560 and b.y0 >= 0 and b.y1 <= 300, (s, b)
    assert svg.count('class="mark"') >= 2


def test_the_estimate_does_see_a_collision():
    # The check above would catch the old layout: two reference labels 1 % apart on one line.
    svg = ('<svg><text x="544" y="60" font-size="11" text-anchor="end">storage 470</text>'
           '<text x="544" y="59" font-size="11" text-anchor="end">baseline 471</text></svg>')
    assert _collisions(svg) == [("storage 470", "baseline 471")]


def test_the_dataset_is_named():
    d = {"dataset": "/data/imagenet/train", "options": {}}
    assert report_html.dataset_name(d) == "imagenet/train"
    assert report_html.dataset_name({"dataset": "/data/coco2017", "options": {}}) == "coco2017"
    d["options"]["dataset_factory"] = "/home/me/jobs/user_ds.py:make"
    assert report_html.dataset_name(d) == "user_ds.py:make on imagenet/train"


# -- a real search, rendered, opened in chromium -------------------------------------------

@pytest.fixture(scope="module")
def search_out(small_dataset, tmp_path_factory) -> Path:
    from autotune.search import SearchOptions, run_search

    tmp = tmp_path_factory.mktemp("report")
    space = tmp / "space.yaml"   # two configurations: no workers, and one worker
    space.write_text("num_workers: {choices: [0, 1]}\nprefetch_factor: {choices: [2]}\n"
                     "persistent_workers: {choices: [false]}\npin_memory: {choices: [false]}\n")
    out = tmp / "out"
    r = run_search(small_dataset, SearchOptions(
        probe=False, trials=2, seconds=1, confirm=0, cold=False, preset="decode-only",
        batch_size=4, space=str(space), out=str(out)))
    assert r.recommended is not None, r.warnings
    return out


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium is not installed (as root: apt-get install chromium; "
                    "scripts/test installs it)")
    r = subprocess.run([exe, "--headless", "--no-sandbox", "--version"], capture_output=True,
                       text=True, timeout=60)
    if r.returncode != 0:
        pytest.skip(f"chromium does not start here: {(r.stderr or r.stdout).strip()[-300:]}")
    return exe


def _browse(exe: str, page: Path, *args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="autotune-chromium-") as profile:
        return subprocess.run(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run",
             f"--user-data-dir={profile}", "--window-size=1280,2200", *args, page.as_uri()],
            capture_output=True, text=True, timeout=120)


def _measure(exe: str, page: Path) -> tuple[list[dict], str]:
    probe = page.with_name(page.stem + ".measure.html")
    probe.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    r = _browse(exe, probe, "--dump-dom")
    m = re.search(r'<pre id="autotune-measure">(.*?)</pre>', r.stdout, re.DOTALL)
    assert m, f"no measurement in the DOM: {r.stderr[-1500:]}"
    import html as _h

    return json.loads(_h.unescape(m.group(1))), r.stdout


def _page_errors(exe: str, page: Path, shot: Path) -> list[str]:
    r = _browse(exe, page, "--enable-logging=stderr", "--v=0", f"--screenshot={shot}")
    assert r.returncode == 0 and shot.stat().st_size > 10_000, r.stderr[-1500:]
    # The page's own messages: console output, uncaught errors, resources it failed to
    # load. (Chromium's own lines about D-Bus and the like are no concern of the page.)
    return [x for x in r.stderr.splitlines()
            if "CONSOLE" in x or "Uncaught" in x or "Failed to load" in x or "net::ERR" in x]


def _check_charts(charts: list[dict]) -> None:
    assert charts, "no chart on the page"
    for c in charts:
        assert c["marks"] > 0, f"chart {c['title']!r} draws nothing"
        assert c["overlaps"] == [], f"chart {c['title']!r}: labels overlap: {c['overlaps']}"
        assert c["outside"] == [], f"chart {c['title']!r}: labels cut off: {c['outside']}"


def test_the_report_of_a_real_search_in_a_real_browser(search_out):
    exe = _chromium()
    page = search_out / "report.html"
    d = json.loads((search_out / "search.json").read_text())
    text = page.read_text()
    assert "<script" not in text and "http://" not in text.replace(
        'xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in text
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report-screenshot.png"
    assert _page_errors(exe, page, shot) == []

    charts, dom = _measure(exe, page)
    _check_charts(charts)
    titles = [c["title"] for c in charts]
    assert "Optimization history" in titles and "images/s against num_workers" in titles
    name = report_html.dataset_name(d)
    assert name == f"{Path(d['dataset']).parent.name}/train"     # ".../ds0/train"
    assert f"<h1>autotune search: {name}</h1>" in dom
    # The lead's keys are drawn where the JSON has them and left out where it has not.
    rec = d["recommended"]
    assert ("Per rank (" in dom) == bool(rec.get("per_rank"))
    assert ("autotune.loader_kwargs(" in dom) == bool(d.get("loader_kwargs"))
    # The lines that train on the recommended data (search.json's `train`), shown as code.
    assert d["schema"] == "autotune.search/2" and d["batch_size_from"] == "option"
    assert d["train"]["dataset"] == d["dataset"] and "Train on it" in dom
    assert f"autotune.open_dataset('{d['dataset']}', transform=transform)" in dom


def test_the_crowded_charts_in_a_real_browser(tmp_path):
    """The layout's cases, measured with the browser's own fonts (the estimate's check)."""
    exe = _chromium()
    page = tmp_path / "crowded.html"
    page.write_text("<!DOCTYPE html><html><body>" + "".join(
        svg_chart(title=f"case {i}", xlabel="num_workers", ylabel="images/s", **c)
        for i, c in enumerate(CROWDED)) + "</body></html>")
    charts, _ = _measure(exe, page)
    assert len(charts) == len(CROWDED)
    _check_charts(charts)


def test_per_rank_figures_and_the_loader_kwargs_line_in_a_real_browser(search_out, tmp_path):
    """The same search's JSON with the keys a two-rank search writes (issue 14)."""
    exe = _chromium()
    d = copy.deepcopy(json.loads((search_out / "search.json").read_text()))
    d["options"]["procs_per_node"] = 2
    from autotune.params import loader_kwargs

    cfg = d["recommended"]["config"]   # the dict a search of issue 14 writes beside it
    d["loader_kwargs"] = {"batch_size": 4, "shuffle": True, **loader_kwargs(cfg)}
    d["recommended"]["per_rank"] = [
        {"rank": 0, "images_per_s": 230.5, "au": 0.41, "data_wait_fraction": 0.59,
         "batches": 40, "seconds": 1.0},
        {"rank": 1, "images_per_s": 214.0, "au": 0.38, "data_wait_fraction": 0.62,
         "batches": 37, "seconds": 1.0}]
    page = tmp_path / "report.html"
    page.write_text(report_html.render([(f"search: {d['dataset']}", d)]))
    assert _page_errors(exe, page, ARTIFACTS / "report-screenshot-ranks.png") == []
    charts, dom = _measure(exe, page)
    _check_charts(charts)
    per = next(c for c in charts if c["title"] == "Recommended: images/s per rank")
    assert per["marks"] == 2
    assert "Per rank (2 ranks on the node)" in dom and "2 x 214 = 428 images/s" in dom
    assert "2 ranks per node" in dom
    assert ('loader_kwargs("' + str(Path(d["options"]["out"]) / "search.json") + '")') in dom
    assert f"# = DataLoader(dataset, batch_size=4, shuffle=True, num_workers={cfg['num_workers']}" in dom


@pytest.mark.root
def test_the_report_says_what_the_container_did_not_allow(small_dataset, tmp_path):
    # A search with a read-only /proc/sys (Docker's) cannot drop caches: the header and
    # search.json said so, but report.html, the page that gets shared, called its figures
    # "fully cold" and "first (cold)" with no word of it.
    import os
    import sys

    out = tmp_path / "out"
    cmd = (f"mount --bind -o ro /proc/sys /proc/sys && exec {sys.executable} -m autotune -q "
           f"search {small_dataset} --preset decode-only --batch-size 4 --seconds 1 "
           f"--trials 1 --confirm 0 --no-probe --out {out}")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", cmd],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    if r.returncode != 0 and "unshare" in r.stderr:
        pytest.skip(f"no mount namespace here: {r.stderr.strip()[-200:]}")
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads((out / "search.json").read_text())
    lims = d["environment"]["limitations"]
    assert any("caches cannot be dropped" in x for x in lims), lims
    import html as _h

    page = _h.unescape((out / "report.html").read_text())
    for x in lims:
        assert x in page, x
    assert f"{d['environment']['cpu']['cores']:g} usable core(s)" in page
