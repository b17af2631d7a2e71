"""Conversion by ranks: W processes (torchrun, srun, or plain ones on any hosts sharing DST)
convert one dataset together, and the output is byte-identical to one process's.

    rank 0       scans SRC, plans, publishes DST/.autotune-convert/dist.json (world size,
                 plan hash) after the plan is durable
    rank r > 0   scans SRC too while it waits (it would idle otherwise), then waits for
                 dist.json (plan_timeout, naming rank 0) and compares plan hashes: ranks
                 that see different files (SRC changed, or another copy on another
                 node) are refused, naming both hashes
    every rank   writes the units u with u % W == r, through the same writer and unit
                 function as one process; its own lock (a second process with the same
                 rank is refused with the holder's pid), its own temporaries, its state
    the last     rank to finish (or `finalize`) checks every unit's record (written for this
                 plan, its shard whole under its final name) and publishes manifest.json

Units are fixed by the plan, not by W, and each is written by one unit function into a
temporary name and renamed when whole: any rank killed at any point (kill -9 included) is
rerun like a killed single process, a killed finalizer is rerun, and the world size may
change between launches. LMDB has one writer and is refused for W > 1.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from autotune_converters import conversion, registry
from autotune_base.errors import ConvertError, UsageError
from autotune_base.fsutil import PidLock, fsync_dir, write_json_atomic
from autotune_converters.manifest import NAME as MANIFEST_NAME
from autotune_converters.manifest import write_manifest
from autotune_converters.plan import Plan
from autotune_converters.workdir import DIST_VERSION, WorkDir

POLL_S = 0.25
FINALIZE_WAIT_S = 600.0  # a rank waits this long for another finalizer to let go


# -- who am I ------------------------------------------------------------------------------

def ranks_from_env(env: Any = None) -> tuple[int, int, str] | None:
    """(rank, world size, where from) as the launcher set them, or None.

    RANK/WORLD_SIZE (torchrun, torch.distributed launchers, or by hand), else
    SLURM_PROCID/SLURM_NTASKS inside an srun step (SLURM_STEP_ID set: a batch script
    itself is not one of the ranks, though its environment holds SLURM_NTASKS).
    """
    env = os.environ if env is None else env
    for rank_var, size_var, need in (("RANK", "WORLD_SIZE", None),
                                     ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID")):
        if size_var in env and (need is None or need in env or "SLURM_STEPID" in env):
            try:
                world = int(env[size_var])
                rank = int(env.get(rank_var, "0"))
            except ValueError:
                raise UsageError(f"{rank_var}={env.get(rank_var)!r} / {size_var}="
                                 f"{env.get(size_var)!r}: not integers; fix the environment "
                                 "or give rank and world_size explicitly.",
                                 setting=("rank", "world_size")) from None
            return rank, world, f"{rank_var}/{size_var}"
    return None


def _me() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}"


# -- dist.json -----------------------------------------------------------------------------

def short(h: str | None) -> str:
    return (h or "?")[:12]


def _rank_lock(wd: WorkDir, rank: int) -> PidLock:
    wd.real_dir(wd.rank_dir(rank))  # no link on the way to the lock is followed
    return PidLock(wd.rank_dir(rank) / "lock", lambda holder: ConvertError(
        f"{wd.dst}: rank {rank} of this conversion is already running ({holder}); two "
        "processes with one rank would write the same units. Give each process its own "
        "rank (RANK / --rank), or stop that one and rerun to resume."), tag=_me())


# -- one rank ------------------------------------------------------------------------------

def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str], opts: Any,
            progress: Any = None, *, work_dir: str | os.PathLike[str] | None = None) -> Any:
    """`autotune_converters.convert`: one process (conversion.convert; into a bucket DST
    s3://...: made in `work_dir`, then uploaded), or rank `opts.rank` of
    `opts.world_size` > 1 (convert_rank). See ConvertOptions and the module doc."""
    if (opts.world_size or 1) <= 1:
        if isinstance(dst, str) and dst.startswith("s3://"):
            from autotune_converters.objstore.upload import convert_to_bucket

            opts.validate()
            return convert_to_bucket(src, dst, opts, work_dir=work_dir, progress=progress)
        return conversion.convert(src, dst, opts, progress)
    t0 = time.monotonic()
    srcp, dstp, opts, fp, src_root, complete = conversion.prepare(src, dst, opts)
    if complete is not None:
        complete.rank, complete.world_size = opts.rank, opts.world_size
        return complete
    return convert_rank(srcp, dstp, opts, fp, src_root, progress, t0)


def convert_rank(srcp: Path, dstp: Path, opts: Any, fp: dict[str, Any], src_root: str,
                 progress: Any, t0: float) -> Any:
    """Rank `opts.rank` of `opts.world_size`: plan (rank 0) or wait for the plan, write
    this rank's units, and finalize when it is the last. Returns a ConvertResult
    (finalized=False while other ranks' units are missing)."""
    res = _convert_rank(srcp, dstp, opts, fp, src_root, progress, t0)
    if (dstp / MANIFEST_NAME).exists():
        # Published while another rank still held its lock: the finalizer left the work
        # folder to the last rank out (remove_stale: only once every rank's lock is free).
        WorkDir(dstp).remove_stale()
    return res


def _convert_rank(srcp: Path, dstp: Path, opts: Any, fp: dict[str, Any], src_root: str,
                  progress: Any, t0: float) -> Any:
    from autotune_converters.conversion import RunState, _os_error, _write_units
    from autotune_converters.images import SampleOptions

    world, rank = int(opts.world_size), int(opts.rank)
    wd = WorkDir(dstp, rank=rank)
    lock = _rank_lock(wd, rank).acquire()
    run = RunState()
    plan: Plan | None = None
    try:
        try:
            if rank == 0:
                plan = _plan_as_rank0(srcp, wd, opts, fp, src_root, progress, t0, world)
            else:
                plan = _await_plan(srcp, wd, opts, fp, src_root, progress, t0, world, rank)
            if plan is None:  # the manifest appeared while waiting: another run finished it
                return _already(dstp, fp, opts, rank, world)
            _check_state(wd, rank)
            _forget_other_plans(wd, plan, world, rank)
            wd.clear_tmp()
            _write_state(wd, rank, world, finished=False)
            sample_opts = SampleOptions(root=src_root, verify=opts.verify,
                                        max_side=opts.max_side, quality=opts.quality)
            writer = registry.get(opts.format).writer_class()(dstp, wd, plan, opts, sample_opts)
            results, _ = _write_units(writer, plan, opts, progress, t0, run,
                                      only=lambda u: u % world == rank)
            # Every shard this rank renamed and every record it wrote, durable before it
            # says so (the records were written without fsync, one per unit).
            fsync_dir(dstp)
            fsync_dir(wd.done)
            _write_state(wd, rank, world, finished=True)
        except OSError as e:
            raise _os_error(e, dstp, run) from e
        mine = [r for r in results if r.unit % world == rank]
        run.resumed_units = len(mine) - run.units_written  # this rank's, not the others'
        res = _rank_result(dstp, plan, opts, mine, run, t0, rank, world)
        done = finalize_if_complete(dstp, wd, plan, opts, me=rank)
        if done is not None:
            res.finalized, res.manifest = True, str(dstp / MANIFEST_NAME)
        else:
            res.finalized = (dstp / MANIFEST_NAME).exists()
            res.waiting_for = [] if res.finalized else _ranks_missing(wd, plan, world)
        return res
    finally:
        conversion.close_run(plan, wd)
        lock.release()


def _plan_as_rank0(srcp: Path, wd: WorkDir, opts: Any, fp: dict[str, Any], src_root: str,
                   progress: Any, t0: float, world: int) -> Plan:
    """Reuse or make the plan under the DST lock and publish dist.json."""
    from autotune_converters.conversion import _differs, _same_source, _scan_and_plan

    wd.lock()  # refuses a single-process conversion or a finalizer that holds DST
    try:
        plan = Plan.load(wd.plan)
        if plan is not None and plan.fingerprint != fp:
            plan.close()
            raise UsageError(_differs(wd.dst, "a partial conversion", plan.fingerprint, fp))
        old = wd.read_dist()
        if plan is None:
            if old is not None:
                # The plan is a cache of the scan; a rebuilt one must be the same plan.
                plan = _rescan_keeping(srcp, wd, opts, fp, src_root, progress, t0)
            else:
                plan = _scan_and_plan(srcp, wd, opts, fp, src_root, progress, t0)
        else:  # a resume: SRC scanned again, as a single process's resume does
            try:
                _same_source(srcp, wd, plan, opts, fp, src_root, progress, t0)
            except BaseException:
                plan.close()
                raise
        h = plan.content_hash()
        if old is not None and old.get("plan") != h:
            plan.close()
            raise ConvertError(
                f"{wd.dst}: the ranks were converting plan {short(old.get('plan'))} "
                f"(dist.json), but SRC {src_root} now gives plan {short(h)}: SRC changed "
                "since this conversion started. Restore SRC, or convert into an emptied DST.")
        if old is not None and old.get("world_size") != world:
            busy = {r: h_ for r, h_ in wd.running_ranks().items() if r != 0}
            if busy:
                r, holder = sorted(busy.items())[0]
                plan.close()
                raise UsageError(
                    f"{wd.dst}: its ranks run with world size {old.get('world_size')} (rank "
                    f"{r}: {holder}), not {world}; give every rank the same world size.",
                    setting="world_size")
        try:
            _check_room_whole(wd, plan, opts, src_root)
        except BaseException:
            plan.close()
            raise
        if old is None or old.get("world_size") != world:
            # A new world size is fine once the old ranks are gone: units do not depend on it.
            write_json_atomic(wd.dist, {"version": DIST_VERSION, "world_size": world,
                                        "plan": h, "units": plan.units,
                                        "format": opts.format, "published_by": _me()})
            fsync_dir(wd.path)
        wd.plan_id = h
        return plan
    finally:
        wd.unlock()


def _check_room_whole(wd: WorkDir, plan: Plan, opts: Any, src_root: str) -> None:
    """NoRoom unless DST's filesystem has room for every unit still to write, by any rank.

    Ranks share DST's filesystem, so its room is checked once, by the planner (rank 0),
    against the whole, before it publishes the plan (a fresh run's other ranks wait for
    it and have written nothing). A check per rank against its own share would pass W
    shares that each fit the free space but together do not; a check in every rank
    against the whole would count the units the others are already writing, whose
    temporaries have taken space, and refuse a run that fits. On a refusal the other
    ranks of a fresh run wait for a plan that does not come (plan_timeout; torchrun and
    `srun --kill-on-bad-exit` stop them when rank 0 fails)."""
    from autotune_converters.images import SampleOptions
    from autotune_converters.space import check_room

    writer = registry.get(opts.format).writer_class()(
        wd.dst, WorkDir(wd.dst), plan, opts, SampleOptions(root=src_root))
    try:
        done = writer.open()  # reads the records of the units written; writes nothing
        pending = writer.pending()
    finally:
        writer.close()
    check_room(wd.dst, plan, pending, opts.max_side, resumed=len(done))


def _rescan_keeping(srcp: Path, wd: WorkDir, opts: Any, fp: dict[str, Any], src_root: str,
                    progress: Any, t0: float) -> Plan:
    """A lost plan rebuilt without discarding the units the ranks wrote (they are checked
    against the new plan's hash)."""
    from autotune_converters.conversion import scan_into

    return scan_into(srcp, wd.plan, opts, fp, src_root, progress, t0)


def _await_plan(srcp: Path, wd: WorkDir, opts: Any, fp: dict[str, Any], src_root: str,
                progress: Any, t0: float, world: int, rank: int) -> Plan | None:
    """Scan SRC into this rank's own directory (rank 0 is scanning the same files), then
    wait for rank 0's plan and compare. None when the manifest appears meanwhile."""
    from autotune_converters.conversion import _differs, rescan_hash

    dstp = wd.dst
    my_hash = rescan_hash(srcp, wd.rank_dir(rank) / "scan", opts, fp, src_root, progress, t0)[0]
    deadline = time.monotonic() + opts.plan_timeout
    seen_world: Any = None
    while True:
        if (dstp / MANIFEST_NAME).exists():
            return None
        d = wd.read_dist()
        if d is not None:
            seen_world = d.get("world_size")
            plan = Plan.load(wd.plan)
            if plan is not None and plan.fingerprint != fp:
                plan.close()
                raise UsageError(_differs(dstp, "a partial conversion", plan.fingerprint, fp))
            if plan is not None and d.get("plan") != my_hash:
                plan.close()
                raise ConvertError(
                    f"{dstp}: rank {rank} plans {short(my_hash)} from SRC {src_root}, but "
                    f"rank 0 published plan {short(d.get('plan'))}: the ranks see different "
                    "files (SRC changed between them, or each node has its own copy). Make "
                    "SRC the same for every rank, then rerun; the units already written for "
                    "rank 0's plan are kept.")
            if plan is not None and seen_world == world:
                wd.plan_id = my_hash
                return plan
            if plan is not None:
                plan.close()
        if time.monotonic() >= deadline:
            what = (f"published it for world size {seen_world}, not {world}"
                    if seen_world is not None else "did not publish the plan")
            raise ConvertError(
                f"{dstp}: rank {rank} of {world} waited {opts.plan_timeout:g} s for rank 0, "
                f"which {what} ({wd.dist}); start rank 0 (RANK=0) with the same SRC, DST "
                "and world size, or wait longer (plan_timeout).", setting="plan_timeout")
        time.sleep(POLL_S)


def _check_state(wd: WorkDir, rank: int) -> None:
    """This rank's last run wrote for the plan now published, or it is refused."""
    try:
        st = json.loads((wd.rank_dir(rank) / "state.json").read_text())
    except (OSError, ValueError):
        return
    if st.get("plan") and st["plan"] != wd.plan_id:
        raise ConvertError(
            f"{wd.dst}: rank {rank} was converting plan {short(st['plan'])}, but the plan is "
            f"now {short(wd.plan_id)}: SRC changed between the ranks' runs. Restore SRC, or "
            "convert into an emptied DST.")


def _forget_other_plans(wd: WorkDir, plan: Plan, world: int, rank: int) -> None:
    """Records of this rank's units written for another plan are not results of this one."""
    for u in range(rank, plan.units, world):
        p = wd.read_done_plan(u)
        if p and p != wd.plan_id:
            try:
                wd.done_path(u).unlink()
            except FileNotFoundError:
                pass


def _write_state(wd: WorkDir, rank: int, world: int, *, finished: bool) -> None:
    write_json_atomic(wd.rank_dir(rank) / "state.json",
                      {"rank": rank, "world_size": world, "plan": wd.plan_id,
                       "finished": finished, "by": _me(), "time": time.time()})


def _rank_result(dstp: Path, plan: Plan, opts: Any, mine: list[Any], run: Any, t0: float,
                 rank: int, world: int) -> Any:
    import collections

    from autotune_converters.conversion import ConvertResult

    skipped = sorted((s for r in mine for s in r.skipped), key=lambda s: (s["path"], s["reason"]))
    kinds = collections.Counter(s["reason"].split(" (", 1)[0] for s in skipped)
    return ConvertResult(
        dst=str(dstp), format=opts.format, samples=sum(r.samples for r in mine),
        classes=len(plan.classes), shards=len(mine),
        output_bytes=sum(int((r.shard or {}).get("bytes", 0)) for r in mine),
        source_files=plan.num_entries, source_bytes=plan.planned_bytes,
        seconds=time.monotonic() - t0, skipped=skipped, skipped_by_kind=dict(kinds),
        ignored=plan.ignored, reencoded=sum(r.reencoded for r in mine),
        resumed_units=run.resumed_units, warnings=list(plan.warnings),
        read_bytes=run.read_bytes, processed=run.processed, engine=opts.engine, rank=rank,
        world_size=world, finalized=False, units_written=run.units_written)


def _already(dstp: Path, fp: dict[str, Any], opts: Any, rank: int, world: int) -> Any:
    from autotune_converters.conversion import _complete_result, _differs
    from autotune_converters.manifest import read_manifest

    m = read_manifest(dstp)
    if m.options != fp:
        raise UsageError(_differs(dstp, "a complete conversion", m.options, fp))
    res = _complete_result(dstp, m)
    res.rank, res.world_size = rank, world
    return res


# -- finalizing ----------------------------------------------------------------------------

def _missing_units(wd: WorkDir, plan: Plan, pending: list[int] | None = None) -> list[int]:
    """Units without a record for this plan, or (`pending`, from the writer) whose output
    is not whole under its final name yet."""
    out = set(pending or ())
    for u in range(plan.units):
        p = wd.read_done_plan(u)
        if p is None or (p and p != wd.plan_id):
            out.add(u)
    return sorted(out)


def _ranks_missing(wd: WorkDir, plan: Plan, world: int) -> list[int]:
    return sorted({u % world for u in _missing_units(wd, plan)})


def _options_of(plan: Plan) -> Any:
    """The ConvertOptions a plan was made with (from its fingerprint)."""
    from autotune_converters.conversion import ConvertOptions

    fp = plan.fingerprint
    keys = ("format", "seed", "verify", "max_side", "quality", "shard_size", "readers",
            "file_list")
    return ConvertOptions(**{k: fp[k] for k in keys if k in fp})


def finalize_if_complete(dstp: Path, wd: WorkDir, plan: Plan, opts: Any,
                         missing: list[int] | None = None, me: int | None = None) -> Any:
    """Publish manifest.json when every unit is written for this plan; None when some are
    missing (their numbers appended to `missing`) or the manifest is already there.
    Waits for another finalizer to let go first."""
    lock = PidLock(wd.path / "finalize.lock", lambda holder: ConvertError(
        f"{dstp}: another process ({holder}) has been finalizing for "
        f"{FINALIZE_WAIT_S:g} s; rerun `autotune convert --finalize` when it is done."),
        tag=_me()).acquire(wait=FINALIZE_WAIT_S)
    try:
        if (dstp / MANIFEST_NAME).exists():
            return None
        return _publish(dstp, wd, plan, opts, missing, me)
    finally:
        lock.release()


def _publish(dstp: Path, wd: WorkDir, plan: Plan, opts: Any, missing: list[int] | None,
             me: int | None = None) -> Any:
    """When every unit is recorded for this plan and the writer finds each output whole,
    let it publish, then write the manifest (last) and remove the work directory, unless
    a rank other than `me` still holds its lock: its last unit is recorded, but it may
    still be syncing its records and state in there (it removes the folder as it leaves)."""
    from autotune_converters.conversion import _manifest
    from autotune_converters.images import SampleOptions

    sample_opts = SampleOptions(root=plan.source["root"], verify=opts.verify,
                                max_side=opts.max_side, quality=opts.quality)
    writer = registry.get(plan.fingerprint["format"]).writer_class()(
        dstp, WorkDir(dstp), plan, opts, sample_opts)
    try:
        done = writer.open()
        todo = _missing_units(wd, plan, writer.pending())
        if todo:
            if missing is not None:
                missing.extend(todo)
            return None
        results = sorted(done, key=lambda r: r.unit)
        shards = writer.publish(results)
    finally:
        writer.close()
    m = _manifest(plan, opts, plan.fingerprint, results, shards, wd, writer.LAYOUT)
    wd.clear_tmp()  # a killed finalizer's half-written manifest, if any
    write_manifest(dstp, m, wd.tmp)
    if any(r != me for r in wd.running_ranks()):
        wd.unlock()
    else:
        wd.remove()
    return m


def _missing_message(dstp: Path, units: list[int], total: int, world: int, what: str) -> str:
    by_rank: dict[int, list[int]] = {}
    for u in units:
        by_rank.setdefault(u % world, []).append(u)
    parts = []
    for r, us in sorted(by_rank.items())[:8]:
        shown = ", ".join(map(str, us[:5])) + (f" and {len(us) - 5} more" if len(us) > 5 else "")
        parts.append(f"rank {r}: unit{'s' if len(us) > 1 else ''} {shown}")
    ranks = sorted(by_rank)
    return (f"{dstp}: {len(units)} of {total} units {what} ({'; '.join(parts)}); run "
            f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks[:8]))} of {world} "
            "again (each resumes), then finalize.")


