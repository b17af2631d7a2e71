"""The tables of `autotune search`: ceilings, trials, confirmations, verdict, recommendation;
and of the closed loop (`--convert`): before and after."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from autotune.cli.tables import budget_texts, environment_texts, printable
from autotune.params import Param, cells, shown
from autotune_base.units import fmt_rate


def _f(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def search_renderable(d: dict[str, Any]) -> Group:
    """From SearchResult.to_dict()."""
    parts: list[Any] = _header(d)
    parts += _ceilings_parts(d["ceilings"])
    cols = shown([t["params"] for t in d["trials"]])
    rec_n = (d.get("recommended") or {}).get("trial")
    parts.append(_trials_table(d, cols, rec_n))
    conf = d.get("confirmed") or []
    if conf:
        parts.append(_confirmed_table(conf, cols, rec_n))
    v = d.get("verdict")
    parts += _verdict_texts(v) if v else _shm_texts(d)
    parts += run_texts(d.get("run"))
    rec = d.get("recommended")
    parts += budget_texts(_recommended_budget(d), "time budget of the recommended trial")
    if rec:
        parts += _recommended_parts(d, rec)
    if d.get("cold") is False and d.get("cold_reason"):
        parts.append(Text(f"NOT COLD: {printable(d['cold_reason'])}", style="bold yellow"))
    parts.append(Text(f"stopped: {printable(d['stop_reason'])}; {d['seconds']:.0f} s; report: "
                      f"{printable(d.get('report_html'))}"))
    for w in d.get("warnings", []):
        parts.append(Text(f"note: {printable(w)}", style="yellow"))
    return Group(*parts)


def _ceilings_parts(c: dict[str, Any]) -> list[Any]:
    """The ceilings' table (the smallest marked) and their evidence."""
    t = Table(title="Ceilings (images/s)", title_justify="left")
    t.add_column("ceiling")
    t.add_column("images/s", justify="right")
    for k in ("storage", "decode", "demand"):
        mark = " (smallest)" if c.get("smallest") == k else ""
        t.add_row(k + mark, fmt_rate(c.get(k)) if c.get(k) else "unbounded" if k == "demand" else "-")
    return [t] + [Text(f"  · {printable(e)}", style="dim") for e in c.get("evidence", [])]


def _trials_table(d: dict[str, Any], cols: list[Param], rec_n: int | None) -> Table:
    """Every trial, then the rule-of-thumb baseline; the recommended one starred."""
    tt = Table(title=f"Trials ({printable(d['study'], markup=True)})", title_justify="left")
    for col in ("#", *(c.column for c in cols), "state", "images/s", "AU", "wait", "RSS MiB",
                "reason"):
        # The reason wraps in its column: cut at 60 characters it stopped mid-word.
        tt.add_column(col, justify="left" if col in ("state", "reason") else "right",
                      max_width=48 if col == "reason" else None)
    for tr in d["trials"]:
        mark = " *" if tr["number"] == rec_n and tr["state"] == "complete" else ""
        tt.add_row(f"{tr['number']}{mark}", *cells(tr["params"], cols),
                   tr["state"] + (f" of {tr['duplicate_of']}" if tr.get("duplicate_of") is not None else ""),
                   fmt_rate(tr["images_per_s"]), _f(tr["au"]), _f(tr["data_wait_fraction"]),
                   _f(tr["peak_rss_mib"], ",.0f"),
                   printable(_clip(tr.get("reason") or "", 240), markup=True))
    b = d.get("baseline")
    if b:
        tt.add_row("base" + (" *" if rec_n == -1 else ""), *cells(b["config"], cols),
                   b.get("state") or "", fmt_rate(b.get("images_per_s")), _f(b.get("au")),
                   _f(b.get("data_wait_fraction")), _f(b.get("peak_rss_mib"), ",.0f"),
                   "baseline: rule of thumb")
    return tt


def _clip(text: str, n: int) -> str:
    """`text`, or its first words within `n` characters and an ellipsis (the JSON and the
    report hold it whole)."""
    if len(text) <= n:
        return text
    return text[:n].rsplit(" ", 1)[0].rstrip(",;:( ") + " …"


def _confirmed_table(conf: list[dict[str, Any]], cols: list[Param], rec_n: int | None) -> Table:
    """The fastest configurations measured again in the longer window."""
    ct = Table(title="Confirmed: the fastest measured again in a longer window",
               title_justify="left")
    for col in ("#", *(c.column for c in cols), "first images/s", "window s", "images/s", "AU"):
        ct.add_column(col, justify="right")
    for c in conf:
        mark = " *" if c["number"] == rec_n else ""
        ct.add_row(("base" if c["number"] == -1 else str(c["number"])) + mark,
                   *cells(c["params"], cols), fmt_rate(c.get("first_images_per_s")), _f(c.get("window_s"), ".1f"),
                   fmt_rate(c["images_per_s"]) if c["state"] == "complete"
                   else f"{c['state']}: "
                        f"{printable((c.get('reason') or '')[:40], markup=True)}",
                   _f(c.get("au")))
    return ct


def _verdict_texts(v: dict[str, Any]) -> list[Text]:
    """The bottleneck and its summary, the evidence, the advice."""
    return ([Text.assemble(("Verdict: ", "bold"), (v["bottleneck"], "bold cyan"),
                           f" — {printable(v['summary'])}")]
            + [Text(f"  · {printable(e)}") for e in v["evidence"]]
            + [Text(f"  → {printable(a)}", style="bold") for a in v["advice"]])


