"""The closed loop: search; if storage is the limit, convert, stage, and search again.

The project does not stop at "your disk is slow": it repacks the dataset into shards,
stages them on local disk (verified, atomic), measures the staged copy with the same
search, and reports before and after side by side with the commands that reproduce
each step.

Format rule for `--convert auto` (documented in the README), by the registry's `access`
of each writable format (autotune_converters.registry):
* a random-access format (LMDB) only when the source is local flash measured fast at
  random reads (class nvme, ssd or memory, fio >= 50,000 random 4 KiB IOPS, and no more
  than 2x gain from concurrency in the replay): random access keeps exact per-sample
  shuffling, and our pread reader costs one I/O per image;
* a sequential format (WebDataset) otherwise (network, FUSE, spinning, throttled or
  unmeasured storage): shards are read sequentially in large requests, the only pattern
  slow storage serves well, and they stay usable in place if staging space runs out.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autotune.errors import UsageError
from autotune_converters import registry
from autotune.search.records import TrialRecord
from autotune.search.result import SearchResult, like_for_like_baseline
from autotune.search.study import Progress, SearchOptions, run_search

CONVERT_MODES = ("auto", *registry.names(writable=True), "off")


@dataclass
class LoopResult:
    before: SearchResult
    after: SearchResult | None
    decision: str
    converted: dict[str, Any] | None = None
    staged: dict[str, Any] | None = None
    commands: list[str] = field(default_factory=list)
    # --epochs N: the run's projected time with and without conversion (search.projection).
    projection: dict[str, Any] | None = None

    @staticmethod
    def _side(r: SearchResult | None) -> dict[str, Any] | None:
        if r is None:
            return None
        d = r.to_dict()
        return {k: d[k] for k in ("dataset", "cold", "cold_reason", "recommended", "best",
                                  "baseline", "baseline_confirmed", "verdict", "ceilings",
                                  "gain_vs_baseline", "report_html", "run", "dataset_format",
                                  "batch_size", "batch_size_from", "loader_kwargs", "train")}

    @property
    def start(self) -> TrialRecord | None:
        """Before's baseline (the starting point) as after's recommendation is set against
        it: in a window of the same kind (both confirmed, or both first measurements)."""
        a = self.after.recommended if self.after else None
        b = self.before.baseline
        if a is None or b is None:
            return b
        return like_for_like_baseline(a, b, self.before.baseline_confirmed)

    @property
    def gain(self) -> float | None:
        """After's recommended images/s over the starting point (see `start`)."""
        a = self.after.recommended if self.after else None
        b = self.start
        if a and b and b.ok and a.images_per_s:
            return a.images_per_s / b.images_per_s  # type: ignore[operator]
        return None

    def to_dict(self) -> dict[str, Any]:
        d = self.before.to_dict()
        d.update(before=self._side(self.before), after=self._side(self.after),
                 decision=self.decision, converted=self.converted, staged=self.staged,
                 commands=self.commands, gain_after_vs_baseline=self.gain,
                 projection=self.projection)
        if self.after is not None:  # what to train on: the staged copy, as searched
            d["train"] = self.after.train()
        return d


def choose_format(mode: str, before: SearchResult) -> tuple[str, str]:
    """The format and the reason (see the module doc for the rule)."""
    if mode != "auto":
        return mode, f"--convert {mode}"
    probe = before.ceilings.probe or {}
    fs = (probe.get("filesystem") or {})
    klass = fs.get("behaves_like") or fs.get("class") or "unknown"
    fio = probe.get("fio") or {}
    iops = (fio.get("rand_read") or {}).get("iops")
    levels = ((probe.get("replay") or {}).get("by_concurrency") or [])
    gain = None
    if levels:
        one = levels[0]["files_per_s"] or 1e-9
        gain = max(lv["files_per_s"] for lv in levels) / one
    # LMDB only where random 4 KiB reads are known to be cheap; anything unmeasured,
    # throttled or latency-bound gets sequential shards.
    fast_random = klass in ("nvme", "ssd", "memory") and iops is not None and iops >= 50_000 \
        and (gain is None or gain <= 2)
    if not fast_random:
        fmt = registry.names(writable=True, access="sequential")[0]
        why = (f"source storage ({klass}, "
               + (f"{iops:,.0f} random IOPS" if iops else "fio not run")
               + (f", replay {gain:.1f}x faster with concurrency" if gain else "")
               + f") is not known to be fast at random reads: {fmt} is read in large "
               "sequential requests")
        return fmt, why
    fmt = registry.names(writable=True, access="random")[0]
    return fmt, f"source storage is {klass} (local flash): {fmt} keeps random access"


