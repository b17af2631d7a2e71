"""CLI layer for `autotune search` and `autotune stage` (parsing, printing, exit codes)."""

from __future__ import annotations

import argparse

from autotune.errors import AutotuneError

SEARCH_EXIT = """\
exit status:
  0    a recommendation was made
  1    error, or no configuration completed (each trial's reason is in the table/JSON)
  2    usage error
  130  interrupted (Ctrl-C): the study keeps every measured trial; rerun to resume
"""

STAGE_EXIT = """\
exit status:
  0    every file staged and verified; manifest.json written last
  1    error: nothing could be staged (space, lock, manifest); the message says why
  2    usage error
  4    partial: some files failed (named); the others are staged; rerun to resume
  130  interrupted: files already verified stay; rerun to resume
"""


def add_search_parser(sub: argparse._SubParsersAction) -> None:
    from autotune.cli import _nonneg_float as nonneg_f
    from autotune.cli import _nonneg_int as nonneg_i
    from autotune.cli import _positive_float as pos_f
    from autotune.cli import _positive_int as pos_i
    from autotune.search.loop import CONVERT_MODES
    from converters import registry

    p = sub.add_parser(
        "search", help="find the best DataLoader settings (Optuna), the bottleneck and a report",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Search DataLoader settings for DATASET and say what holds it back.
  1. ceilings (images/s): storage (cold replay of the dataset's files, cross-checked with
     fio), decode (the pipeline on one core from memory x usable cores), demand (batch
     size / step time);
  2. an Optuna study (TPE, seeded): each trial is one `autotune bench` measurement
     (fresh process, cold cache) of num_workers, prefetch_factor, persistent_workers,
     pin_memory (where CUDA exists), batch size if the space asks; a configuration
     already measured is not measured again; a failed one is recorded with its reason;
     a trial whose running images/s falls under --prune-below (0.7) of the best so far
     is stopped after 40 % of its window and recorded as pruned (TPE learns from it);
  3. stops early when the best trial is within 3 % of the smallest ceiling;
  4. measures the --confirm fastest configurations, the cheapest near them and the
     baseline again in a longer window: the best of many short windows is flattered by
     its noise;
  5. recommends the knee (the cheapest confirmed configuration within 3 % of the best),
     names the bottleneck (storage, decode, compute, loader) with the figures, and measures the
     rule-of-thumb baseline (min(8, cores) workers, prefetch 2, pin, persistent).
The study lives in --out/study.db (SQLite) unless --storage gives an Optuna URL; rerun
with the same --study to resume. Writes --out/search.json and --out/report.html.""",
        epilog="examples:\n  autotune search /data/train\n"
               "  autotune search /data/train --compute-ms 150 --batch-size 64 --trials 30\n"
               "  autotune search /data/train --grid --space configs/search/small.yaml\n"
               "  autotune search /data/train --storage postgresql://host/db --study imagenet\n\n"
               + SEARCH_EXIT)
    p.add_argument("dataset", metavar="DATASET")
    p.add_argument("--preset", default="resnet50", help="workload preset (default resnet50)")
    p.add_argument("--space", metavar="FILE.yaml",
                   help="search space YAML (default configs/search/default.yaml; 'small' names "
                        "configs/search/small.yaml)")
    p.add_argument("--trials", type=pos_i("--trials"), default=20, metavar="N",
                   help="configurations to measure (default 20; duplicates are free)")
    p.add_argument("--timeout", type=pos_f("--timeout"), metavar="S", help="stop after S seconds")
    step = p.add_mutually_exclusive_group()
    step.add_argument("--compute-ms", type=nonneg_f("--compute-ms"), metavar="MS",
                      help="emulated step time per batch (default: the preset's)")
    step.add_argument("--step", metavar="MODULE:FUNCTION", help="a real step function")
    p.add_argument("--batch-size", type=pos_i("--batch-size"), metavar="N")
    p.add_argument("--seconds", type=pos_f("--seconds"), default=10.0, metavar="S",
                   help="measured window per trial (default 10)")
    p.add_argument("--study", metavar="NAME", help="study name (default: from dataset and preset)")
    p.add_argument("--storage", metavar="URL",
                   help="Optuna storage URL (default sqlite:///OUT/study.db)")
    p.add_argument("--grid", action="store_true", help="measure every configuration of the space "
                   "(whole windows: no pruning, no early stop)")
    prune = p.add_mutually_exclusive_group()
    prune.add_argument("--prune-below", type=_fraction, default=0.7, metavar="FRACTION",
                       help="stop a trial whose running images/s is under FRACTION of the best "
                            "trial's, after 40%% of its window (default 0.7)")
    prune.add_argument("--no-prune", action="store_true", help="measure every trial's whole window")
    p.add_argument("--confirm", type=nonneg_i("--confirm"), default=2, metavar="N",
                   help="measure the N fastest configurations again before naming one "
                        "(and the cheapest near them, and the baseline; default 2; 0: name it "
                        "from the trials)")
    p.add_argument("--confirm-seconds", type=pos_f("--confirm-seconds"), metavar="S",
                   help="confirmation window (default: twice --seconds; with an emulated "
                        "step longer for a deep prefetch queue, at most four times)")
    p.add_argument("--out", default="autotune-out", metavar="DIR",
                   help="directory for study.db, search.json, report.html (default autotune-out)")
    p.add_argument("--max-memory", metavar="SIZE",
                   help="reject configurations whose loader tree RSS + /dev/shm peak exceeds "
                        "SIZE (default half the machine's RAM)")
    p.add_argument("--warm", action="store_true", help="do not drop caches (labelled WARM)")
    p.add_argument("--no-probe", action="store_true", help="skip the storage probe (no storage ceiling)")
    p.add_argument("--no-fio", action="store_true", help="probe with the replay only")
    p.add_argument("--format", choices=registry.choices(), default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--convert", choices=CONVERT_MODES, default="off",
                   help="when the verdict is storage: convert (auto: WebDataset for slow, "
                        "network or throttled storage, LMDB for local flash), stage to "
                        "--stage-dir, search again and report before/after (default off)")
    p.add_argument("--stage-dir", metavar="DIR", help="local disk to stage the conversion to")
    p.add_argument("--convert-dir", metavar="DIR",
                   help="where to write the conversion (default OUT/converted-FORMAT)")
    p.add_argument("--json", metavar="FILE", help="also write the result JSON to FILE ('-' for stdout)")
    p.set_defaults(func=run_search_cmd)


def _fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prune-below must be a number, but got {text!r}.") from None
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"--prune-below must be in (0, 1], but got {v:g}.")
    return v


def run_search_cmd(args: argparse.Namespace) -> int:
    from autotune.cli import _emit as emit
    from autotune.cli import _progress as progress
    from autotune.search import SearchOptions, run_search
    from autotune.search.render import search_renderable
    from converters.units import parse_size

    max_mem = parse_size(args.max_memory, name="--max-memory") / 2**20 if args.max_memory else None
    opts = SearchOptions(preset=args.preset, space=args.space, trials=args.trials,
                         timeout_s=args.timeout, compute_ms=args.compute_ms, step=args.step,
                         batch_size=args.batch_size, seconds=args.seconds, study=args.study,
                         storage=args.storage, grid=args.grid, out=args.out,
                         max_memory_mib=max_mem, seed=args.seed, cold=not args.warm,
                         probe=not args.no_probe, probe_fio=not args.no_fio, format=args.format,
                         prune_below=None if args.no_prune else args.prune_below,
                         confirm=args.confirm, confirm_seconds=args.confirm_seconds)
    if args.convert != "off":
        from autotune.search.loop import run_loop

        with progress(not args.quiet) as prog:
            loop = run_loop(args.dataset, opts, convert=args.convert, stage_dir=args.stage_dir,
                            convert_dir=args.convert_dir, progress=prog)
        d = loop.to_dict()
        emit(args, d, loop_renderable(loop))
        return 0 if loop.before.recommended else 1
    with progress(not args.quiet) as prog:
        res = run_search(args.dataset, opts, progress=prog)
    d = res.to_dict()
    emit(args, d, search_renderable(d))
    if res.stop_reason.startswith("interrupted"):
        return 130
    return 0 if res.recommended else 1


def loop_renderable(loop):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from autotune.search.render import search_renderable

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
    parts.append(Text(f"decision: {loop.decision}"))
    for c in loop.commands:
        parts.append(Text(f"  $ {c}", style="dim"))
    return Group(*parts)


def add_stage_parser(sub: argparse._SubParsersAction) -> None:
    from autotune.cli import _positive_int
    p = sub.add_parser(
        "stage", help="copy a converted dataset to local disk, verified and atomic",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Copy SRC (a conversion with manifest.json, or any folder: a manifest is computed) to DST
on local disk. Free space is checked first. Each file goes to a temporary name inside
DST, is fsynced, read back from the disk and verified against the manifest's sha256
(--verify size: sizes only), then renamed; manifest.json is copied last, so its
presence means the staged copy is complete. A rerun skips files already verified; a
lock stops two stagers on one DST. --verify-only re-hashes DST and names corrupt files
(the next stage repairs them).""",
        epilog="examples:\n  autotune stage /nfs/imagenet-wds /local/nvme/imagenet-wds\n"
               "  autotune stage /nfs/ds /local/ds --verify-only\n\n" + STAGE_EXIT)
    p.add_argument("src", metavar="SRC")
    p.add_argument("dst", metavar="DST")
    p.add_argument("--workers", type=_positive_int("--workers"), default=4, metavar="N",
                   help="parallel copies (default 4)")
    p.add_argument("--verify", choices=("sha256", "size"), default="sha256")
    p.add_argument("--verify-only", action="store_true", help="only re-check DST against the manifest")
    p.add_argument("--probe", metavar="FILE",
                   help="`autotune probe --json` of the source: compare MB/s with its sequential figure")
    p.add_argument("--json", metavar="FILE", help="also write the result JSON to FILE ('-' for stdout)")
    p.set_defaults(func=run_stage_cmd)