def _recommended_parts(d: dict[str, Any], rec: dict[str, Any]) -> list[Any]:
    """The recommendation's line, the code that trains on it and its YAML."""
    gain = d.get("gain_vs_baseline")
    parts: list[Any] = [Text.assemble(
        ("Recommended ", "bold"),
        ("(the rule-of-thumb baseline: no trial beat it by more than 3 %): " if rec["trial"] == -1
         else f"(trial {rec['trial']}, the cheapest within 3 % of the best): "),
        f"{fmt_rate(rec['images_per_s'])} images/s, AU {_f(rec['au'])}",
        f" (confirmed in a {rec['window_s']:.1f} s window)" if rec.get("window_s") else "",
        f"; {gain:.2f}x the rule-of-thumb baseline" if gain else "")]
    # The lines that train on the recommended data hold the DataLoader call; an older
    # search.json without them shows the call alone.
    train = d.get("train") or {}
    if train.get("code"):
        parts.append(Text(f"Train on {printable(str(train.get('dataset')))}:", style="bold"))
    parts.append(Syntax(train.get("code") or d["snippet"], "python", theme="ansi_dark",
                        background_color="default"))
    parts.append(Syntax(d["yaml"], "yaml", theme="ansi_dark", background_color="default"))
    return parts


def _header(d: dict[str, Any]) -> list[Any]:
    """What the job's container allows, and the memory bound each configuration had."""
    parts: list[Any] = list(environment_texts(d.get("environment")))
    mm = d.get("max_memory")
    if mm:
        parts.append(Text(f"  memory bound per configuration (loader tree PSS + /dev/shm): "
                          f"{mm['mib']:,.0f} MiB, {printable(mm['source'])}", style="dim"))
    return parts


def _shm_texts(d: dict[str, Any]) -> list[Text]:
    """What /dev/shm cut and the size that runs it: the verdict's evidence and advice
    when there is a verdict, these lines when nothing ran."""
    lines = (d.get("shm") or {}).get("lines") or []
    return ([Text(printable(lines[0]), style="bold")]
            + [Text(f"  → {printable(a)}", style="bold") for a in lines[1:]]) if lines else []


def run_texts(run: dict[str, Any] | None) -> list[Text]:
    """The whole run (search.json `run`): the regime, the first and later epochs."""
    if not run:
        return []
    out = [Text.assemble(("Whole run: ", "bold"), printable(run.get("regime") or ""))]
    first, later = run.get("first") or {}, run.get("later") or {}
    how = {"warm": "measured warm (one trial, the dataset in the page cache)",
           "cgroup hit rate": "from the page cache's hit rate, measured in a memory cgroup",
           "in-place hit rate": "from the page cache's hit rate, measured in place",
           "modelled": "modelled (strict LRU), not measured"}.get(run.get("method") or "",
                                                                    run.get("method") or "-")
    out.append(Text(f"  · first epoch {fmt_rate(first.get('images_per_s'))} images/s "
                    f"({first.get('bottleneck')}); later epochs "
                    f"{fmt_rate(later.get('images_per_s'))} images/s ({later.get('bottleneck')}): "
                    f"{printable(how)}"))
    if run.get("dataset_bytes") is not None:
        out.append(Text(f"  · dataset {run['dataset_bytes'] / 2**20:,.0f} MiB, page cache this "
                        f"job may use {(run.get('cache_bytes') or 0) / 2**20:,.0f} MiB "
                        f"({printable(run.get('cache_source') or '')})"
                        + ("" if run.get("hit_rate") is None else
                           f"; hit rate {run['hit_rate']:.0%}")))
    for n in run.get("notes") or []:
        out.append(Text(f"  · {printable(n)}", style="dim"))
    return out


def _recommended_budget(d: dict[str, Any]) -> dict[str, Any] | None:
    """The recommended trial's time budget (its window's system figures), if measured."""
    n = (d.get("recommended") or {}).get("trial")
    if n is None:
        return None
    for tr in d.get("trials") or []:
        if tr.get("number") == n:
            return (tr.get("system_figures") or {}).get("budget")
    return None


def loop_renderable(loop: Any) -> Group:
    """From a LoopResult: both searches, the before/after table, the decision."""
    parts = [Text("== before ==", style="bold"), search_renderable(loop.before.to_dict())]
    if loop.after is not None:
        parts += [Text("== after (converted, staged) ==", style="bold"),
                  search_renderable(loop.after.to_dict())]
        t = Table(title="Before and after", title_justify="left")
        for c in ("", "images/s", "AU", "data wait", "verdict"):
            t.add_column(c, justify="left" if c in ("", "verdict") else "right")
        for label, r in (("before: baseline", loop.start),
                         ("before: recommended", loop.before.recommended),
                         ("after: recommended", loop.after.recommended)):
            if r is None:
                continue
            v = (loop.before if label.startswith("before") else loop.after).verdict
            t.add_row(label, f"{r.images_per_s or 0:,.0f}", f"{r.au or 0:.2f}",
                      f"{r.data_wait_fraction or 0:.2f}", v.bottleneck if v else "-")
        parts.append(t)
        if loop.gain:
            parts.append(Text(f"gain: {loop.gain:.2f}x the rule-of-thumb baseline on the source", style="bold"))
        parts.append(Text(f"staged at {loop.staged['mib_per_s']:,.0f} MiB/s"))
    parts.append(Text(f"decision: {printable(loop.decision)}"))
    for c in loop.commands:
        parts.append(Text(f"  $ {c}", style="dim"))
    return Group(*parts)
