"""The `autotune` command line: a thin layer that parses, calls the library, prints.

This is the only module that prints or exits. Library errors (AutotuneError) become one
line on stderr and a documented exit status; a traceback is shown only with --debug.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Iterator

from autotune import __version__
from autotune.errors import AutotuneError, GateFailed, UsageError

EXIT_CODES = """\
exit status:
  0    success
  1    error: a measurement or tool failed (the message says which and how to fix it)
  2    usage error: a bad option or argument
  3    gate failed: a measured figure is below --min-iops / --min-seq-mibps
  4    partial: some items failed and are named (stage); the rest is done; rerun to resume
  130  interrupted (Ctrl-C); 143 terminated (SIGTERM); scratch files are removed first
"""


class _Terminated(BaseException):
    """SIGTERM turned into an exception so that `finally` blocks clean up."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise _Terminated()


@contextmanager
def _progress(enabled: bool) -> Iterator[Callable[[str], None] | None]:
    """A spinner on stderr that shows the current step (only on a terminal)."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console

    console = Console(stderr=True)
    with console.status("starting") as status:
        yield lambda msg: status.update(msg)


def _positive_float(name: str) -> Callable[[str], float]:
    def conv(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, but got {s!r}.") from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be positive, but got {s}.")
        return v
    return conv


def _int_at_least(name: str, low: int) -> Callable[[str], int]:
    """argparse type: an integer >= low, refused in the words of the option."""
    def conv(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, but got {s!r}.") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"{name} must be at least {low}, but got {s}.")
        return v
    return conv


def _positive_int(name: str) -> Callable[[str], int]:
    return _int_at_least(name, 1)


def _nonneg_int(name: str) -> Callable[[str], int]:
    return _int_at_least(name, 0)


def _int_list(name: str) -> Callable[[str], list[int]]:
    def conv(s: str) -> list[int]:
        try:
            vals = [int(x) for x in s.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be comma-separated integers such as 1,4,16,64, but got {s!r}.") from None
        if not vals or min(vals) < 1:
            raise argparse.ArgumentTypeError(f"{name} values must be at least 1, but got {s!r}.")
        return vals
    return conv


def _emit(args: argparse.Namespace, data: dict, renderable: object) -> None:
    """Table to stdout (stderr when JSON goes to stdout); JSON to --json FILE or '-'."""
    from rich.console import Console

    from autotune import report

    json_to_stdout = getattr(args, "json", None) == "-"
    stream = sys.stderr if json_to_stdout else sys.stdout
    # Wide enough for the tables when piped to a file or CI log (rich defaults to 80).
    Console(file=stream, width=None if stream.isatty() else 110).print(renderable)
    if args.json == "-":
        sys.stdout.write(report.to_json(data))
    elif args.json:
        report.write_json_atomic(args.json, data)


# ------------------------------------------------------------------ probe

def _add_probe(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "probe", help="measure the storage under a dataset (fio + replay of its files)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Measure what the storage holding PATH can deliver to a data loader:
  1. fio (the real program) on a scratch file that autotune creates, fills with data and
     removes: sequential read (1 MiB, 4 jobs) and random read (4 KiB, iodepth 64, 4 jobs),
     direct I/O; each figure is cross-checked against the disk's own counters.
  2. a cold replay of up to --replay-files of the dataset's own files, read whole at
     concurrency 1, 4, 16 and 64: files/s, MiB/s, per-file latency (this is the storage
     ceiling `autotune search` uses).
  3. a classification of the storage (nvme, ssd, hdd, network, memory) with its evidence.
fio only ever touches the scratch file it created (it overwrites any file it is pointed
at). Cold reads need root for drop_caches; otherwise pages are evicted per file.""",
        epilog="examples:\n  autotune probe /data/imagenet/train\n"
               "  autotune probe /mnt/nfs/ds --runtime 5 --json probe.json\n"
               "  autotune probe /data --min-iops 50000   # CI gate: exit 3 when below\n\n"
               + EXIT_CODES)
    p.add_argument("path", metavar="PATH", help="dataset directory (or a file) on the storage to measure")
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON to FILE ('-' for stdout)")
    p.add_argument("--runtime", type=_positive_float("--runtime"), default=10.0, metavar="SECONDS",
                   help="seconds per fio job (default 10)")
    p.add_argument("--size", default="1G", metavar="SIZE",
                   help="fio scratch file size, e.g. 256M, 4G (default 1G; larger than the "
                        "device cache gives truer random figures)")
    p.add_argument("--scratch", metavar="DIR",
                   help="directory for fio's scratch file when PATH's filesystem is read-only "
                        "(pick one on the same storage)")
    p.add_argument("--replay-files", type=_positive_int("--replay-files"), default=2000, metavar="N",
                   help="files sampled for the replay (default 2000)")
    p.add_argument("--replay-seconds", type=_positive_float("--replay-seconds"), default=10.0,
                   metavar="S", help="time budget per replay concurrency level (default 10)")
    p.add_argument("--concurrency", type=_int_list("--concurrency"), default=[1, 4, 16, 64],
                   metavar="LIST", help="replay concurrency levels (default 1,4,16,64)")
    p.add_argument("--warm", action="store_true",
                   help="do not drop the page cache before the replay (labelled warm)")
    p.add_argument("--no-fio", action="store_true", help="skip fio (replay only)")
    p.add_argument("--no-replay", action="store_true", help="skip the dataset replay (fio only)")
    p.add_argument("--seed", type=int, default=0, help="seed of the file sample (default 0)")
    p.add_argument("--min-iops", type=float, metavar="N",
                   help="gate: exit 3 when fio's random-read IOPS is below N (or not measured); "
                        "small-file image training wants > 50000")
    p.add_argument("--min-seq-mibps", type=float, metavar="N",
                   help="gate: exit 3 when fio's sequential read MiB/s is below N (or not measured)")
    p.set_defaults(func=_cmd_probe)


