"""`autotune monitor -- CMD` (run a training command while sampling disk, CPU and GPU) and
`autotune analyze LOG` (its log, joined with those metrics, diagnosed)."""

from __future__ import annotations

import argparse
import sys
import time

from autotune.cli import exits
from autotune.cli._base import Command, console, emit
from autotune.cli.args import (add_delayacct, add_json, nonneg_int, positive_float,
                               positive_int)

MONITOR_EXIT = exits.help_block("monitor")

ANALYZE_EXIT = exits.help_block("analyze")


class Monitor(Command):
    name = "monitor"
    help = "run a training command while sampling disk/CPU/GPU; keep its log"
    description = """\
Run a training command and watch what the machine does meanwhile:
  - its stdout and stderr go to your terminal and to OUT/train.log (with OUT/train.log.times:
    when each line was printed, so logs without timestamps can be joined with metrics);
  - every --interval seconds the disk behind --data (iostat -x figures), each CPU core,
    the command's process tree (DataLoader workers included), /dev/shm and the GPUs (NVML)
    are sampled to OUT/metrics.jsonl;
  - a loader wrapped with autotune.instrument(loader) writes its steps to OUT/steps.jsonl
    (the monitor sets AUTOTUNE_STEPS_LOG);
  - Ctrl-C and SIGTERM are forwarded to the command; the monitor exits with its status
    and then prints the analysis of the run (`autotune analyze OUT`)."""
    epilog = ("examples:\n"
               "  autotune monitor --data /data/imagenet -- python main.py /data/imagenet -j 8\n"
               "  autotune monitor --out run1 --interval 1 -- torchrun --nproc-per-node 8 train.py\n"
               "  autotune analyze run1 --probe probe.json\n\n"
              + MONITOR_EXIT)
    after_stop = "the command was stopped; its log and metrics are kept"
    settings = {"out_dir": "--out"}

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--out", metavar="DIR",
                       help="output directory (default monitor-YYYYmmdd-HHMMSS in the current one)")
        p.add_argument("--interval", type=positive_float("--interval"), default=0.5, metavar="S",
                       help="seconds between samples (default 0.5)")
        p.add_argument("--data", metavar="PATH",
                       help="the dataset directory: its disk is watched (default: the current "
                            "directory's disk)")
        p.add_argument("--no-gpu", action="store_true", help="do not sample NVML")
        add_delayacct(p)
        p.add_argument("--no-analysis", action="store_true",
                       help="do not print the analysis at the end")
        add_json(p, "the analysis at the end", moved="the table and the command's own output")
        _add_analysis_options(p)
        p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...",
                       help="the training command and its arguments")

    def run(self, args: argparse.Namespace) -> int:
        return _run_monitor(args)


class Analyze(Command):
    name = "analyze"
    help = "parse a training log, join it with metrics, diagnose"
    description = """\
Read the step timings of a training log and say what holds the job back:
  formats: autotune.instrument() JSONL (own), timm, pytorch/examples ImageNet (imagenet),
  torchvision MetricLogger and DeiT/DINO/MAE (metriclogger), semseg-style (semseg),
  mmengine, mmcv, detectron2, yolox, lerobot, HuggingFace Trainer (hf_trainer: no data
  time), Lightning SimpleProfiler (lightning), or --regex FILE; detected when not given;
  a 10 GB log is streamed, gzip or standard input ('-'); unparseable lines are counted by
  reason, not fatal.
Figures (warm-up left out): data-time share, AU = step / wall time (input-bound below
90 %), step time p50/p95, images/s, and the trend (growth after the first epoch, spikes
at epoch starts, drift, stalls). With --metrics (the monitor's metrics.jsonl) they are
joined by time with GPU utilization, per-core CPU, the job's process tree and the disk's
%util, r_await and r/s; with --probe, the read rate is compared with the storage ceiling.
Verdict: storage, decode, loader (configuration), compute (healthy) or unknown, with the
evidence and the next command to run.
LOG may be the directory `autotune monitor --out` wrote."""
    epilog = ("examples:\n"
               "  autotune analyze monitor-20240501-120000\n"
               "  autotune analyze train.log --metrics metrics.jsonl --batch-size 256\n"
               "  autotune analyze timm.log --probe probe.json --json analysis.json\n"
               "  autotune analyze my.log --regex myformat.yaml\n\n"
              + ANALYZE_EXIT)

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("log", metavar="LOG", help="training log ('-' for standard input; gzip "
                       "allowed) or an `autotune monitor` output dir")
        p.add_argument("--metrics", metavar="FILE", help="metrics.jsonl of `autotune monitor`")
        add_json(p, "the analysis")
        _add_analysis_options(p)

    def run(self, args: argparse.Namespace) -> int:
        """Print the analysis (and write --json); 0 whatever the verdict."""
        from autotune.analyze import analyze

        a = analyze(args.log, metrics=args.metrics, **_analyze_kwargs(args))
        _emit_analysis(args, a)
        return 0


