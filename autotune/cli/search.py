"""`autotune search DATASET`: the best DataLoader settings (Optuna), the bottleneck, a report;
with --convert, the closed loop (convert, stage, search again)."""

from __future__ import annotations

import argparse

from autotune.cli import exits
from autotune.cli._base import Command, emit, spinner
from autotune.cli.args import (
    add_delayacct,
    add_endpoint,
    add_json,
    add_max_open_files,
    add_read_format,
    add_seed,
    add_step,
    add_window,
    apply_endpoint,
    fraction,
    int_at_least,
    nonneg_int,
    positive_float,
    positive_int,
)

EXIT = exits.help_block("search")


class Search(Command):
    name = "search"
    help = "find the best DataLoader settings (Optuna), the bottleneck and a report"
    description = """\
Search DataLoader settings for DATASET and say what holds it back.
  1. ceilings (images/s): storage (cold replay of the dataset's files, cross-checked with
     fio), decode (the pipeline on one core from memory x usable cores), demand (batch
     size / step time);
  2. an Optuna study (TPE, seeded): each trial is one `autotune bench` measurement
     (fresh process, forked from one that has imported torch; cold cache) of
     num_workers, prefetch_factor, persistent_workers, pin_memory (where CUDA
     exists), batch size if the space asks; a configuration
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
with the same --study to resume. Writes --out/search.json and --out/report.html."""
    epilog = ("examples:\n  autotune search /data/train\n"
               "  autotune search /data/train --compute-ms 150 --batch-size 64 --trials 30\n"
               "  autotune search /data/train --grid --space configs/search/small.yaml\n"
               "  autotune search /data/train --storage postgresql://tuner@db-host/optuna "
               "--study imagenet   # on each host\n"
               "  autotune search /data/train --storage journal:/nfs/studies/imagenet.log "
               "--study imagenet\n\n"
              + EXIT)
    after_stop = "measured trials are kept in the study; rerun to resume"
    settings = {"timeout_s": "--timeout", "max_memory_mib": "--max-memory",
                "prune_below": "--prune-below", "confirm_seconds": "--confirm-seconds"}

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        # One helper per part of the help, in the order the help lists them.
        _add_workload(p)
        _add_study_options(p)
        _add_measurement_options(p)
        _add_loop_options(p)
        add_json(p)
        add_delayacct(p)

    def run(self, args: argparse.Namespace) -> int:
        apply_endpoint(args)
        from autotune.monitor.delayacct import hold_if

        with hold_if(args.delayacct):
            return self._run(args)

    def _run(self, args: argparse.Namespace) -> int:
        from autotune.cli.tables.search import loop_renderable, search_renderable
        from autotune.search import SearchOptions, run_search
        from autotune_base.units import parse_size

        max_mem = parse_size(args.max_memory, name="--max-memory") / 2**20 if args.max_memory else None
        if max_mem is not None and max_mem < 64:
            # A bare number is bytes: `--max-memory 600` meant 600 MiB, and every trial ran
            # to its end only to be rejected (a loader with torch is hundreds of MiB).
            from autotune.errors import UsageError
            raise UsageError(
                f"--max-memory {args.max_memory} is {max_mem * 2**20:,.0f} bytes, less than one "
                "process with torch takes, so every configuration would be measured and "
                f"rejected; give a unit: --max-memory {args.max_memory.strip()}M for MiB, or "
                "1.5G.")
        opts = SearchOptions(preset=args.preset, space=args.space, trials=args.trials,
                             timeout_s=args.timeout, compute_ms=args.compute_ms, step=args.step,
                             batch_size=args.batch_size, seconds=args.seconds, study=args.study,
                             storage=args.storage, grid=args.grid, out=args.out,
                             max_memory_mib=max_mem, max_open_files=args.max_open_files,
                             scratch=args.scratch, seed=args.seed,
                             cold=not args.warm,
                             probe=not args.no_probe, probe_fio=not args.no_fio, format=args.format,
                             prune_below=None if args.no_prune else args.prune_below,
                             confirm=args.confirm, confirm_seconds=args.confirm_seconds,
                             dataset_factory=args.dataset_factory,
                             procs_per_node=args.procs_per_node,
                             heartbeat_grace=args.heartbeat_grace,
                             whole_run=not args.first_epoch_only, epochs=args.epochs)
        if args.convert != "off":
            from autotune.search.loop import run_loop

            with spinner(not args.quiet) as prog:
                loop = run_loop(args.dataset, opts, convert=args.convert, stage_dir=args.stage_dir,
                                convert_dir=args.convert_dir, progress=prog,
                                epochs=args.epochs)
            d = loop.to_dict()
            emit(args, d, loop_renderable(loop))
            return 0 if loop.before.recommended else 1
        with spinner(not args.quiet) as prog:
            res = run_search(args.dataset, opts, progress=prog)
        d = res.to_dict()
        emit(args, d, search_renderable(d))
        if res.stop_reason.startswith("interrupted"):
            return 130
        return 0 if res.recommended else 1