def _cmd_probe(args: argparse.Namespace) -> int:
    from autotune import report
    from autotune.probe import probe
    from converters.units import parse_size

    size = parse_size(args.size, name="--size")
    with _progress(not args.quiet) as prog:
        res = probe(args.path, size=size, runtime=args.runtime, scratch=args.scratch,
                    replay_files=args.replay_files, concurrency=args.concurrency,
                    replay_seconds=args.replay_seconds, run_fio=not args.no_fio,
                    run_replay=not args.no_replay, cold=not args.warm, seed=args.seed,
                    progress=prog)
    _emit(args, res.to_dict(), report.probe_renderable(res))
    failed = []
    for flag, threshold, job, attr, unit in (
            ("--min-iops", args.min_iops, "rand_read", "iops", "random-read IOPS"),
            ("--min-seq-mibps", args.min_seq_mibps, "seq_read", "bw_mib_s", "sequential MiB/s")):
        if threshold is None:
            continue
        if res.fio is None:
            failed.append(f"{flag} {threshold:g}: {unit} not measured ({res.fio_error})")
            continue
        # Each gate on its own job's figure, and only on one the storage itself served
        # (cross-checked against the disk's counters, not RAM, not the page cache).
        j = getattr(res.fio, job)
        if not j.plausible:
            failed.append(f"{flag} {threshold:g}: {unit} not the storage's figure "
                          f"({' '.join(j.warnings) or 'failed the plausibility check'})")
            continue
        value = getattr(j, attr)
        if value < threshold:
            failed.append(f"{flag} {threshold:g}: measured {value:,.0f} {unit} on {res.path}")
    if failed:
        raise GateFailed("gate failed: " + "; ".join(failed))
    return 0


# ------------------------------------------------------------------ bench

