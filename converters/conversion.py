"""`convert()`: image folder (or file list) -> LMDB or WebDataset shards, resumable.

Steps: lock DST -> reuse or make the plan (streaming scan, seeded shuffle, units) -> write
the units not yet done, with `workers` processes -> publish -> manifest.json (last) ->
remove the work directory. Kill it at any point and run it again with the same options:
it continues from the last durable unit and ends with output identical to an
uninterrupted run (see converters/__init__.py for the guarantees); it scans SRC again
first and refuses to go on when SRC no longer gives the same plan (SRC changed).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autotune_converters import registry
from autotune_base.errors import ConvertError, StoreDenied, StoreUnreachable, UsageError
from autotune_converters.images import SampleOptions
from autotune_converters.manifest import NAME as MANIFEST_NAME
from autotune_converters.manifest import Manifest, read_manifest, write_manifest
from autotune_converters.plan import Plan, make_plan
from autotune_converters.records import UnitResult, set_progress_counter
from autotune_converters.scan import ScanSink, check_file_list, scan_file_list, scan_folder
from autotune_converters.workdir import NAME as WORKDIR_NAME
from autotune_converters.workdir import WorkDir
from autotune_converters.options import ConvertOptions, ConvertProgress
from autotune_converters.space import NoRoom, check_room
from autotune_converters.writer import FormatWriter

@dataclass
class ConvertResult:
    dst: str
    format: str
    samples: int
    classes: int
    shards: int
    output_bytes: int
    source_files: int
    source_bytes: int  # bytes of the scanned files
    seconds: float
    skipped: list[dict[str, str]]
    skipped_by_kind: dict[str, int]
    ignored: int  # files without an image extension
    reencoded: int = 0
    bytes_saved: int = 0
    resumed_units: int = 0  # units a previous run had finished
    already_complete: bool = False
    warnings: list[str] = field(default_factory=list)
    manifest: str = ""
    read_bytes: int = 0  # source bytes read by this run
    processed: int = 0  # source files this run read and checked (a resumed run: the rest)
    engine: str = "local"
    # Conversion by ranks: this process's rank, whether the manifest is published (by this
    # process or another), and the ranks whose units are still missing when it is not.
    rank: int | None = None
    world_size: int | None = None
    finalized: bool = True
    waiting_for: list[int] = field(default_factory=list)
    units_written: int = 0  # units this run wrote
    # DST s3://: what the upload did (autotune_converters.objstore.upload.UploadResult as a dict)
    upload: dict[str, Any] = field(default_factory=dict)

    @property
    def images_per_s(self) -> float:
        return self.processed / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.read_bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["images_per_s"] = self.images_per_s
        d["mb_per_s"] = self.mb_per_s
        return d


Progress = Callable[[ConvertProgress], None]


def _check_paths(src: Path, dst: Path, file_list: str | None) -> None:
    if not src.exists():
        raise UsageError(f"{src}: no such file or directory.")
    if not src.is_dir():
        raise UsageError(f"{src}: not a directory (SRC is an image folder, or the root the "
                         "--file-list paths are relative to).")
    if file_list and not Path(file_list).is_file():
        raise UsageError(f"{file_list}: no such file (the file list).", setting="file_list")
    if file_list:
        check_file_list(file_list)   # before DST is made: its labels can be refused
    rs, rd = src.resolve(), dst.resolve()
    if rd == rs or (rs in rd.parents and not file_list):  # a file list names its files
        raise UsageError(f"{dst}: inside SRC {src}; the output would be scanned as input. "
                         "Choose a DST outside SRC.")
    if rd in rs.parents:
        raise UsageError(f"{dst}: contains SRC {src}; choose a separate DST.")


def _is_s3(path: Any) -> bool:
    return isinstance(path, str) and path.startswith("s3://")


def _check_bucket_src(src: str, file_list: str | None) -> str:
    """The source root of an s3:// SRC as the plan records it (s3://BUCKET/PREFIX)."""
    from autotune_converters.objstore.url import parse

    if file_list:
        raise UsageError(f"{src}: --file-list is for a local SRC; a bucket is converted from "
                         "its listing (PREFIX/CLASS/NAME.jpg).", setting="file_list")
    return str(parse(src))


