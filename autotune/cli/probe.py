"""`autotune probe PATH`: what the storage under a dataset can deliver (fio + replay)."""

from __future__ import annotations

import argparse

from autotune.cli import exits
from autotune.cli._base import Command, emit, spinner
from autotune.cli.args import (add_endpoint, add_json, add_seed, apply_endpoint, int_list,
                               positive_float, positive_int)
from autotune.errors import GateFailed, GateUnmeasured


class Probe(Command):
    name = "probe"
    help = "measure the storage under a dataset (fio + replay of its files)"
    description = """\
Measure what the storage holding PATH can deliver to a data loader:
  1. fio (the real program) on a scratch file that autotune creates, fills with data and
     removes: sequential read (1 MiB, 4 jobs) and random read (4 KiB, iodepth 64, 4 jobs),
     direct I/O; each figure is cross-checked against the disk's own counters (a figure
     the disk did not serve, from the page cache or RAM, is marked implausible).
  2. a cold replay of up to --replay-files of the dataset's own files, read whole at
     concurrency 1, 4, 16 and 64: files/s, MiB/s, per-file latency (this is the storage
     ceiling `autotune search` uses).
  3. a classification of the storage (nvme, ssd, hdd, network, memory, object for s3://,
     unknown) with its evidence.
fio only ever touches the scratch file it created (it overwrites any file it is pointed
at). Cold reads need root for drop_caches; otherwise pages are evicted per file."""
    epilog = ("examples:\n  autotune probe /data/imagenet/train\n"
              "  autotune probe /mnt/nfs/ds --runtime 5 --json probe.json\n"
              "  autotune probe /data --min-iops 50000   # CI gate: exit 3 below, 5 unmeasured\n"
              "  autotune probe s3://bucket/train --endpoint-url http://127.0.0.1:8333\n\n"
              + exits.help_block("probe"))
    after_stop = "scratch files removed"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("path", metavar="PATH",
                       help="dataset directory (or a file) on the storage to measure, or "
                            "s3://BUCKET/PREFIX (GETs of its objects at each concurrency)")
        add_endpoint(p)
        add_json(p)
        p.add_argument("--runtime", type=positive_float("--runtime"), default=10.0,
                       metavar="SECONDS", help="seconds per fio job (default 10)")
        p.add_argument("--size", default="1G", metavar="SIZE",
                       help="fio scratch file size, e.g. 256M, 4G (default 1G; larger than "
                            "the device cache gives truer random figures)")
        p.add_argument("--scratch", metavar="DIR",
                       help="directory for fio's scratch file when PATH's filesystem is "
                            "read-only (pick one on the same storage)")
        p.add_argument("--replay-files", type=positive_int("--replay-files"), default=2000,
                       metavar="N", help="files sampled for the replay (default 2000)")
        p.add_argument("--replay-seconds", type=positive_float("--replay-seconds"),
                       default=10.0, metavar="S",
                       help="time budget per replay concurrency level (default 10)")
        p.add_argument("--concurrency", type=int_list("--concurrency"), default=[1, 4, 16, 64],
                       metavar="LIST", help="replay concurrency levels (default 1,4,16,64)")
        p.add_argument("--warm", action="store_true",
                       help="do not drop the page cache before the replay (labelled warm)")
        p.add_argument("--no-fio", action="store_true", help="skip fio (replay only)")
        p.add_argument("--no-replay", action="store_true",
                       help="skip the dataset replay (fio only)")
        add_seed(p, "the replay's file sample")
        p.add_argument("--min-iops", type=positive_float("--min-iops"), metavar="N",
                       help="gate: exit 3 when fio's random-read IOPS is below N, exit 5 "
                            "when it could not be measured (fio missing, or not served by "
                            "the storage: page cache or RAM); the outcome is `gate` in the "
                            "JSON; small-file image training wants > 50000")
        p.add_argument("--min-seq-mibps", type=positive_float("--min-seq-mibps"),
                       metavar="N",
                       help="gate: exit 3 when fio's sequential read MiB/s is below N, "
                            "exit 5 when it could not be measured (as --min-iops)")

    def run(self, args: argparse.Namespace) -> int:
        from autotune.cli.tables.probe import probe_renderable
        from autotune.probe import probe
        from autotune.probe.gate import judge
        from autotune_base.units import parse_size

        from autotune.environment import read_environment

        apply_endpoint(args)
        size = parse_size(args.size, name="--size")
        env = read_environment(args.path, scratch=args.scratch)  # once, for the whole probe
        with spinner(not args.quiet) as prog:
            if args.path.startswith("s3://"):  # GETs of its objects: no fio, no replay
                from autotune.probe.objstore import probe_objects

                res = probe_objects(args.path, concurrency=args.concurrency,
                                    seconds=args.replay_seconds, max_objects=args.replay_files,
                                    cold=not args.warm, seed=args.seed, progress=prog)
                res.environment = env.to_dict()
            else:
                res = probe(args.path, size=size, runtime=args.runtime, scratch=args.scratch,
                            replay_files=args.replay_files, concurrency=args.concurrency,
                            replay_seconds=args.replay_seconds, run_fio=not args.no_fio,
                            run_replay=not args.no_replay, cold=not args.warm, seed=args.seed,
                            progress=prog, environment=env)
        gate = judge(res, {"--min-iops": args.min_iops,
                           "--min-seq-mibps": args.min_seq_mibps})
        doc = res.to_dict()
        doc["gate"] = gate.to_dict() if gate is not None else None
        emit(args, doc, probe_renderable(res, gate))
        if gate is None or gate.passed:
            return 0
        failed, unmeasured = gate.failed(), gate.unmeasured()
        parts = []
        if failed:
            parts.append("gate failed: " + "; ".join(c.line() for c in failed))
        if unmeasured:
            parts.append("gate not measured: " + "; ".join(c.line() for c in unmeasured))
        if failed:
            raise GateFailed("; ".join(parts))
        raise GateUnmeasured("; ".join(parts))
