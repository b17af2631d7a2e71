"""`autotune convert`: the argparse parser and the command (CLI layer: it may print).

Wired into autotune.cli with `cli_convert.add_parser(sub)`; `run(args)` returns the exit
status and raises AutotuneError for the one-line error path of autotune.cli.main.
`python -m autotune.cli_convert SRC DST ...` runs it alone (tests use that).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

EXIT_CODES = """\
exit status:
  0    success (skipped files, if any, are listed in DST/manifest.json and the summary)
  1    error: the conversion stopped (the message names the file and the fix); rerun the
       same command to resume, finished shards are kept
  2    usage error: a bad option or argument, or a DST holding something else
  130  interrupted (Ctrl-C); 143 terminated (SIGTERM); rerun to resume
"""


def _default_workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


from autotune.cli import _int_at_least  # noqa: E402  (shared argument types)


def _size(name: str) -> Callable[[str], int]:
    def conv(s: str) -> int:
        from autotune.errors import UsageError
        from converters.units import parse_size

        try:
            return parse_size(s, name=name)
        except UsageError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return conv


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `convert` subcommand to an `autotune` subparsers object."""
    from converters import registry

    p = sub.add_parser(
        "convert", help="repack an image folder into LMDB or WebDataset shards (resumable)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Repack an image folder (SRC/CLASS/IMAGE, labels = sorted CLASS names, as torchvision's
ImageFolder) or a --file-list into WebDataset tar shards or one LMDB environment, so that
millions of small random reads become a few large sequential ones.
  - samples are shuffled with --seed before they are cut into shards; the same input and
    options give byte-identical output (only manifest.json's "created" differs)
  - --workers processes read and check images; each shard is written to a temporary name,
    fsynced, hashed (sha256) and renamed: kill it at any moment and rerun the same command
    to resume; DST/manifest.json is written last and means "complete"
  - bad images (truncated, empty, not an image, decompression bombs, unsupported modes)
    are skipped and listed in the manifest, or stop the run with --on-error fail
WebDataset: DST/shard-NNNNNN.tar, each sample KEY.cls, KEY.jpg|png|..., KEY.json.
LMDB: DST/data.mdb, keys 0000000000.., value = label + original path + image bytes.""",
        epilog="examples:\n"
               "  autotune convert /data/train /fast/train-wds --format wds --workers 8\n"
               "  autotune convert /data/train /fast/train-lmdb --format lmdb\n"
               "  autotune convert /data /fast/ds --format wds --file-list train.csv\n"
               "  autotune convert /data/train /fast/small --format wds --max-side 512 "
               "--quality 90\n\n" + EXIT_CODES)
    p.add_argument("src", metavar="SRC", help="image folder (class subfolders), or the root "
                                              "of the --file-list paths")
    p.add_argument("dst", metavar="DST", help="output directory (created; rerun to resume)")
    p.add_argument("--format", required=True, choices=registry.choices(writable=True),
                   help="wds: WebDataset tar shards (sequential reading, best on slow or "
                        "network storage); lmdb: one LMDB environment (random access)")
    p.add_argument("--shard-size", type=_size("--shard-size"), default="64MiB", metavar="SIZE",
                   help="WebDataset: source bytes per shard; LMDB: per commit (default 64MiB)")
    p.add_argument("--readers", type=_int_at_least("--readers", 1), default=32, metavar="N",
                   help="WebDataset: DataLoader workers x ranks that will read the shards; "
                        "at least N shards, a multiple of N (default 32)")
    p.add_argument("--workers", type=_int_at_least("--workers", 1), default=_default_workers(),
                   metavar="N", help="processes reading and checking images (default "
                                     f"{_default_workers()}, the CPU count up to 8); "
                                     "the output does not depend on it")
    p.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    p.add_argument("--max-side", type=_int_at_least("--max-side", 16), metavar="PX",
                   help="re-encode images whose longer side exceeds PX to that size (RGB "
                        "JPEG); smaller images keep their bytes")
    p.add_argument("--quality", type=_int_at_least("--quality", 1), default=90, metavar="Q",
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
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON to FILE "
                                                  "('-' for stdout)")
    p.set_defaults(func=run)
    return p


@contextmanager
def _progress_display(enabled: bool) -> Iterator[Callable[[Any], None] | None]:
    """A rich progress bar on stderr (images/s, MB/s, ETA); only on a terminal."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    from converters.units import fmt_bytes

    prog = Progress(TextColumn("{task.description}"), BarColumn(),
                    TextColumn("{task.fields[count]}"), TextColumn("{task.fields[rates]}"),
                    console=Console(stderr=True), transient=True)
    task = prog.add_task("scanning", total=None, count="", rates="")
    start: dict[str, Any] = {}

    def update(p: Any) -> None:
        if p.phase == "scan":
            prog.update(task, description="scanning", completed=p.samples, total=None,
                        count=f"{p.samples:,} files", rates=f"{fmt_bytes(p.source_bytes)} found")
            return
        if "t" not in start:  # rates of this run only (a resumed run starts mid-way)
            start.update(t=p.elapsed, n=p.samples, b=p.source_bytes)
        dt = max(p.elapsed - start["t"], 1e-6)
        rate = (p.samples - start["n"]) / dt
        mbs = (p.source_bytes - start["b"]) / dt / 1e6
        left = (p.total_bytes - p.source_bytes) / (mbs * 1e6) if mbs > 0 else None
        eta = "-" if left is None else time.strftime("%H:%M:%S", time.gmtime(left))
        prog.update(task, description="publishing" if p.phase == "publish" else "converting",
                    completed=p.samples, total=p.total, count=f"{p.samples:,}/{p.total:,}",
                    rates=f"{rate:,.0f} img/s  {mbs:,.1f} MB/s  ETA {eta}  "
                          f"shards {p.units_done}/{p.units}")

    with prog:
        yield update


def _summary(res: Any) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from converters import registry
    from converters.units import fmt_bytes

    t = Table(title=f"autotune convert: {res.dst} ({res.format})", title_justify="left",
              show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    unit = registry.get(res.format).writer_class().output_noun
    t.add_row("samples", f"{res.samples:,} in {res.classes:,} classes")
    t.add_row("skipped", f"{len(res.skipped):,}")
    for kind, n in sorted(res.skipped_by_kind.items(), key=lambda kv: -kv[1]):
        t.add_row(f"  {kind}", f"{n:,}")
    if res.ignored:
        t.add_row("ignored (no image extension)", f"{res.ignored:,}")
    t.add_row(unit, f"{res.shards:,}, {fmt_bytes(res.output_bytes)}")
    t.add_row("source", f"{res.source_files:,} files, {fmt_bytes(res.source_bytes)}")
    if res.reencoded:
        t.add_row("re-encoded", f"{res.reencoded:,} images, {fmt_bytes(res.bytes_saved)} saved")
    if res.already_complete:
        t.add_row("time", "already complete: nothing to do")
    else:
        t.add_row("time", f"{res.seconds:,.1f} s"
                  + (f" (resumed: {res.resumed_units} units kept)" if res.resumed_units else ""))
        t.add_row("rate", f"{res.images_per_s:,.0f} images/s, {res.mb_per_s:,.1f} MB/s read")
    parts: list[Any] = [t]
    for w in res.warnings:
        parts.append(Text(f"warning: {w}", style="yellow"))
    shown = res.skipped[:10]
    for s in shown:
        parts.append(Text(f"skipped: {s['path']}: {s['reason']}", style="dim"))
    if len(res.skipped) > len(shown):
        parts.append(Text(f"... and {len(res.skipped) - len(shown)} more in {res.manifest}",
                          style="dim"))
    return Group(*parts)


def run(args: argparse.Namespace) -> int:
    """Run `autotune convert` from parsed arguments; returns the exit status."""
    from rich.console import Console

    from autotune import report
    from converters import ConvertOptions, convert

    opts = ConvertOptions(format=args.format, shard_size=args.shard_size, workers=args.workers,
                          seed=args.seed, max_side=args.max_side, quality=args.quality,
                          on_error=args.on_error, verify=args.verify, readers=args.readers,
                          file_list=args.file_list)
    with _progress_display(not getattr(args, "quiet", False)) as prog:
        res = convert(args.src, args.dst, opts, progress=prog)
    json_to_stdout = args.json == "-"
    stream = sys.stderr if json_to_stdout else sys.stdout
    Console(file=stream, width=None if stream.isatty() else 110).print(_summary(res))
    if json_to_stdout:
        sys.stdout.write(report.to_json(res.to_dict()))
    elif args.json:
        report.write_json_atomic(args.json, res.to_dict())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry (python -m autotune.cli_convert): one-line errors as autotune's."""
    from autotune.errors import AutotuneError

    ap = argparse.ArgumentParser(prog="autotune")
    ap.add_argument("--debug", action="store_true")
    ap.add_argument("-q", "--quiet", action="store_true")
    sub = ap.add_subparsers(dest="command", required=True)
    add_parser(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    front = [a for a in argv if a in ("-q", "--quiet", "--debug")]
    args = ap.parse_args([*front, "convert", *(a for a in argv if a not in front)])
    try:
        return run(args)
    except AutotuneError as e:
        if args.debug:
            raise
        print(f"autotune convert: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("autotune convert: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