def _complete_result(dst: Path, m: Manifest) -> ConvertResult:
    kinds = collections.Counter(s["reason"].split(" (", 1)[0] for s in m.skipped)
    return ConvertResult(
        dst=str(dst), format=m.format, samples=m.num_samples, classes=m.num_classes,
        shards=len(m.shards), output_bytes=sum(int(s["bytes"]) for s in m.shards),
        source_files=int(m.source.get("files", 0)), source_bytes=int(m.source.get("bytes", 0)),
        seconds=0.0, skipped=m.skipped, skipped_by_kind=dict(kinds),
        ignored=int(m.stats.get("ignored", 0)), reencoded=int(m.stats.get("reencoded", 0)),
        bytes_saved=int(m.stats.get("bytes_saved", 0)), already_complete=True,
        manifest=str(dst / MANIFEST_NAME), resumed_units=_units(m))


def _units(m: Manifest) -> int:
    """The units a complete conversion was written in (its manifest's stats); a manifest
    from before they were recorded: its shards, which are the units except in LMDB."""
    units = m.stats.get("units")
    return units if type(units) is int and units >= 0 else len(m.shards)


def prepare(src: str | os.PathLike[str], dst: str | os.PathLike[str], opts: ConvertOptions
            ) -> tuple[Path, Path, ConvertOptions, dict[str, Any], str, ConvertResult | None]:
    """Checks before converting: options, paths, and a DST that is new, empty, or this
    conversion (partial or complete). Returns (src, dst, options with an absolute file
    list, fingerprint, source root, the result when DST is already complete)."""
    opts.validate()
    if _is_s3(dst):
        raise UsageError(f"{dst}: a bucket DST is converted by autotune_converters.convert in one "
                         "process (a local work folder, then uploaded: "
                         "autotune_converters.objstore.upload); ranks write a local or shared DST.",
                         setting="world_size")
    dstp = Path(dst)
    if _is_s3(src):
        srcp: Any = src  # an s3:// address stays a string (a Path would lose the '//')
        src_root = _check_bucket_src(str(src), opts.file_list)
    else:
        srcp = Path(src)
        _check_paths(srcp, dstp, opts.file_list)
        src_root = os.path.abspath(srcp)
    fl = os.path.abspath(opts.file_list) if opts.file_list else None
    ep = opts.endpoint_url
    if _is_s3(src) and ep is None:
        from autotune_converters.objstore.client import S3Config

        ep = S3Config.from_env().endpoint_url
    opts = ConvertOptions(**{**asdict(opts), "file_list": fl, "endpoint_url": ep})
    fp = opts.fingerprint(src_root)
    if (dstp / MANIFEST_NAME).exists():
        m = read_manifest(dstp)
        if m.options != fp:
            raise UsageError(_differs(dstp, "a complete conversion", m.options, fp))
        WorkDir(dstp).remove_stale()  # a kill after the manifest
        return srcp, dstp, opts, fp, src_root, _complete_result(dstp, m)
    try:
        dstp.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{dstp}: cannot create the output directory ({e.strerror}); DST is "
                         "the folder to convert into (created if missing): name one you can "
                         "write") from e
    # One listing, judged alone: another rank may create the work directory at any moment
    # (checking "no work directory" and then "empty" would race with it).
    foreign = any(e.name != WORKDIR_NAME for e in dstp.iterdir())
    if foreign and not WorkDir(dstp).exists():
        if (dstp / MANIFEST_NAME).exists():  # another rank finished it just now
            return prepare(src, dst, opts)
        raise UsageError(f"{dstp}: not empty and not an autotune conversion; choose an empty "
                         "or new DST.")
    if not os.access(dstp, os.W_OK):
        raise UsageError(f"{dstp}: not writable by this user; choose another DST.")
    return srcp, dstp, opts, fp, src_root, None


