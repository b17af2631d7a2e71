"""`autotune bench DATASET`: one DataLoader configuration, measured honestly."""

from __future__ import annotations

import argparse

from autotune.cli import exits
from autotune.cli._base import Command, emit, spinner
from autotune.cli.args import (add_delayacct, add_endpoint, add_json, add_max_open_files,
                               add_read_format, add_seed, add_step, add_window,
                               apply_endpoint, int_at_least, nonneg_int, positive_float,
                               positive_int)

EXIT = exits.help_block("bench")


class Bench(Command):
    name = "bench"
    help = "measure one DataLoader configuration (fresh process, cold cache)"
    epilog = ("examples:\n"
              "  autotune bench /data/train                        # resnet50 preset, cold\n"
              "  autotune bench /data/train --workers 8 --prefetch-factor 4\n"
              "  autotune bench /data/train --preset decode-only --warm   # CPU ceiling\n"
              "  autotune bench /data/train --step mytrain:step --json bench.json\n"
              "  autotune bench /data/train --timeline samples.jsonl --json -\n\n" + EXIT)
    after_stop = "the measurement and its workers were killed"
    settings = {"num_workers": "--workers", "timeout_s": "--timeout",
                "batch_timeout_s": "--batch-timeout", "warmup_batches": "--warmup-batches",
                "cold": "--warm"}

    @property
    def description(self) -> str:  # type: ignore[override]
        from autotune.data.presets import list_presets

        presets = ", ".join(list_presets()) or "none found"
        return f"""\
Measure what one DataLoader configuration delivers to a training step, honestly:
  - in a fresh process (hard --timeout; the whole process group, workers included, is
    killed and checked afterwards), so one configuration cannot poison the next;
  - cold: the dataset's pages are dropped first (drop_caches as root, else
    posix_fadvise per file); --warm skips that and every output says WARM. A cold run
    stops at the end of its first pass over the dataset (a second pass would come from
    the page cache) and says when the window was shortened;
  - the loop times next(loader_iter) as data wait, then the step: an emulated step
    holds each batch for --compute-ms (a sleep: the accelerator is busy, the CPU stays
    free for the workers), or --step calls your function with the batch, one argument (the
    default pipeline's is (images float32 [B,3,H,W], labels [B]));
  - warm-up batches are excluded (default: max(5, workers x prefetch), every batch the
    loader requests at start); images/s is the whole window's samples / its seconds
    (its 5 sub-windows' spread is shown beside it as a stability figure);
  - disk, CPU, process tree, /dev/shm and GPU are sampled from this process.

Definitions:
  images/s            samples delivered to the step in the window / its seconds
  data-wait fraction  time blocked in next() / wall time of the window
  AU                  time in the step / wall time (MLPerf Storage); input-bound < 0.90

Pipeline (resnet50 preset): torchvision's ImageNet training transform, step for step:
RandomResizedCrop(224), RandomHorizontalFlip, float32 scaled and normalised, CHW (the
resnet50-fast preset: the same with libjpeg-turbo/draft decoding, labelled FAST). Presets ({presets}) in
configs/presets/*.yaml set batch size, step time, transform and loader defaults;
options override them."""

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        from autotune.data.presets import list_presets

        presets = ", ".join(list_presets()) or "none found"
        p.add_argument("dataset", metavar="DATASET", help="image folder (DATASET/CLASS/IMAGE.jpg), a conversion, or s3://BUCKET/PREFIX")
        add_endpoint(p)
        p.add_argument("--preset", default="resnet50", metavar="NAME",
                       help=f"workload preset: {presets}, or a YAML file (default resnet50)")
        add_read_format(p)
        add_loader_options(p)
        add_job_options(p)
        add_step(p, compute_help="emulated step: hold each batch MS milliseconds (0 = no step)",
                 step_help="call FUNCTION(batch) as the step; batch = (images float32 "
                           "[B,3,H,W], labels [B]); also MODULE:FUNCTION")
        add_window(p, 20, what="measured window after warm-up")
        p.add_argument("--warmup-batches", type=nonneg_int("--warmup-batches"), metavar="N",
                       help="batches excluded at start (default max(5, workers x prefetch))")
        cache = p.add_mutually_exclusive_group()
        cache.add_argument("--cold", dest="cold", action="store_true", default=True,
                           help="drop the dataset's pages first (default)")
        cache.add_argument("--warm", dest="cold", action="store_false",
                           help="leave the page cache as it is (labelled WARM everywhere)")
        p.add_argument("--timeout", type=positive_float("--timeout"), metavar="S",
                       help="hard limit for the whole measurement (default 2 x --seconds + 180)")
        p.add_argument("--batch-timeout", type=positive_float("--batch-timeout"), default=120.0,
                       metavar="S", help="DataLoader timeout: fail when no batch arrives for "
                                         "S seconds (default 120)")
        p.add_argument("--in-memory", type=positive_int("--in-memory"), metavar="N",
                       help="hold N images (a random subset) in memory and decode from there: "
                            "the CPU ceiling, labelled FROM MEMORY (implies --warm)")
        p.add_argument("--jpeg-draft", action="store_true",
                       help="let libjpeg decode at reduced scale (PIL draft mode): cheaper "
                            "decode, not what torchvision does; labelled in every output")
        add_max_open_files(p)
        add_seed(p, "the shuffle and the augmentation")
        add_json(p)
        p.add_argument("--timeline", metavar="FILE",
                       help="write every monitor sample (JSONL, with its phase) to FILE")
        add_delayacct(p)

    def run(self, args: argparse.Namespace) -> int:
        apply_endpoint(args)
        from autotune.bench import BenchConfig, run_bench
        from autotune.cli.tables.bench import bench_renderable

        from autotune.search.study import procs_per_node

        cfg = BenchConfig.from_preset(
            args.preset, **loader_settings(args), dataset_factory=args.dataset_factory,
            procs_per_node=procs_per_node(args.procs_per_node),
            compute_ms=args.compute_ms, step=args.step, seconds=args.seconds,
            warmup_batches=args.warmup_batches, format=args.format, timeout_s=args.timeout,
            batch_timeout_s=args.batch_timeout, max_open_files=args.max_open_files,
            seed=args.seed, in_memory=args.in_memory,
            cold=False if args.in_memory else args.cold)
        if args.jpeg_draft:
            from dataclasses import replace

            cfg.transform = replace(cfg.transform, draft=True)
        from autotune.environment import read_environment
        from autotune.monitor.delayacct import hold_if

        # Read once, by this command (the measurement runs in a child process of its own).
        env = read_environment(args.dataset, runs_fio=False)
        from autotune.bench.refusal import refusal

        with hold_if(args.delayacct), spinner(not args.quiet) as prog:
            # A configuration whose batches cannot fit in /dev/shm, or that no worker could
            # send, is refused before any process starts (exit 1, the figures and the
            # fix), not left to die or hang.
            res = refusal(args.dataset, cfg, env=env)
            if res is None:
                res = run_bench(args.dataset, cfg, timeline=args.timeline, progress=prog)
        res.environment = {**res.environment, **env.to_dict()}
        if res.failure_kind == "step_import":   # the user's --step: a usage error, exit 2
            from autotune.errors import UsageError

            raise UsageError(f"{res.reason}; {res.hint}.", setting="step")
        emit(args, res.to_dict(), bench_renderable(res))
        return 1 if res.failed else 0


