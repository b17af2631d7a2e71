"""The writer contract: the base class of every output format, which owns the lifecycle of
a conversion's output.

A conversion is cut into *units* (see autotune_converters.records) fixed by the plan. A writer
(`FormatWriter`) says which units are still to do, does the part of a unit that can run in
a worker process (`work`), takes the results in unit order in the parent (`accept`) and
publishes the finished output (`publish`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from autotune_base.errors import ConvertError
from autotune_base.fsutil import fsync_dir
from autotune_converters.records import Sample, SkippedFile, UnitResult, report_progress


class FormatWriter(ABC):
    """Writes the units of a plan in one output format; the base owns the lifecycle.

    `run(execute)` drives it, and the public methods refuse to be called out of order:

        open()                   resume state: the results of units already durable
        pending() -> [unit]      the units still to write, ascending
        work(unit)               in a worker process (or inline): the part that scales
        accept(unit, out)        in unit order: store/commit, returns the UnitResult
        publish(results)         make the output final (fsync, checksum, rename), then
                                 fsync DST so every published name is durable
        close()                  release handles; always, also after an error; twice is fine

    A format implements the underscored hooks (`_open`, `_pending`, `work`, `_accept`,
    `_publish`, `_close`). Instances are pickled to worker processes before `open()`: keep
    `work`'s state picklable and open files lazily in the process that uses them.

    Class attributes a format sets: `format` (its registry name), `LAYOUT` (how it
    stores samples, for the manifest), `sharded` (units are shards cut for `readers`
    readers; else commit batches of `shard_size` bytes), `output_noun` (for summaries),
    `open_ahead_thread` (the source files opened ahead by a thread of their own), and
    `results_in_flight(workers)` (how many unit results may wait for `accept`);
    `workers(requested)` may use fewer processes than --workers asks for.
    """

    format: str = "?"
    LAYOUT: str = ""
    sharded: bool = False
    output_noun: str = "files"
    open_ahead_thread: bool = False

    def __init__(self, dst: Path, workdir: Any, plan: Any, opts: Any, sample_opts: Any) -> None:
        self.dst = dst
        self.workdir = workdir  # autotune_converters.workdir.WorkDir
        self.plan = plan  # autotune_converters.plan.Plan
        self.opts = opts  # autotune_converters.conversion.ConvertOptions
        self.sample_opts = sample_opts  # autotune_converters.images.SampleOptions
        self._state = "new"
        self._todo: list[int] = []

    @staticmethod
    def results_in_flight(workers: int) -> int:
        return 2 * workers

    def workers(self, requested: int) -> int:
        """How many worker processes to use of the `requested` (--workers): a format
        whose units are cheaper to do in the writing process than to hand over says 1."""
        return requested

    # -- the lifecycle (final: formats implement the hooks) -------------------------------

    def run(self, execute: Callable[[list[int], Callable[[int], Any]], Iterator[tuple[int, Any]]],
            *, on_open: Callable[[list[UnitResult], list[int]], None] | None = None,
            on_unit: Callable[[int], None] | None = None,
            only: Callable[[int], bool] | None = None) -> tuple[list[UnitResult], list[dict[str, Any]]]:
        """open -> work and accept every pending unit -> publish -> close.

        execute(units, work) yields (unit, work(unit)) for each unit, in unit order (inline,
        worker processes or Ray tasks). Returns every unit's result (earlier runs' included)
        and the manifest's shards[] entries.

        only(unit): write just the pending units it accepts (one rank's share) and do not
        publish: another process finalizes once every unit is written (shards[] is then
        empty). Only formats whose units are independent files (`sharded`) allow it."""
        if only is not None and not self.sharded:
            raise RuntimeError(f"{type(self).__name__}: only sharded formats can write a share "
                               "of the units (one writer owns the output otherwise).")
        try:
            done = self.open()
            results = {r.unit: r for r in done}
            if only is not None:
                self._todo = [u for u in self._todo if only(u)]
            todo = self.pending()
            if on_open:
                on_open(done, todo)
            outs = execute(todo, self.work)
            try:
                for unit, out in outs:
                    results[unit] = self.accept(unit, out)
                    if on_unit:
                        on_unit(unit)
            finally:
                close = getattr(outs, "close", None)
                if close is not None:  # stop the workers now, not when garbage-collected
                    close()
            ordered = [results[u] for u in sorted(results)]
            if only is not None:
                return ordered, []
            return ordered, self.publish(ordered)
        finally:
            self.close()

    def open(self) -> list[UnitResult]:
        self._expect("open", "new")
        done = self._open()
        self._state = "open"
        self._todo = self._pending()
        return done

    def pending(self) -> list[int]:
        self._expect("pending", "open")
        return list(self._todo)

    def accept(self, unit: int, out: Any) -> UnitResult:
        self._expect(f"accept({unit})", "open")
        if not self._todo or unit != self._todo[0]:
            nxt = self._todo[0] if self._todo else "none (all accepted)"
            raise RuntimeError(f"{type(self).__name__}.accept({unit}) out of order: units are "
                               f"accepted in ascending order, and the next pending unit is "
                               f"{nxt}; a format's output must not depend on which worker "
                               "finishes first.")
        res = self._accept(unit, out)
        self._todo.pop(0)
        return res

    def publish(self, results: list[UnitResult]) -> list[dict[str, Any]]:
        self._expect("publish", "open")
        if self._todo:
            raise RuntimeError(f"{type(self).__name__}.publish() with {len(self._todo)} unit(s) "
                               f"still pending (first: {self._todo[0]}): publish makes the "
                               "output final, so every unit must be accepted first.")
        shards = self._publish(results)
        fsync_dir(self.dst)  # every published name durable before the manifest is written
        self._state = "published"
        return shards

    def close(self) -> None:
        if self._state != "closed":
            self._state = "closed"
            self._close()

    def _expect(self, call: str, state: str) -> None:
        if self._state != state:
            raise RuntimeError(
                f"{type(self).__name__}.{call} called when the writer is {self._state}, not "
                f"{state}: the lifecycle is open() -> pending() -> work()/accept() for each "
                "pending unit in order -> publish() -> close(); FormatWriter.run() drives it.")

    # -- what a format implements ------------------------------------------------------

    @abstractmethod
    def _open(self) -> list[UnitResult]:
        """Prepare for writing; return the results of the units a previous run finished."""

    @abstractmethod
    def _pending(self) -> list[int]:
        """Units still to write, ascending (called once, after `_open`)."""

    @abstractmethod
    def work(self, unit: int) -> Any:
        """Process one unit in a worker; the return value goes to `accept` (picklable)."""

    @abstractmethod
    def _accept(self, unit: int, out: Any) -> UnitResult:
        """Take a unit's work in unit order; return its result once durable."""

    @abstractmethod
    def _publish(self, results: list[UnitResult]) -> list[dict[str, Any]]:
        """Make the output final; return the manifest's shards[] entries."""

    def _close(self) -> None:
        """Release open handles (also after an error)."""

    # -- shared by the formats -----------------------------------------------------------

    def samples(self, unit: int) -> Iterator[Sample | SkippedFile]:
        """The unit's samples read and checked (in a worker), each with its own bytes;
        with --on-error fail the first bad file raises ConvertError naming it."""
        return self.samples_into(unit, lambda entry: None)

    def samples_into(self, unit: int, dest: Callable[[Any], memoryview | None]
                     ) -> Iterator[Sample | SkippedFile]:
        """The unit's samples read and checked, the next files' reads already started
        (autotune_converters.sourceread; by a thread of their own where the format sets
        `open_ahead_thread`). `dest(entry)` gives the buffer to read the file into (the
        Sample's data is then a view of it, valid until the next sample), or None for a
        `bytes` of its own."""
        from autotune_converters.images import check_sample, unreadable
        from autotune_converters.sourceread import prefetch, read_into, read_whole

        opts = self.sample_opts
        fail = self.opts.on_error == "fail"
        if opts.root.startswith("s3://"):
            yield from self._object_samples(unit, dest, fail)
            return
        for entry, fd in prefetch(opts.root, self.plan.entries(unit),
                                  thread=self.open_ahead_thread):
            if isinstance(fd, OSError):
                s: Sample | SkippedFile = unreadable(entry, fd)
            else:
                mv = dest(entry)
                try:
                    got = read_into(fd, mv) if mv is not None else read_whole(fd, entry.size)
                except OSError as e:
                    s = unreadable(entry, e)
                else:
                    s = check_sample(entry, mv[:got] if isinstance(got, int) else got, opts)
            report_progress(1, entry.size)
            if fail and isinstance(s, SkippedFile):
                raise ConvertError(s.message(opts.root))
            yield s

    def _object_samples(self, unit: int, dest: Callable[[Any], memoryview | None], fail: bool
                        ) -> Iterator[Sample | SkippedFile]:
        """samples_into for a bucket (autotune_converters.sourceread.fetch_ahead): each object's bytes
        copied into `dest` as a file's would be read into it (or kept when they do not fit,
        as a file that grew since the scan)."""
        from autotune_converters.images import check_sample
        from autotune_converters.sourceread import fetch_ahead

        opts = self.sample_opts
        for entry, got in fetch_ahead(opts.root, self.plan.dir, self.plan.entries(unit),
                                      endpoint_url=getattr(self.opts, "endpoint_url", None)):
            if isinstance(got, SkippedFile):
                s: Sample | SkippedFile = got
            else:
                mv = dest(entry)
                if mv is not None and len(got) <= len(mv):
                    mv[:len(got)] = got
                    s = check_sample(entry, mv[:len(got)], opts)
                else:
                    s = check_sample(entry, got, opts)
            report_progress(1, entry.size)
            if fail and isinstance(s, SkippedFile):
                raise ConvertError(s.message(opts.root))
            yield s