def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str], opts: ConvertOptions,
            progress: Progress | None = None, *, check_space: bool = True) -> ConvertResult:
    """Convert SRC into DST (created if needed) as `opts.format` in this process (and its
    workers, or Ray tasks); resumes a killed run. Ranks: `autotune_converters.convert`
    (autotune_converters.ranks.convert), which calls this for world size 1.

    Raises UsageError for bad arguments, a DST that holds something else or whose
    filesystem has no room for what is still to write (autotune_converters.space; checked
    unless `check_space` is False, before any unit is written, and a fresh run then
    leaves DST as it found it), and ConvertError for failures (the message names the
    file and the fix).
    """
    t0 = time.monotonic()
    existed = os.path.lexists(dst)
    srcp, dstp, opts, fp, src_root, complete = prepare(src, dst, opts)
    if complete is not None:
        return complete
    if (opts.world_size or 1) > 1:
        raise UsageError(f"world_size {opts.world_size}: a rank converts through "
                         "autotune_converters.convert (autotune_converters.ranks), not conversion.convert.",
                         setting="world_size")
    wd = WorkDir(dstp)
    if wd.dist.exists():
        wd.refuse_while_ranks_run()  # else: the ranks are gone; this process finishes their job
    wd.lock()
    plan: Plan | None = None
    run = RunState(check_space=check_space)
    h: str | None = None
    try:
        plan = Plan.load(wd.plan)
        if plan is not None and plan.fingerprint != fp:
            raise UsageError(_differs(dstp, "a partial conversion", plan.fingerprint, fp))
        if plan is None:
            plan = _fresh_plan(srcp, wd, dstp, existed, opts, fp, src_root, progress, t0)
            h = None
        else:  # a resume: the rest of the plan its first run made, if SRC still gives it
            h = _same_source(srcp, wd, plan, opts, fp, src_root, progress, t0)
        wd.plan_id = (h or plan.content_hash()) if wd.dist.exists() else None
        wd.clear_tmp()
        sample_opts = SampleOptions(root=src_root, verify=opts.verify, max_side=opts.max_side,
                                    quality=opts.quality)
        writer = registry.get(opts.format).writer_class()(dstp, wd, plan, opts, sample_opts)
        results, shards = _write_units(writer, plan, opts, progress, t0, run)
        m = _manifest(plan, opts, fp, results, shards, wd, writer.LAYOUT)
        write_manifest(dstp, m, wd.tmp)
    except OSError as e:
        raise _os_error(e, dstp, run) from e
    except NoRoom:
        if h is None:  # a fresh run: its plan is all it wrote; DST is left as it was
            close_run(plan, wd)
            plan = None
            _leave_as_found(wd, dstp, existed)
        raise
    finally:
        close_run(plan, wd)
        wd.unlock()
    wd.remove()
    return _run_result(dstp, m, t0, run, opts, plan)


def _fresh_plan(srcp: Path, wd: WorkDir, dstp: Path, existed: bool, opts: ConvertOptions,
                fp: dict[str, Any], src_root: str, progress: Progress | None, t0: float) -> Plan:
    """A fresh run's scan and plan. One whose scan fails (a bucket denied, missing or
    unreachable, a prefix with no images) has written nothing: DST is left as it was, not
    holding a work folder that `stage` and `open_dataset` call an unfinished conversion."""
    try:
        return _scan_and_plan(srcp, wd, opts, fp, src_root, progress, t0)
    except (StoreDenied, StoreUnreachable, UsageError):
        _leave_as_found(wd, dstp, existed)
        raise


def _leave_as_found(wd: WorkDir, dstp: Path, existed: bool) -> None:
    """Remove what a refused fresh run made: the work folder and a DST it created."""
    wd.remove()
    if not existed:
        with contextlib.suppress(OSError):
            dstp.rmdir()  # made by prepare(); only while still empty


def _run_result(dstp: Path, m: Manifest, t0: float, run: RunState, opts: ConvertOptions,
                plan: Plan) -> ConvertResult:
    res = _complete_result(dstp, m)
    res.already_complete = False
    res.seconds = time.monotonic() - t0
    res.resumed_units = run.resumed_units
    res.read_bytes = run.read_bytes
    res.processed = run.processed
    res.units_written = run.units_written
    res.engine = opts.engine
    res.warnings = list(plan.warnings)
    return res


