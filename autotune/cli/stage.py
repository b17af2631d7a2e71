"""`autotune stage SRC DST`: copy a converted dataset to local disk, verified and atomic."""

from __future__ import annotations

import argparse

from autotune.cli import exits
from autotune.cli._base import Command, emit, spinner
from autotune.cli.args import add_endpoint, add_json, apply_endpoint, nonneg_int, positive_int

EXIT = exits.help_block("stage")


class Stage(Command):
    name = "stage"
    help = "copy a converted dataset to local disk, verified and atomic"
    description = """\
Copy SRC (a conversion with manifest.json, or any folder: a manifest is computed) to DST
on local disk. Free space is checked first. Each file goes to a temporary name inside
DST, is fsynced, read back from the disk and verified against the manifest's sha256
(--verify size: sizes only), then renamed; manifest.json is copied last, so its
presence means the staged copy is complete. A rerun skips files already verified; a
lock stops two stagers on one DST. --verify-only re-hashes DST and names corrupt files
(the next stage repairs them)."""
    epilog = ("examples:\n  autotune stage /nfs/imagenet-wds /local/nvme/imagenet-wds\n"
              "  autotune stage /nfs/imagenet-wds /local/nvme/imagenet-wds --node-rank "
              "$SLURM_NODEID --nnodes $SLURM_NNODES\n"
              "  autotune stage /nfs/ds /local/ds --verify-only\n"
              "  autotune stage s3://bucket/train-wds /local/nvme/train-wds --endpoint-url "
              "http://127.0.0.1:8333\n\n" + EXIT)
    after_stop = "verified files are kept; rerun to resume"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("src", metavar="SRC", help="a conversion's folder, any folder, or a "
                       "conversion in a bucket: s3://BUCKET/PREFIX (its shards fetched by "
                       "parallel ranged GETs, checked against its manifest's sha256)")
        p.add_argument("dst", metavar="DST",
                       help="local folder to stage into (created; a rerun resumes it)")
        p.add_argument("--workers", type=positive_int("--workers"), default=4, metavar="N",
                       help="parallel copies (default 4)")
        p.add_argument("--verify", choices=("sha256", "size"), default="sha256",
                       help="sha256 (default): read every copy back from DST's disk and check "
                            "its hash; size: skip that read-back (the source is still hashed "
                            "against the manifest as it is copied)")
        p.add_argument("--verify-only", action="store_true",
                       help="only re-check DST against the manifest")
        p.add_argument("--probe", metavar="FILE",
                       help="`autotune probe --json` of the source: compare MB/s with its "
                            "sequential figure")
        p.add_argument("--node-rank", type=nonneg_int("--node-rank"), metavar="R",
                       help="stage only the WebDataset shards the ranks of node R read (with "
                            "--nnodes; the reader splits shards by node, then local rank, the "
                            "same every epoch), plus the manifest")
        p.add_argument("--nnodes", type=positive_int("--nnodes"), metavar="N",
                       help="number of nodes (with --node-rank); without both: the whole dataset")
        add_endpoint(p)
        add_json(p)

    def run(self, args: argparse.Namespace) -> int:
        from autotune.cli.tables.stage import stage_renderable
        from autotune_converters.stage import stage, verify_staged

        apply_endpoint(args)
        remote = args.src.startswith("s3://")
        if args.verify_only:
            res = verify_staged(args.dst, src=None if remote else args.src)
        else:
            seq = _source_seq(args.probe) if args.probe else None
            with spinner(not args.quiet) as prog:
                shown = ((lambda done, total: prog(
                    f"staging {done / 2**20:,.0f} of {total / 2**20:,.0f} MiB"))
                    if prog else None)
                res = stage(args.src, args.dst, workers=args.workers, verify=args.verify,
                            progress=shown, source_seq_mib_s=None if remote else seq,
                            node_rank=args.node_rank, nnodes=args.nnodes)
        d = res.to_dict()
        emit(args, d, stage_renderable(d))
        return 4 if res.failures else 0


def _source_seq(path: str) -> float:
    """fio's sequential MiB/s from an `autotune probe --json` file."""
    import json

    from autotune.errors import UsageError

    try:
        with open(path) as f:
            d = json.load(f)
    except OSError as e:
        raise UsageError(f"{path}: cannot read it ({e.strerror or e}).", setting="probe") from None
    except ValueError as e:
        raise UsageError(f"{path}: not JSON ({e}); give the file `autotune probe --json` "
                         "wrote.", setting="probe") from None
    fio = d.get("fio") if isinstance(d, dict) else None
    seq = (fio.get("seq_read") or {}) if isinstance(fio, dict) else {}
    bw = seq.get("bw_mib_s") if isinstance(seq, dict) else None
    if not isinstance(bw, (int, float)) or isinstance(bw, bool) or not bw > 0:
        why = ("fio was not run (--no-fio) or failed" if isinstance(d, dict) and "fio" in d
               else "not an `autotune probe --json` result")
        raise UsageError(f"{path}: no fio sequential read figure ({why}); probe SRC again "
                         "with fio, or leave --probe out.", setting="probe")
    return float(bw)