def _nonneg_float(name: str) -> Callable[[str], float]:
    def conv(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, but got {s!r}.") from None
        if not v >= 0 or v == float("inf"):
            raise argparse.ArgumentTypeError(f"{name} must be a number >= 0, but got {s}.")
        return v
    return conv


BENCH_EXIT_CODES = """\
exit status:
  0    the configuration was measured
  1    the measurement failed (crashed or hung worker, full /dev/shm, too many open
       files, OOM, timeout, too small a dataset): the table and JSON carry the reason
       and a hint, and no process of the measurement is left running
  2    usage error: a bad option, preset or dataset
  130  interrupted (Ctrl-C); 143 terminated (SIGTERM); the measurement is killed first
"""


def _add_bench(sub: argparse._SubParsersAction) -> None:
    from autotune.data.presets import list_presets
    from converters import registry

    presets = ", ".join(list_presets()) or "none found"
    p = sub.add_parser(
        "bench", help="measure one DataLoader configuration (fresh process, cold cache)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=f"""\
Measure what one DataLoader configuration delivers to a training step, honestly:
  - in a fresh process (hard --timeout; the whole process group, workers included, is
    killed and checked afterwards), so one configuration cannot poison the next;
  - cold: the dataset's pages are dropped first (drop_caches as root, else
    posix_fadvise per file); --warm skips that and every output says WARM. A cold run
    stops at the end of its first pass over the dataset (a second pass would come from
    the page cache) and says when the window was shortened;
  - the loop times next(loader_iter) as data wait, then the step: an emulated step
    holds each batch for --compute-ms (a sleep: the accelerator is busy, the CPU stays
    free for the workers), or --step calls your function with (images, labels);
  - warm-up batches are excluded (default: max(5, workers x prefetch), every batch the
    loader requests at start); the window is split in 5 and images/s is the median;
  - disk, CPU, process tree, /dev/shm and GPU are sampled from this process.

Definitions:
  images/s            samples delivered to the step per second (median of the windows)
  data-wait fraction  time blocked in next() / wall time of the window
  AU                  time in the step / wall time (MLPerf Storage); input-bound < 0.90

Pipeline: read bytes, PIL decode, RGB, resize shorter side 256, crop 224 (random +
flip for training presets), uint8 CHW tensor. Presets ({presets}) in
configs/presets/*.yaml set batch size, step time, transform and loader defaults;
options override them.""",
        epilog="examples:\n"
               "  autotune bench /data/train                        # resnet50 preset, cold\n"
               "  autotune bench /data/train --workers 8 --prefetch-factor 4\n"
               "  autotune bench /data/train --preset decode-only --warm   # CPU ceiling\n"
               "  autotune bench /data/train --step mytrain:step --json bench.json\n"
               "  autotune bench /data/train --timeline samples.jsonl --json -\n\n"
               + BENCH_EXIT_CODES)
    p.add_argument("dataset", metavar="DATASET", help="image folder (DATASET/CLASS/IMAGE.jpg)")
    p.add_argument("--preset", default="resnet50", metavar="NAME",
                   help=f"workload preset: {presets}, or a YAML file (default resnet50)")
    p.add_argument("--format", choices=registry.choices(), default="auto",
                   help="dataset format (default auto: manifest.json's, else folder; lmdb "
                        "and wds read a conversion written by `autotune convert`)")
    p.add_argument("--workers", type=_nonneg_int("--workers"), metavar="N",
                   help="DataLoader num_workers (0 = load in the main process)")
    p.add_argument("--prefetch-factor", type=_positive_int("--prefetch-factor"), metavar="N",
                   help="batches each worker loads ahead (only with --workers > 0)")
    p.add_argument("--batch-size", type=_positive_int("--batch-size"), metavar="N")
    p.add_argument("--pin-memory", action=argparse.BooleanOptionalAction, default=None,
                   help="DataLoader pin_memory (no effect without CUDA: the result says so)")
    p.add_argument("--persistent-workers", action=argparse.BooleanOptionalAction, default=None,
                   help="keep workers between epochs (only with --workers > 0)")
    step = p.add_mutually_exclusive_group()
    step.add_argument("--compute-ms", type=_nonneg_float("--compute-ms"), metavar="MS",
                      help="emulated step: hold each batch MS milliseconds (0 = no step)")
    step.add_argument("--step", metavar="MODULE:FUNCTION",
                      help="call FUNCTION(batch) as the step; batch = (images uint8 [B,3,H,W], "
                           "labels [B]); also path/to/file.py:function")
    p.add_argument("--seconds", type=_positive_float("--seconds"), default=20.0, metavar="S",
                   help="measured window after warm-up (default 20)")
    p.add_argument("--warmup-batches", type=_nonneg_int("--warmup-batches"), metavar="N",
                   help="batches excluded at start (default max(5, workers x prefetch))")
    cache = p.add_mutually_exclusive_group()
    cache.add_argument("--cold", dest="cold", action="store_true", default=True,
                       help="drop the dataset's pages first (default)")
    cache.add_argument("--warm", dest="cold", action="store_false",
                       help="leave the page cache as it is (labelled WARM everywhere)")
    p.add_argument("--timeout", type=_positive_float("--timeout"), metavar="S",
                   help="hard limit for the whole measurement (default 2 x --seconds + 180)")
    p.add_argument("--batch-timeout", type=_positive_float("--batch-timeout"), default=120.0,
                   metavar="S", help="DataLoader timeout: fail when no batch arrives for S "
                                     "seconds (default 120)")
    p.add_argument("--in-memory", type=_positive_int("--in-memory"), metavar="N",
                   help="hold N images (a random subset) in memory and decode from there: "
                        "the CPU ceiling, labelled FROM MEMORY (implies --warm)")
    p.add_argument("--jpeg-draft", action="store_true",
                   help="let libjpeg decode at reduced scale (PIL draft mode): cheaper decode, "
                        "not what torchvision does; labelled in every output")
    p.add_argument("--max-open-files", type=_positive_int("--max-open-files"), metavar="N",
                   help="RLIMIT_NOFILE for the measurement (reproduce a cluster's ulimit -n)")
    p.add_argument("--seed", type=int, default=0, help="shuffle and augmentation seed (default 0)")
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON to FILE ('-' for stdout)")
    p.add_argument("--timeline", metavar="FILE",
                   help="write every monitor sample (JSONL, with its phase) to FILE")
    p.set_defaults(func=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    from autotune import report
    from autotune.bench import BenchConfig, run_bench

    if args.prefetch_factor is not None and args.workers == 0:
        raise UsageError(f"--prefetch-factor {args.prefetch_factor} needs --workers > 0: with 0 "
                         "workers the main process loads each batch when asked and nothing is "
                         "prefetched.")
    if args.persistent_workers and args.workers == 0:
        raise UsageError("--persistent-workers needs --workers > 0 (there is no worker to keep).")
    cfg = BenchConfig.from_preset(
        args.preset, num_workers=args.workers, prefetch_factor=args.prefetch_factor,
        batch_size=args.batch_size, pin_memory=args.pin_memory,
        persistent_workers=args.persistent_workers, compute_ms=args.compute_ms, step=args.step,
        seconds=args.seconds, warmup_batches=args.warmup_batches,
        format=args.format, timeout_s=args.timeout, batch_timeout_s=args.batch_timeout,
        max_open_files=args.max_open_files, seed=args.seed, in_memory=args.in_memory,
        cold=False if args.in_memory else args.cold)
    if args.jpeg_draft:
        from dataclasses import replace

        cfg.transform = replace(cfg.transform, draft=True)
    with _progress(not args.quiet) as prog:
        res = run_bench(args.dataset, cfg, timeline=args.timeline, progress=prog)
    _emit(args, res.to_dict(), report.bench_renderable(res))
    return 1 if res.failed else 0


# ------------------------------------------------------------------ main

_AFTER_STOP = {
    "probe": "scratch files removed",
    "bench": "the measurement and its workers were killed",
    "search": "measured trials are kept in the study; rerun to resume",
    "convert": "finished shards are kept; rerun the same command to resume",
    "stage": "verified files are kept; rerun to resume",
}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="autotune", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Find what holds a PyTorch input pipeline back (storage, CPU decode, "
                    "DataLoader settings, or the training step) with measurements.",
        epilog="Run `autotune COMMAND --help` for each command.\n\n" + EXIT_CODES)
    ap.add_argument("--version", action="version", version=f"autotune {__version__}")
    ap.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_probe(sub)
    _add_bench(sub)
    from autotune import cli_analyze, cli_convert, cli_search

    cli_search.add_search_parser(sub)
    cli_convert.add_parser(sub)
    cli_search.add_stage_parser(sub)
    cli_analyze.add_monitor_parser(sub)
    cli_analyze.add_analyze_parser(sub)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    debug = args.debug
    old = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return int(args.func(args) or 0)
    except AutotuneError as e:
        if debug:
            raise
        print(f"autotune {args.command}: {'error: ' if e.exit_code != 3 else ''}{e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"autotune {args.command}: interrupted; {_AFTER_STOP.get(args.command, 'nothing partial was left')}",
              file=sys.stderr)
        return 130
    except _Terminated:
        print(f"autotune {args.command}: terminated; {_AFTER_STOP.get(args.command, 'nothing partial was left')}",
              file=sys.stderr)
        return 143
    except BrokenPipeError:
        return 1
    except Exception as e:  # a bug: say so in one line; the traceback is one flag away
        if debug:
            raise
        print(f"autotune {args.command}: internal error: {type(e).__name__}: {e} "
              "(rerun with --debug for the traceback)", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, old)


if __name__ == "__main__":
    raise SystemExit(main())