@dataclass
class RunState:
    """What the unit runner knows, also when it stops on an error."""

    resumed_units: int = 0
    read_bytes: int = 0  # source bytes read by this run
    processed: int = 0  # source files read by this run
    remaining_bytes: int = 0  # source bytes of the units still to write
    units_written: int = 0  # units this run wrote
    check_space: bool = True  # refuse before writing when DST's filesystem lacks the room


def _differs(dst: Path, what: str, old: dict[str, Any], new: dict[str, Any]) -> str:
    def shown(d: dict[str, Any], k: str) -> str:  # an option one format has, another lacks
        return repr(d[k]) if k in d else "(none)"

    diffs = [f"{k} {shown(old, k)} -> {shown(new, k)}" for k in sorted(set(old) | set(new))
             if old.get(k) != new.get(k)]
    how = ("rerun with the same options to resume" if what.startswith("a partial")
           else "it is kept as it is")
    return (f"{dst}: holds {what} made with other options ({'; '.join(diffs)}); {how}, or "
            "choose another (or an emptied) DST.")


def _os_error(e: OSError, dst: Path, run: RunState) -> Exception:
    if e.errno == errno.ENOSPC:
        from autotune_base.units import fmt_bytes

        try:
            st = os.statvfs(dst)
            free = fmt_bytes(st.f_bavail * st.f_frsize)
        except OSError:
            free = "?"
        left = (f"; about {fmt_bytes(run.remaining_bytes)} of source data still to write"
                if run.remaining_bytes else "")
        return ConvertError(
            f"{e.filename or dst}: no space left on device ({free} free{left}); free space "
            "and rerun the same `autotune convert` command to resume: finished units are kept.")
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ConvertError(f"{e.filename or dst}: {e.strerror}; DST must be writable "
                            "(check permissions or a read-only mount).")
    return ConvertError(f"{e.filename or dst}: {e.strerror or e}; fix it and rerun to resume.")


def _scan_and_plan(src: Path, wd: WorkDir, opts: ConvertOptions, fp: dict[str, Any],
                   src_root: str, progress: Progress | None, t0: float) -> Plan:
    # A fresh scan: whatever an interrupted scan or an older plan left is discarded.
    shutil.rmtree(wd.plan, ignore_errors=True)
    shutil.rmtree(wd.done, ignore_errors=True)
    wd.done.mkdir(parents=True)
    shutil.rmtree(wd.lmdb, ignore_errors=True)
    return scan_into(src, wd.plan, opts, fp, src_root, progress, t0)


def rescan_hash(src: Path, scan_dir: Path, opts: ConvertOptions, fp: dict[str, Any],
                src_root: str, progress: Progress | None, t0: float
                ) -> tuple[str, dict[str, Any]]:
    """SRC scanned again into `scan_dir` (removed after): the hash of the plan it gives
    (Plan.content_hash: every file's label, path and size, the cut, the options) and its
    source (files, bytes). A hash other than the plan's means SRC changed since the plan
    was made; resumed runs and ranks > 0 (autotune_converters.ranks) compare it."""
    try:
        plan = scan_into(src, scan_dir, opts, fp, src_root, progress, t0)
        try:
            return plan.content_hash(), dict(plan.source)
        finally:
            plan.close()
    finally:
        shutil.rmtree(scan_dir, ignore_errors=True)


def _same_source(src: Path, wd: WorkDir, plan: Plan, opts: ConvertOptions, fp: dict[str, Any],
                 src_root: str, progress: Progress | None, t0: float) -> str:
    """The plan's hash, when SRC scanned now gives the same plan; ConvertError otherwise
    (the units already written hold the files SRC had then). One scan, as a fresh run's."""
    h = plan.content_hash()
    now, source = rescan_hash(src, wd.rescan, opts, fp, src_root, progress, t0)
    if now != h:
        was = plan.source
        if (was.get("files"), was.get("bytes")) == (source["files"], source["bytes"]):
            what = (f"{source['files']:,} files, {source['bytes']:,} bytes then and now, "
                    "not the same")
        else:
            what = (f"then {was.get('files', 0):,} files, {was.get('bytes', 0):,} bytes; now "
                    f"{source['files']:,} files, {source['bytes']:,} bytes")
        raise ConvertError(f"{wd.dst}: SRC {src_root} changed since this conversion began "
                           f"({what}); restore SRC and rerun to resume, or empty {wd.dst} and "
                           "rerun to convert SRC as it is now.")
    return h