def stage_renderable(d: dict):
    from rich.console import Group
    from rich.text import Text

    parts = []
    if d["verify_only"]:
        parts.append(Text(f"verified {d['files']} file(s) in {d['dst']}: "
                          f"{len(d['failures'])} bad", style="bold"))
    else:
        vs = f" ({d['vs_source_seq']:.0%} of the source's sequential read)" if d.get("vs_source_seq") else ""
        parts.append(Text(f"staged {d['src']} -> {d['dst']}: {d['copied']} copied, {d['skipped']} "
                          f"already verified, {d['bytes_copied'] / 2**20:,.1f} MiB in "
                          f"{d['seconds']:.1f} s = {d['mib_per_s']:,.1f} MiB/s{vs}; verify "
                          f"{d['verify']}", style="bold"))
    for f in d["failures"]:
        parts.append(Text(f"  {f['file']}: {f['reason']}", style="red"))
    if not d["verify_only"] and d["failures"]:
        parts.append(Text("partial: manifest.json not written; rerun `autotune stage` to resume",
                          style="yellow"))
    return Group(*parts)


def run_stage_cmd(args: argparse.Namespace) -> int:
    import json

    from autotune.cli import _emit as emit
    from autotune.cli import _progress as progress
    from converters.stage import stage, verify_staged

    if args.verify_only:
        res = verify_staged(args.dst, src=args.src)
    else:
        seq = None
        if args.probe:
            try:
                seq = json.loads(open(args.probe).read())["fio"]["seq_read"]["bw_mib_s"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise AutotuneError(f"{args.probe}: not an `autotune probe --json` result with "
                                    f"a fio sequential figure ({e}).") from e
        with progress(not args.quiet) as prog:
            res = stage(args.src, args.dst, workers=args.workers, verify=args.verify,
                        progress=(lambda done, total: prog(f"staging {done / 2**20:,.0f} of "
                                                           f"{total / 2**20:,.0f} MiB")) if prog else None,
                        source_seq_mib_s=seq)
    d = res.to_dict()
    emit(args, d, stage_renderable(d))
    return 4 if res.failures else 0