def search_flags(opts: SearchOptions) -> str:
    """The `autotune search` options that reproduce `opts` (those not at their default)."""
    d = SearchOptions()
    pairs = [("--preset", opts.preset, d.preset), ("--batch-size", opts.batch_size, d.batch_size),
             ("--compute-ms", opts.compute_ms, d.compute_ms), ("--step", opts.step, d.step),
             ("--space", opts.space, d.space), ("--trials", opts.trials, d.trials),
             ("--timeout", opts.timeout_s, d.timeout_s), ("--seconds", opts.seconds, d.seconds),
             ("--seed", opts.seed, d.seed), ("--confirm", opts.confirm, d.confirm),
             ("--confirm-seconds", opts.confirm_seconds, d.confirm_seconds)]
    out = "".join(f" {k} {shlex.quote(format(v, 'g') if isinstance(v, float) else str(v))}"
                  for k, v, dv in pairs if v is not None and v != dv)
    if not opts.cold:
        out += " --warm"
    if not opts.probe_fio:
        out += " --no-fio"
    if not opts.whole_run:
        out += " --first-epoch-only"
    if opts.prune_below is None:
        out += " --no-prune"
    elif opts.prune_below != d.prune_below:
        out += f" --prune-below {opts.prune_below:g}"
    return out


def run_loop(dataset: str | os.PathLike[str], opts: SearchOptions, *, convert: str = "auto",
             stage_dir: str | os.PathLike[str] | None = None,
             convert_dir: str | os.PathLike[str] | None = None,
             convert_workers: int | None = None,
             progress: Progress | None = None, always: bool = False,
             epochs: int | None = None) -> LoopResult:
    """Search `dataset`; when the verdict is storage and `convert` is not 'off', convert,
    stage to `stage_dir`, search the staged copy, and return both searches.

    epochs: the run's length; given, a storage-bound search converts only where the
    projected run (autotune.search.projection: the first and later epochs' measured rates against
    the conversion's cost and the rate after it) is shorter with conversion, and the
    decision says so either way. Without it, storage-bound converts as before (the
    decision names the regime: the first epoch only, or every epoch).

    always: convert, stage and search again whatever the verdict (to measure whether it
    pays where more workers may already hide the latency); the decision says so."""
    _check_modes(convert, stage_dir)
    say = progress or (lambda _m: None)
    out = Path(opts.out)
    epochs = epochs if epochs is not None else opts.epochs
    # A bucket is converted straight into the stage directory (local disk): for object
    # storage the conversion is the staging.
    bucket = isinstance(dataset, str) and dataset.startswith("s3://")
    root: Any = dataset if bucket else Path(dataset).absolute()
    q = shlex.quote
    before = run_search(root, replace(opts, out=str(out / "before") if convert != "off" else opts.out),
                        progress=lambda m: say(f"before: {m}"))
    cmds = [f"autotune search {q(str(root))}{search_flags(opts)} --out {q(str(out / 'before'))}"]
    why_not = _why_not_convert(before, convert, always)
    if why_not is not None:
        return LoopResult(before, None, why_not, commands=cmds)
    if not bucket and stage_dir and Path(stage_dir).absolute() in (root, *root.parents):
        raise UsageError(f"stage directory {stage_dir} contains the dataset; pick a directory on "
                         "another (local) disk.", setting="stage_dir")
    projection, why_run = _projection(before, epochs, stage_dir, always)
    if projection is not None and not projection["convert"]:
        return LoopResult(before, None, f"storage-bound ({before.run['regime']}); "
                          f"{projection['text']}", commands=cmds, projection=projection)
    fmt, why = choose_format(convert, before)
    if bucket:
        res = _from_bucket(root, opts, out, before, fmt, why, Path(stage_dir),  # type: ignore[arg-type]
                           convert_workers, cmds, say)
    else:
        res = _from_local(root, opts, out, before, fmt, why, Path(stage_dir),  # type: ignore[arg-type]
                          convert_dir, convert_workers, cmds, say)
    res.decision += why_run
    res.projection = projection
    write_loop_outputs(res, out)
    return res