def scan_into(src: Path, plan_dir: Path, opts: ConvertOptions, fp: dict[str, Any],
              src_root: str, progress: Progress | None, t0: float) -> Plan:
    """Scan SRC and write a plan into the empty (or missing) directory `plan_dir`."""
    shutil.rmtree(plan_dir, ignore_errors=True)
    plan_dir.mkdir(parents=True)
    sink = ScanSink(plan_dir, opts.seed, opts.on_error, src_root)

    def scan_progress(files: int, nbytes: int) -> None:
        if progress:
            progress(ConvertProgress("scan", files, 0, nbytes, 0, time.monotonic() - t0))

    if _is_s3(src):
        from autotune_converters.objstore.convsource import scan_bucket
        from autotune_converters.objstore.url import parse

        scan = scan_bucket(parse(str(src)), sink, progress=scan_progress,
                           endpoint_url=opts.endpoint_url)
    elif opts.file_list:
        scan = scan_file_list(Path(opts.file_list), src, sink, scan_progress)
    else:
        scan = scan_folder(src, sink, scan_progress)
    if scan.files == 0:
        raise ConvertError(f"{src}: no usable images ({scan.skipped} skipped, {scan.ignored} "
                           "files without an image extension); nothing to convert.")
    dupes: list[str] = []
    plan = make_plan(scan, plan_dir, sharded=registry.get(opts.format).writer_class().sharded,
                     shard_size=opts.shard_size,
                     readers=opts.readers, fingerprint=fp, source_root=src_root,
                     dedupe=dupes.append)
    if dupes:
        if opts.on_error == "fail":
            raise ConvertError(f"{opts.file_list}: names {dupes[0]} more than once "
                               f"({len(dupes)} repeated paths); remove the repeats or rerun "
                               "with --on-error skip to keep the first of each.")
        import json
        with open(plan_dir / "scan-skipped.jsonl", "a", encoding="utf-8") as f:
            for p in dupes:
                f.write(json.dumps({"path": p, "reason": "duplicate entry (the file list names "
                                    "it more than once; kept once)"}) + "\n")
    return plan


# -- running the units --------------------------------------------------------------------

def close_run(plan: Any, wd: WorkDir) -> None:
    """The end of a run, however it ends: the plan's files closed, no partial output left
    in the work directory's tmp/ (redone on resume, never reused)."""
    if plan is not None:
        plan.close()
    if wd.tmp.is_dir():
        wd.clear_tmp()