def _add_analysis_options(p: argparse.ArgumentParser) -> None:
    from autotune.analyze.parsers import FORMATS

    p.add_argument("--format", choices=FORMATS, default="auto",
                   help="log format (default auto: detected from the log's first lines and "
                        "its end)")
    p.add_argument("--regex", metavar="FILE",
                   help="YAML file with a 'pattern' whose named groups (data, iter or step, "
                        "epoch, index, total, batch, rate, rank, time) read your own log lines "
                        "(docs/formats/logs.md)")
    p.add_argument("--batch-size", type=positive_int("--batch-size"), metavar="N",
                   help="samples per step, when the log does not say (most text logs; timm, "
                        "hf_trainer and autotune's own log do)")
    p.add_argument("--probe", metavar="FILE",
                   help="`autotune probe --json` output: compare the read rate with the "
                        "storage ceiling")
    p.add_argument("--dataset", metavar="PATH",
                   help="the dataset path, for the next command (default: from the step "
                        "log or the monitor's run.json)")
    p.add_argument("--warmup", type=nonneg_int("--warmup"), metavar="N",
                   help="steps left out at the start (default max(5, workers x prefetch))")


def _emit_analysis(args: argparse.Namespace, a: object) -> None:
    from autotune.cli.tables.analyze import analysis_renderable

    emit(args, a.to_dict(), analysis_renderable(a))  # type: ignore[attr-defined,arg-type]


def _analyze_kwargs(args: argparse.Namespace) -> dict:
    return {"batch_size": args.batch_size, "format": args.format, "regex": args.regex,
            "probe": args.probe, "dataset": args.dataset, "warmup": args.warmup}


def _run_monitor(args: argparse.Namespace) -> int:
    """`autotune monitor`: run the command; its exit status is ours. Then the analysis."""
    from autotune.errors import AutotuneError, UsageError
    from autotune.monitor.run import run_monitored, signal_name

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("no command to run: put it after `--`, e.g. "
                         "`autotune monitor --data /data/train -- python train.py`")
    out = args.out or time.strftime("monitor-%Y%m%d-%H%M%S")
    # `--json -` promises stdout to a script: the command's own output must not be mixed in.
    echo_out = sys.stderr.buffer if args.json == "-" else sys.stdout.buffer
    run = run_monitored(cmd, out, interval=args.interval, data=args.data, gpu=not args.no_gpu,
                        echo_stdout=echo_out, echo_stderr=sys.stderr.buffer,
                        delayacct=args.delayacct)
    from autotune.cli.tables import printable

    err = console(True)
    status = (f"exit status {run.returncode}" if run.signal is None
              else f"killed by {signal_name(run.signal)} (status {run.returncode})")
    line = (f"autotune monitor: {' '.join(cmd)}: {status} after {run.seconds:,.1f} s; "
            f"{run.samples} samples in {run.metrics}, log in {run.log}"
            + (f"; forwarded {', '.join(run.forwarded)}" if run.forwarded else ""))
    err.print(printable(line, markup=True))
    for e in run.errors:
        err.print(f"autotune monitor: warning: {printable(e, markup=True)}", style="yellow")
    if not args.no_analysis:
        from autotune.analyze import analyze

        try:
            _emit_analysis(args, analyze(out, **_analyze_kwargs(args)))
        except AutotuneError as e:  # the command's status stays the monitor's, whatever this says
            err.print(f"autotune monitor: no analysis: {printable(e, markup=True)}",
                      style="yellow")
    return run.returncode