def _check_modes(convert: str, stage_dir: Any) -> None:
    """A known --convert mode, and somewhere to stage the conversion when there is one."""
    if convert not in CONVERT_MODES:
        raise UsageError(f"convert must be one of {', '.join(CONVERT_MODES)}, but got {convert!r}.")
    if convert != "off" and stage_dir is None:
        raise UsageError("convert needs stage_dir: the local disk the converted "
                         "dataset is staged to and measured on.", setting=("convert", "stage_dir"))


def _why_not_convert(before: SearchResult, convert: str, always: bool) -> str | None:
    """Why the loop ends after the first search (the decision), or None to go on."""
    v = before.verdict
    if convert == "off":
        return "conversion off (--convert off)"
    if v is None or (v.bottleneck != "storage" and not always):
        return ("no configuration completed" if v is None else
                f"the verdict is {v.bottleneck}, not storage: converting and staging would not "
                "help. " + " ".join(a if a.endswith(".") else f"{a}." for a in v.advice))
    return None


def _projection(before: SearchResult, epochs: int | None, stage_dir: Any,
                always: bool) -> tuple[dict[str, Any] | None, str]:
    """(--epochs N's projection, or None; what the decision adds about the whole run)."""
    from autotune.search.projection import conversion_projection

    run = before.run
    regime = f" ({run['regime']})" if run else ""
    if epochs is None:
        return None, (f"; the verdict's regime{regime}: without --epochs a storage-bound "
                      "first epoch is converted; --epochs N decides from the run's "
                      "projected time" if run else "")
    p = None if always else conversion_projection(before, epochs, stage_dir)
    if p is None:
        return None, (f"; --epochs {epochs}: " + ("asked to convert whatever the verdict "
                                                   "(always)" if always else "no whole-run figures to "
                                                   "project from, converted as without it"))
    return p, f"; {p['text']}"


def write_loop_outputs(res: LoopResult, out: Path) -> None:
    """out/search.json (both searches) and out/report.html (both side by side)."""
    from autotune.report import html as report_html
    from autotune.report import write_json
    from autotune_base.fsutil import write_text_atomic

    d = res.to_dict()
    write_json(out / "search.json", d)
    sections = [(f"before: {res.before.dataset}", res.before.to_dict())]
    if res.after is not None:
        sections.append((f"after: {res.after.dataset} (converted, staged)", res.after.to_dict()))
    write_text_atomic(out / "report.html", report_html.render(sections, "autotune search: before and after"))


def _search_after(sdir: Path, opts: SearchOptions, out: Path, flags: str, cmds: list[str],
                  say: Callable[[str], None]) -> Any:
    """The search of the staged copy: its own study and folder, nothing throttled."""
    after_opts = replace(opts, out=str(out / "after"), format="auto",
                         study=(opts.study + "-after") if opts.study else None,
                         monitor_path=None, popen=None, throttle=None)
    after = run_search(sdir, after_opts, progress=lambda m: say(f"after: {m}"))
    cmds.append(f"autotune search {shlex.quote(str(sdir))}{flags} "
                f"--out {shlex.quote(str(out / 'after'))}")
    return after