def _add_workload(p: argparse.ArgumentParser) -> None:
    """The dataset, the workload and the search's size: what each trial measures."""
    from autotune.cli.bench import add_job_options

    p.add_argument("dataset", metavar="DATASET",
                   help="image folder (DATASET/CLASS/IMAGE.jpg), a conversion, or "
                        "s3://BUCKET/PREFIX")
    add_endpoint(p)
    p.add_argument("--preset", default="resnet50", help="workload preset (default resnet50)")
    p.add_argument("--space", metavar="FILE.yaml",
                   help="search space YAML (default configs/search/default.yaml; 'small' names "
                        "configs/search/small.yaml)")
    p.add_argument("--trials", type=positive_int("--trials"), default=20, metavar="N",
                   help="configurations to measure (default 20; duplicates are free)")
    p.add_argument("--timeout", type=positive_float("--timeout"), metavar="S", help="stop after S seconds")
    add_step(p, compute_help="emulated step time per batch (default: the preset's)",
             step_help="a real step: FUNCTION(batch), as bench --step; also MODULE:FUNCTION")
    add_job_options(p)
    p.add_argument("--batch-size", type=positive_int("--batch-size"), metavar="N",
                   help="your training's batch size: every trial measures it (default: the "
                        "preset's, unless the space searches it); the step time is per batch")
    add_window(p, 10, what="measured window per trial")


def _add_study_options(p: argparse.ArgumentParser) -> None:
    """The Optuna study: its name and storage (shared by hosts), pruning, confirmation."""
    p.add_argument("--study", metavar="NAME", help="study name (default: from dataset and preset)")
    p.add_argument("--storage", metavar="URL",
                   help="Optuna storage (default sqlite:///OUT/study.db); hosts share one "
                        "study with postgresql://USER@HOST[:PORT]/DB (password from "
                        "PGPASSWORD or ~/.pgpass; ?sslmode=... as in libpq) or "
                        "journal:PATH on a shared filesystem")
    p.add_argument("--heartbeat-grace", type=int_at_least("--heartbeat-grace", 2),
                   default=60, metavar="S",
                   help="shared study: a host silent for S seconds has its running trial "
                        "marked interrupted and measured again by the next host (default 60)")
    p.add_argument("--grid", action="store_true", help="measure every configuration of the space "
                   "(whole windows: no pruning, no early stop)")
    prune = p.add_mutually_exclusive_group()
    prune.add_argument("--prune-below", type=fraction("--prune-below"), default=0.7, metavar="FRACTION",
                       help="stop a trial whose running images/s is under FRACTION of the best "
                            "trial's, after 40%% of its window (default 0.7)")
    prune.add_argument("--no-prune", action="store_true", help="measure every trial's whole window")
    p.add_argument("--confirm", type=nonneg_int("--confirm"), default=2, metavar="N",
                   help="measure the N fastest configurations again before naming one "
                        "(and the cheapest near them, and the baseline; default 2; 0: name it "
                        "from the trials)")
    p.add_argument("--confirm-seconds", type=positive_float("--confirm-seconds"), metavar="S",
                   help="confirmation window (default: twice --seconds; with an emulated "
                        "step longer for a deep prefetch queue, at most four times)")


def _add_measurement_options(p: argparse.ArgumentParser) -> None:
    """Where the outputs go and how each trial is measured (memory bound, cache, probe)."""
    p.add_argument("--out", default="autotune-out", metavar="DIR",
                   help="directory for study.db, search.json, report.html (default autotune-out)")
    p.add_argument("--max-memory", metavar="SIZE",
                   help="reject configurations whose loader tree PSS (forked workers' shared "
                        "pages once, as the cgroup charges them) + /dev/shm peak exceeds "
                        "SIZE (default half the job's memory: its cgroup's limit where one "
                        "is set, else the machine's RAM; the header names the source)")
    add_max_open_files(p, each_trial=True)
    p.add_argument("--scratch", metavar="DIR",
                   help="directory for the storage probe's fio scratch file when the "
                        "dataset's filesystem is read-only (pick one on the same storage)")
    p.add_argument("--warm", action="store_true", help="do not drop caches (labelled WARM)")
    p.add_argument("--no-probe", action="store_true", help="skip the storage probe (no storage ceiling)")
    p.add_argument("--no-fio", action="store_true", help="probe with the replay only")
    add_read_format(p)
    add_seed(p, "the search's sampler, each trial's shuffle and the ceilings' image sample")


def _add_loop_options(p: argparse.ArgumentParser) -> None:
    """The closed loop (--convert) and the whole run it is judged on (--epochs)."""
    from autotune.search.loop import CONVERT_MODES

    p.add_argument("--convert", choices=CONVERT_MODES, default="off",
                   help="when the verdict is storage: convert (auto: WebDataset for slow, "
                        "network or throttled storage, LMDB for local flash), stage to "
                        "--stage-dir, search again and report before/after (default off)")
    p.add_argument("--epochs", type=positive_int("--epochs"), metavar="N",
                   help="the run's epochs: with --convert, convert only where the run's "
                        "projected time (first epoch cold, later epochs from the page cache "
                        "or at the measured hit rate, against the conversion's cost) is "
                        "shorter, and say why either way (default: convert whenever storage "
                        "limits the first epoch)")
    p.add_argument("--first-epoch-only", action="store_true",
                   help="measure the first (cold) epoch only: no warm trial, no page-cache "
                        "hit rate; the verdict then says nothing about later epochs")
    p.add_argument("--stage-dir", metavar="DIR", help="local disk to stage the conversion to (into DIR/NAME, NAME the conversion folder's: converted-FORMAT by default)")
    p.add_argument("--convert-dir", metavar="DIR",
                   help="where to write the conversion (default OUT/converted-FORMAT)")