def finalize(dst: str | os.PathLike[str], *, src: str | os.PathLike[str] | None = None,
             format: str | None = None) -> Any:
    """Check every unit's record and publish DST/manifest.json; the world size comes from
    the plan. Already published: nothing to do (already_complete). Units missing: a
    ConvertError naming them and their ranks."""
    from autotune_converters.conversion import ConvertResult, _complete_result
    from autotune_converters.manifest import read_manifest

    t0 = time.monotonic()
    dstp = Path(dst)
    if (dstp / MANIFEST_NAME).exists():
        m = read_manifest(dstp)
        _expect(dstp, m.options, src, format)
        WorkDir(dstp).remove_stale()
        return _complete_result(dstp, m)
    wd = WorkDir(dstp)
    if not wd.exists():
        raise UsageError(f"{dstp}: no conversion here (neither manifest.json nor a work "
                         "directory); run the ranks of `autotune convert` first.")
    d = wd.read_dist()
    plan = Plan.load(wd.plan)
    if d is None or plan is None:
        if plan is not None:
            plan.close()
        raise ConvertError(f"{dstp}: rank 0 has not published a plan yet ({wd.dist}); start "
                           "the ranks (rank 0 scans and plans), then finalize.")
    try:
        _expect(dstp, plan.fingerprint, src, format)
        wd.plan_id = plan.content_hash()
        if wd.plan_id != d.get("plan"):
            raise ConvertError(f"{dstp}: the plan on disk is {short(wd.plan_id)} but the ranks "
                               f"were given {short(d.get('plan'))}; rerun rank 0.")
        opts = _options_of(plan)
        world = int(d.get("world_size") or 1)
        missing: list[int] = []
        m = finalize_if_complete(dstp, wd, plan, opts, missing)
        if missing:
            raise ConvertError(_missing_message(dstp, missing, plan.units, world,
                                                "not written yet"))
    finally:
        plan.close()
    if m is None:  # another finalizer published it meanwhile
        m = read_manifest(dstp)
        res = _complete_result(dstp, m)
    else:
        res = _complete_result(dstp, m)
        res.already_complete = False
    res.seconds = time.monotonic() - t0
    res.world_size = world
    res.finalized = True
    assert isinstance(res, ConvertResult)
    return res


def _expect(dstp: Path, fp: dict[str, Any], src: Any, format: str | None) -> None:
    if format is not None and fp.get("format") != format:
        raise UsageError(f"{dstp}: a {fp.get('format')} conversion, not {format}.",
                         setting="format")
    if src is not None and fp.get("source") != os.path.abspath(src):
        raise UsageError(f"{dstp}: converts {fp.get('source')}, not {os.path.abspath(src)}.")


__all__ = ["convert", "convert_rank", "finalize", "ranks_from_env"]