def _from_local(root: Path, opts: SearchOptions, out: Path, before: SearchResult, fmt: str,
                why: str, stage_dir: Path, convert_dir: Any, convert_workers: int | None,
                cmds: list[str], say: Callable[[str], None]) -> LoopResult:
    """A storage-bound local dataset: converted (under the emulated cap when there is one),
    the conversion staged to `stage_dir` (verified), the staged copy searched again."""
    from autotune_converters import ConvertOptions, convert as do_convert
    from autotune_converters.stage import stage

    q = shlex.quote
    cdir = Path(convert_dir) if convert_dir else out / f"converted-{fmt}"
    say(f"converting to {fmt} in {cdir} ({why})")
    copts = ConvertOptions(format=fmt, **({"workers": convert_workers} if convert_workers else {}))
    # The conversion reads the slow source: under the emulated cap when there is one.
    with opts.throttle.joined() if opts.throttle is not None else contextlib.nullcontext():
        cres = do_convert(root, cdir, copts)
    cmds.append(f"autotune convert {q(str(root))} {q(str(cdir))} --format {fmt}")
    sdir = stage_dir / cdir.name
    say(f"staging {cdir} to {sdir}")
    seq = ((before.ceilings.probe or {}).get("fio") or {}).get("seq_read", {}).get("bw_mib_s")
    sres = stage(cdir, sdir, source_seq_mib_s=seq)
    if sres.partial:
        raise UsageError(f"staging {cdir} to {sdir} was partial: "
                         + "; ".join(f"{f.file}: {f.reason}" for f in sres.failures))
    cmds.append(f"autotune stage {q(str(cdir))} {q(str(sdir))}")
    after = _search_after(sdir, opts, out, search_flags(opts), cmds, say)
    conv = {"format": fmt, "why": why, "dir": str(cdir), "manifest": str(cdir / "manifest.json"),
            "samples": getattr(cres, "samples", None), "seconds": getattr(cres, "seconds", None)}
    staged = {"dir": str(sdir), "mib_per_s": sres.mib_per_s, "files": sres.files,
              "vs_source_seq": (sres.mib_per_s / seq) if seq else None}
    bottleneck = before.verdict.bottleneck  # type: ignore[union-attr]  # _why_not_convert: one
    head = "storage-bound" if bottleneck == "storage" else f"{bottleneck}-bound (converted anyway: always)"
    decision = f"{head}: converted to {fmt} ({why}), staged to {sdir}, searched again"
    return LoopResult(before, after, decision, conv, staged, cmds)


def _from_bucket(url: str, opts: SearchOptions, out: Path, before: Any, fmt: str, why: str,
                 stage_dir: Path, convert_workers: int | None, cmds: list[str],
                 say: Callable[[str], None]) -> LoopResult:
    """A storage-bound bucket: converted from the bucket straight into the stage
    directory (one pass over the objects, GETs pinned to the listing's ETags), then the
    staged shards searched again. The caller writes the outputs."""
    from autotune_converters import ConvertOptions, convert as do_convert

    q = shlex.quote
    sdir = stage_dir / f"converted-{fmt}"
    say(f"converting {url} to {fmt} straight into {sdir} ({why})")
    copts = ConvertOptions(format=fmt, **({"workers": convert_workers} if convert_workers else {}))
    t0 = time.monotonic()
    cres = do_convert(url, sdir, copts)
    secs = time.monotonic() - t0
    cmds.append(f"autotune convert {q(url)} {q(str(sdir))} --format {fmt}")
    after = _search_after(sdir, opts, out, search_flags(opts), cmds, say)
    size = sum(f.stat().st_size for f in sdir.iterdir() if f.is_file())
    conv = {"format": fmt, "why": why, "dir": str(sdir), "manifest": str(sdir / "manifest.json"),
            "samples": getattr(cres, "samples", None), "seconds": getattr(cres, "seconds", None),
            "source": url}
    staged = {"dir": str(sdir), "mib_per_s": size / 2**20 / secs if secs > 0 else None,
              "files": sum(1 for f in sdir.iterdir() if f.is_file()), "vs_source_seq": None,
              "how": "converted from the bucket straight into the stage directory"}
    decision = (f"storage-bound: converted {url} to {fmt} ({why}) straight into {sdir} (the "
                "conversion is the staging for object storage), searched again")
    return LoopResult(before, after, decision, conv, staged, cmds)