def _write_units(writer: FormatWriter, plan: Plan, opts: ConvertOptions,
                 progress: Progress | None, t0: float, run: RunState,
                 only: Callable[[int], bool] | None = None,
                 ) -> tuple[list[UnitResult], list[dict[str, Any]]]:
    """Let the writer write the pending units (inline, `opts.workers` processes, or Ray
    tasks) and publish them; returns every unit's result (earlier runs' included) and its
    shards. only(unit): this process's share (a rank); it then publishes nothing."""
    # (samples, source bytes) this run has read: a list inline, a shared array with workers.
    live: dict[str, Any] = {"counter": [0, 0], "units": 0, "entries": 0, "bytes": 0}

    def on_open(done: list[UnitResult], pending: list[int]) -> None:
        if run.check_space and only is None:  # ranks: the planner checks (ranks.py)
            check_room(writer.dst, plan, pending, opts.max_side, resumed=len(done))
        run.resumed_units = live["units"] = len(done)
        run.remaining_bytes = sum(plan.unit_sizes[u] for u in pending)
        live["entries"] = plan.num_entries - sum(len(plan.unit_range(u)) for u in pending)
        live["bytes"] = plan.planned_bytes - run.remaining_bytes

    def tick() -> None:
        if progress:
            c = live["counter"]
            progress(ConvertProgress("convert", live["entries"] + c[0], plan.num_entries,
                                     live["bytes"] + c[1], plan.planned_bytes,
                                     time.monotonic() - t0, live["units"], plan.units))

    def on_unit(unit: int) -> None:
        live["units"] += 1
        run.units_written += 1
        run.remaining_bytes -= plan.unit_sizes[unit]
        if opts.engine == "ray":  # Ray tasks count nothing here: count whole units
            live["counter"][0] += len(plan.unit_range(unit))
            live["counter"][1] += plan.unit_sizes[unit]
        tick()

    def execute(units: list[int], work: Callable[[int], Any]) -> Iterator[tuple[int, Any]]:
        if opts.engine == "ray":
            from autotune_converters.ray_engine import run_on_ray

            return run_on_ray(units, work, address=opts.ray_address,
                              window=writer.results_in_flight)
        workers = min(writer.workers(opts.workers), len(units))
        if workers <= 1:
            return _inline(units, work, live["counter"])
        return _in_pool(units, work, workers, writer.results_in_flight(workers), live, tick)

    try:
        results = writer.run(execute, on_open=on_open, on_unit=on_unit, only=only)
    finally:
        run.processed, run.read_bytes = live["counter"][0], live["counter"][1]
    if progress:
        progress(ConvertProgress("publish", plan.num_entries, plan.num_entries,
                                 plan.planned_bytes, plan.planned_bytes,
                                 time.monotonic() - t0, plan.units, plan.units))
    return results


def _inline(units: list[int], work: Callable[[int], Any],
            counter: list[int]) -> Iterator[tuple[int, Any]]:
    set_progress_counter(counter)
    try:
        for u in units:
            yield u, work(u)
    finally:
        set_progress_counter(None)


def _in_pool(units: list[int], work: Callable[[int], Any], workers: int, window: int,
             live: dict[str, Any], tick: Callable[[], None]) -> Iterator[tuple[int, Any]]:
    import multiprocessing as mp

    from autotune_converters.pool import WorkerPool

    ctx = mp.get_context("forkserver")
    try:
        pool = WorkerPool(workers, work, ctx)
        live["counter"] = pool.progress
    except OSError as e:
        # forkserver re-executes the interpreter: a user who may run this Python but not
        # exec its real path (a venv built on a private pyenv under /root) ends up here.
        raise ConvertError(f"cannot start {workers} worker processes from {sys.executable} "
                           f"({e.strerror or e}); rerun with --workers 1 to convert in this "
                           "process, or use a Python this user can execute.") from e
    ok = False
    try:
        yield from pool.run(units, window, tick=tick)
        ok = True
    finally:
        pool.close(kill=not ok)


def _manifest(plan: Plan, opts: ConvertOptions, fp: dict[str, Any], results: list[UnitResult],
              shards: list[dict[str, Any]], wd: WorkDir, layout: str) -> Manifest:
    import json

    skipped: list[dict[str, str]] = []
    skp = wd.plan / "scan-skipped.jsonl"
    if skp.exists():
        with open(skp, encoding="utf-8") as f:
            skipped.extend(json.loads(line) for line in f if line.strip())
    for r in results:
        skipped.extend(r.skipped)
    skipped.sort(key=lambda s: (s["path"], s["reason"]))
    samples = sum(r.samples for r in results)
    src_read = sum(r.source_bytes for r in results)
    stored = sum(r.stored_bytes for r in results)
    reenc = sum(r.reencoded for r in results)
    stats = {"source_bytes_stored": src_read, "stored_bytes": stored, "reencoded": reenc,
             "bytes_saved": src_read - stored, "ignored": plan.ignored, "units": len(results)}
    return Manifest(format=opts.format, num_samples=samples, num_classes=len(plan.classes),
                    classes=plan.classes, shards=shards, skipped=skipped, source=plan.source,
                    options=fp, layout=layout, stats=stats)
