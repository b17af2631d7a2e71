"""`autotune convert SRC DST --format wds|lmdb`: repack an image folder into shards."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from autotune.cli import exits
from autotune.cli._base import Command, PlainProgress, emit
from autotune.cli.args import (add_endpoint, add_json, add_seed, apply_endpoint, int_at_least,
                               positive_float, size)

EXIT = exits.help_block("convert")


def _default_workers() -> int:
    """The usable cores (affinity mask and every cgroup CPU quota above the process, as
    search and bench count them) up to 8: a container's quota, not the host's CPU count."""
    from autotune.cpus import usable_cores

    return min(8, usable_cores())


class Convert(Command):
    name = "convert"
    help = "repack an image folder into LMDB or WebDataset shards (resumable)"
    description = """\
Repack an image folder (SRC/CLASS/IMAGE, labels = sorted CLASS names, as torchvision's
ImageFolder) or a --file-list into WebDataset tar shards or one LMDB environment, so that
millions of small random reads become a few large sequential ones.
  - samples are shuffled with --seed before they are cut into shards; the same input and
    options give byte-identical output (only manifest.json's "created" differs)
  - --workers processes read and check images (LMDB with header checks reads in the
    writing process, with the next files read ahead: handing bytes to it costs more than
    the read); each WebDataset shard is written to a temporary name,
    fsynced, hashed (sha256) and renamed: kill it at any moment and rerun the same command
    to resume; DST/manifest.json is written last and means "complete"
  - bad images (truncated, empty, not an image, decompression bombs, unsupported modes)
    are skipped and listed in the manifest, or stop the run with --on-error fail
WebDataset: DST/shard-NNNNNN.tar, each sample KEY.cls, KEY.jpg|png|..., KEY.json.
LMDB: DST/data.mdb, keys 0000000000.., value = label + original path + image bytes."""
    epilog = ("examples:\n"
               "  autotune convert /data/train /fast/train-wds --format wds --workers 8\n"
               "  autotune convert /data/train /fast/train-lmdb --format lmdb\n"
               "  autotune convert /data /fast/ds --format wds --file-list train.csv\n"
               "  autotune convert s3://bucket/train /fast/train-wds --format wds "
               "--endpoint-url http://127.0.0.1:8333\n"
               "  autotune convert /data/train /fast/small --format wds --max-side 512 "
               "--quality 90\n\n"
              + EXIT)
    after_stop = ("finished work is kept (WebDataset shards, LMDB's committed batches); "
                  "rerun the same command to resume")

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        from autotune_converters import registry

        p.add_argument("src", metavar="SRC", help="image folder (class subfolders), the root "
                                                  "of the --file-list paths, or a bucket's "
                                                  "s3://BUCKET/PREFIX of CLASS/NAME.jpg objects")
        p.add_argument("dst", metavar="DST", help="output directory (created; rerun to resume), "
                                                  "or s3://BUCKET/PREFIX (uploaded, the "
                                                  "manifest last)")
        p.add_argument("--format", choices=registry.choices(writable=True),
                       help=registry.help_text(writable=True))
        p.add_argument("--shard-size", type=size("--shard-size"), default="64MiB", metavar="SIZE",
                       help="WebDataset: source bytes per shard; LMDB: per commit (default 64MiB)")
        p.add_argument("--readers", type=int_at_least("--readers", 1), default=32, metavar="N",
                       help="WebDataset: DataLoader workers x ranks that will read the shards; "
                            "at least N shards, a multiple of N (default 32)")
        p.add_argument("--workers", type=int_at_least("--workers", 1), default=_default_workers(),
                       metavar="N", help="processes reading and checking images (default "
                                         f"{_default_workers()}, the usable cores (affinity, "
                                         "CPU quota) up to 8; LMDB "
                                         "uses them only for --verify decode or --max-side); "
                                         "the output does not depend on it")
        add_seed(p, "the shuffle of the samples across shards")
        p.add_argument("--max-side", type=int_at_least("--max-side", 16), metavar="PX",
                       help="re-encode images whose longer side exceeds PX to that size (RGB "
                            "JPEG); smaller images keep their bytes")
        p.add_argument("--quality", type=int_at_least("--quality", 1), default=90, metavar="Q",
                       help="JPEG quality of re-encoded images (default 90)")
        p.add_argument("--on-error", choices=("skip", "fail"), default="skip",
                       help="skip (default): leave a bad image out and list it in the manifest; "
                            "fail: stop at the first one, naming it")
        p.add_argument("--verify", choices=("header", "decode"), default="header",
                       help="header (default): header, size, mode and completeness checks (a "
                            "reduced decode only for a JPEG/PNG without its end marker); decode: "
                            "decode every image fully (slower, catches corrupt data mid-file)")
        p.add_argument("--file-list", metavar="CSV",
                       help="convert the files a CSV of path,label rows names (paths relative "
                            "to SRC) instead of scanning SRC")
        _add_distributed(p)
        add_endpoint(p)
        p.add_argument("--work-dir", metavar="DIR",
                       help="DST s3://...: the local folder the conversion is made in before "
                            "it is uploaded, manifest.json last (default ~/.cache/autotune/"
                            "convert-HASH; removed once uploaded; needs the output's size)")
        add_json(p)

    def run(self, args: argparse.Namespace) -> int:
        from autotune.cli.tables.convert import convert_summary
        from autotune_converters import ConvertOptions, convert
        from autotune_base.errors import UsageError
        from autotune_converters.ranks import finalize, ranks_from_env

        apply_endpoint(args)
        if args.finalize:
            if args.rank is not None or args.world_size is not None:
                raise UsageError("--finalize needs no --rank or --world-size: the plan knows "
                                 "the world size.")
            res = finalize(args.dst, src=args.src, format=args.format)
            emit(args, res.to_dict(), convert_summary(res))
            return 0
        if args.format is None:
            raise UsageError("--format is required (wds or lmdb).")
        rank, world = args.rank, args.world_size
        if world is None and args.engine == "local":
            env = ranks_from_env()
            if env is not None:
                rank = env[0] if rank is None else rank
                world = env[1]
        if world is not None and rank is None:
            raise UsageError(f"--world-size {world} needs --rank (or RANK / SLURM_PROCID).")
        opts = ConvertOptions(format=args.format, shard_size=args.shard_size,
                              workers=args.workers, seed=args.seed, max_side=args.max_side,
                              quality=args.quality, on_error=args.on_error, verify=args.verify,
                              readers=args.readers, file_list=args.file_list, rank=rank,
                              world_size=world, plan_timeout=args.plan_timeout,
                              engine=args.engine, ray_address=args.ray_address)
        with _progress_display(not args.quiet) as prog:
            res = convert(args.src, args.dst, opts, progress=prog, work_dir=args.work_dir)
        emit(args, res.to_dict(), convert_summary(res))
        return 0


@contextmanager
def _progress_display(enabled: bool) -> Iterator[Callable[[Any], None] | None]:
    """A rich progress bar on stderr (images/s, MB/s, ETA) on a terminal; elsewhere (a
    batch job's log) the same figures as a plain line now and then (PlainProgress)."""
    if not enabled:
        yield None
        return
    start: dict[str, Any] = {}
    if not sys.stderr.isatty():
        plain = PlainProgress()

        def line(p: Any) -> None:
            what, count, rates = _figures(p, start)
            plain(f"{what}: {count} {rates}")

        yield line
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    prog = Progress(TextColumn("{task.description}"), BarColumn(),
                    TextColumn("{task.fields[count]}"), TextColumn("{task.fields[rates]}"),
                    console=Console(stderr=True), transient=True)
    task = prog.add_task("scanning", total=None, count="", rates="")

    def update(p: Any) -> None:
        what, count, rates = _figures(p, start)
        prog.update(task, description=what, completed=p.samples,
                    total=None if p.phase == "scan" else p.total, count=count, rates=rates)

    with prog:
        yield update


def _figures(p: Any, start: dict[str, Any]) -> tuple[str, str, str]:
    """A conversion's progress as (what, count, rates) text; `start` keeps this run's
    first figures (a resumed run's rates count only what it did)."""
    from autotune_base.units import fmt_bytes

    if p.phase == "scan":
        return "scanning", f"{p.samples:,} files", f"{fmt_bytes(p.source_bytes)} found"
    if "t" not in start:
        start.update(t=p.elapsed, n=p.samples, b=p.source_bytes)
    dt = max(p.elapsed - start["t"], 1e-6)
    rate = (p.samples - start["n"]) / dt
    mbs = (p.source_bytes - start["b"]) / dt / 1e6
    left = (p.total_bytes - p.source_bytes) / (mbs * 1e6) if mbs > 0 else None
    eta = "-" if left is None else time.strftime("%H:%M:%S", time.gmtime(left))
    return ("publishing" if p.phase == "publish" else "converting",
            f"{p.samples:,}/{p.total:,}",
            f"{rate:,.0f} img/s  {mbs:,.1f} MB/s  ETA {eta}  shards {p.units_done}/{p.units}")


def _add_distributed(p: argparse.ArgumentParser) -> None:
    """Ranks and Ray: the options of a conversion beyond one machine."""
    dist = p.add_argument_group(
        "beyond one machine", "ranks (torchrun, srun, or one process per host sharing DST) "
        "or a Ray cluster; the output is byte-identical to one process's")
    dist.add_argument("--rank", type=int_at_least("--rank", 0), metavar="R",
                      help="this process's rank (default $RANK, else $SLURM_PROCID in an "
                           "srun step); rank 0 scans and plans, rank R writes units "
                           "u %% W == R")
    dist.add_argument("--world-size", type=int_at_least("--world-size", 1), metavar="W",
                      help="number of ranks (default $WORLD_SIZE, else $SLURM_NTASKS in an "
                           "srun step); the last rank to finish publishes manifest.json")
    dist.add_argument("--finalize", action="store_true",
                      help="check every unit's record and publish manifest.json (the "
                           "world size comes from the plan); nothing to do when published")
    dist.add_argument("--plan-timeout", type=positive_float("--plan-timeout"),
                      default=1800.0, metavar="S",
                      help="how long ranks > 0 wait for rank 0's plan (default 1800)")
    dist.add_argument("--engine", choices=("local", "ray"), default="local",
                      help="local (default): this process and --workers processes; ray: "
                           "each unit a Ray task with one CPU (pip install "
                           "'autotune-loader[ray]'); DST must be shared by the nodes")
    dist.add_argument("--ray-address", metavar="HOST:PORT",
                      help="the Ray head's GCS address, as `ray start --head --port` "
                           "prints it (default $RAY_ADDRESS, else a local Ray)")