def add_job_options(p: argparse.ArgumentParser) -> None:
    """The user's own job: their Dataset and their ranks on the node."""
    p.add_argument("--dataset-factory", metavar="FILE.py:FUNCTION",
                   help="your own Dataset: FUNCTION(DATASET) returns a torch Dataset or "
                        "IterableDataset, or a dict with 'dataset' and optionally "
                        "'collate_fn', 'sampler', 'worker_init_fn'; called in each "
                        "measurement process (also MODULE:FUNCTION)")
    p.add_argument("--procs-per-node", type=positive_int("--procs-per-node"), metavar="N",
                   help="ranks on this node, as DDP runs them: N processes, each with its own "
                        "DataLoader over its share of the samples (default LOCAL_WORLD_SIZE, "
                        "else 1); --workers is per rank")


def add_loader_options(p: argparse.ArgumentParser) -> None:
    """One option per DataLoader setting of the search's parameter registry."""
    from autotune.params import PARAMS

    for prm in PARAMS.values():
        if prm.kind is bool:
            p.add_argument(prm.flag, action=argparse.BooleanOptionalAction, default=None,
                           help=prm.help)
        else:
            p.add_argument(prm.flag, type=int_at_least(prm.flag, prm.minimum), metavar="N",
                           help=prm.help)


def loader_settings(args: argparse.Namespace) -> dict[str, object]:
    """The DataLoader settings given on the command line (None: the preset's)."""
    from autotune.params import PARAMS

    return {name: getattr(args, prm.dest) for name, prm in PARAMS.items()}
