"""One LMDB environment, written by one process in commit batches, values appended.

LMDB has a single writer. With the default header checks the writing process reads the
samples itself: one thread opens the next files ahead with their readahead hints (which
submit the files' reads: a thread of its own, as that was the longest of the three), a
read-ahead thread reads each into a pooled buffer after its value header and checks it,
while the writing thread puts the values (`append=True`, keys in order) and commits
(py-lmdb releases the GIL in both); handing batches over from worker processes would
copy every byte three times (pickle, pipe, unpickle). Only when a sample costs a decode
(`--verify decode`, `--max-side`) do `--workers` processes read, check and re-encode the
samples of a batch.
Either way the batches are committed in plan order, each in one transaction together
with the progress record (`#progress`: next batch, samples so far, map size).
A killed run's rerun reads that record and continues with the next batch: exactly where
it stopped, nothing twice, nothing missing.

Environment options: writemap=False (a crash cannot scribble over the map through stray
pointers, and the file only grows by what is written); lock=False (this conversion holds
its own lock on DST, and readers open read-only with lock=False too, so no lock.mdb is
needed); sync=True (each commit's pages are on the disk before its meta page is
written). metasync=False for the batches: a batch's meta page reaches the disk with the
next commit's sync, one flush per commit instead of two; a power loss can then undo the
last committed batch, which the rerun writes again from the record before it (the same
as being killed before that commit). The last commit, which makes the environment
complete, has metasync=True, so what is hashed and published is all durable.
The map starts at 1.25 x the source bytes + 64 MiB (or `map_size`) and doubles on
MapFullError: the batch is aborted, the map grown, the batch retried.

Every commit runs in a freshly opened environment. An open environment keeps state
between transactions (the free pages it has reclaimed), so a run resumed with a new
handle would place pages differently from an uninterrupted one; with a fresh handle per
commit both runs make the same sequence of (open, transaction, close) on the same file,
and the resumed data.mdb is byte-identical (tested with kill -9).

The environment is written in DST/.autotune-convert/lmdb/ and renamed to DST/data.mdb
after the last commit, an fsync and its sha256: DST never holds a partial data.mdb. Its
index, DST/data.idx (where each value lies in data.mdb, see lmdb_layout), is built from
the finished environment and published the same way, before data.mdb.
"""

from __future__ import annotations

import errno
import json
import os
from typing import Any

from autotune_base.beneath import plain_name
from autotune_base.errors import ConvertError
from autotune_base.fsutil import fsync_dir, sha256_file, write_json_atomic
from autotune_converters.lmdb.heap import KeptHeap
from autotune_converters.lmdb.layout import (
    DESCRIPTION,
    INDEX_FILE,
    LAYOUT_VERSION,
    META_KEY,
    PROGRESS_KEY,
    encode_value,
    key,
    value_head,
)
from autotune_converters.records import Sample, SkippedFile, UnitResult
from autotune_converters.writer import FormatWriter

DATA_FILE = "data.mdb"
LAYOUT = DESCRIPTION + f"; {INDEX_FILE}: u64 offset, u32 length, u32 label per sample"
_MiB = 1 << 20
# Below this mean file size the per-file work outweighs the bytes: workers read and check
# the files (LmdbWriter.workers). 200,000 files of 2.8 KB: 2,862 files/s in the writing
# process alone, 6,739 with 2 workers (2026-12-04).
SMALL_FILE = 16 << 10


def initial_map_size(source_bytes: int) -> int:
    return ((source_bytes * 5 // 4 + 64 * _MiB) // _MiB + 1) * _MiB


class LmdbWriter(FormatWriter):
    format = "lmdb"
    LAYOUT = LAYOUT
    output_noun = "files (data.mdb, data.idx)"
    @property
    def open_ahead_thread(self) -> bool:  # type: ignore[override]
        """In the writing process the files' opens and readahead hints run in a thread
        beside the read-ahead's reads and checks (sourceread.prefetch): that thread was
        the conversion's longest. A worker process (small files) opens them itself: it
        has a core of its own, and handing each file between two threads cost more than
        it saved (200,000 files of 2.8 KB, 2 workers, warm: the writing 13.9 s against
        17.1 s, cold 22-24 s against 24-26 s)."""
        return self._in_writer()

    def _in_writer(self) -> bool:
        """True in the process that opened the environment (a worker gets this writer
        pickled before `open()`, without `_writer_pid`)."""
        return os.getpid() == getattr(self, "_writer_pid", None)

    @staticmethod
    def results_in_flight(workers: int) -> int:
        return workers + 1  # each result carries a batch of image bytes until its commit

    _env: Any = None

    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        d["_env"] = None  # an environment never crosses into a worker
        d["_ahead"] = None
        d["_heap"] = None
        return d

    # -- resume ------------------------------------------------------------------------

    def _open(self) -> list[UnitResult]:
        import lmdb

        self._writer_pid = os.getpid()
        self._ahead: _ReadAhead | None = None
        # Each commit frees its batch's pages: keep them for the next batch (heap.py).
        self._heap = KeptHeap(2 * max(self.plan.unit_sizes, default=0) + 64 * _MiB)
        self._heap.hold()
        self._published = self._read_published()
        self._complete = False
        if self._published is not None:  # killed after publishing, before the manifest
            self._next = self.plan.units
            return self._load_results(self.plan.units)
        self.workdir.lmdb.mkdir(parents=True, exist_ok=True)
        progress = {"next_unit": 0, "samples": 0,
                    "map_size": self.opts.map_size or initial_map_size(self.plan.planned_bytes)}
        if (self.workdir.lmdb / DATA_FILE).exists():
            env = lmdb.open(str(self.workdir.lmdb), readonly=True, lock=False, subdir=True)
            try:
                with env.begin() as txn:
                    raw = txn.get(PROGRESS_KEY)
                    self._complete = txn.get(META_KEY) is not None
            finally:
                env.close()
            if raw is not None:
                progress = json.loads(raw)
        self._next = self.plan.units if self._complete else int(progress["next_unit"])
        self._count = int(progress["samples"])
        # The map size a resumed run opens with is the one the interrupted run had
        # committed, so map growth (recorded in the meta page) happens at the same points.
        self._map_size = int(progress["map_size"])
        return self._load_results(self._next)

    def _commit(self, write: Any, batch_bytes: int, *, last: bool = False) -> None:
        """Run `write(txn)` in one transaction of a fresh environment; grow and retry
        on MapFullError."""
        import lmdb

        while True:
            env = lmdb.open(str(self.workdir.lmdb), map_size=self._map_size, subdir=True,
                            lock=False, writemap=False, readahead=False, meminit=True,
                            sync=True, metasync=last, max_dbs=0)
            self._env = env
            try:
                txn = env.begin(write=True)
                try:
                    write(txn)
                    txn.commit()
                    return
                except lmdb.MapFullError:
                    txn.abort()
                except lmdb.Error as e:
                    txn.abort()
                    raise self._write_error(e, batch_bytes) from None
                except BaseException:
                    txn.abort()
                    raise
                # Deterministic in (size, batch): a resumed run grows at the same points.
                self._map_size = max(2 * self._map_size,
                                     self._map_size + 2 * batch_bytes + 16 * _MiB)
            finally:
                env.close()
                self._env = None

    def _load_results(self, upto: int) -> list[UnitResult]:
        out = []
        for u in range(upto):
            r = self.workdir.read_done(u)
            if r is None:
                raise ConvertError(f"{self.workdir.done_path(u)}: the record of committed batch "
                                   f"{u} is missing; delete {self.dst} and convert again.")
            out.append(r)
        return out

    def _read_published(self) -> list[dict[str, Any]] | None:
        try:
            path = self.workdir.path / "published.json"
            pub = json.loads(path.read_text())
            for i, f in enumerate(pub):  # the names go into the manifest: inside DST only
                plain_name(f["file"], str(path), f"[{i}].file")
            if all((self.dst / f["file"]).stat().st_size == f["bytes"] for f in pub):
                return pub
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return None

    def _pending(self) -> list[int]:
        return list(range(self._next, self.plan.units))

    # -- writing -----------------------------------------------------------------------

    def _write_error(self, e: Exception, batch_bytes: int) -> Exception:
        """LMDB reports a full disk as EIO (a short write): say what it is."""
        path = str(self.workdir.lmdb / DATA_FILE)
        try:
            st = os.statvfs(self.workdir.lmdb)
            full = st.f_bavail * st.f_frsize < batch_bytes + 16 * _MiB
        except OSError:
            full = False
        if full or "No space" in str(e):
            return OSError(errno.ENOSPC, f"No space left on device (LMDB: {e})", path)
        return ConvertError(f"{path}: LMDB write failed ({e}); check the disk, then rerun the "
                            "same command to resume from the last committed batch.")

    def workers(self, requested: int) -> int:
        """Worker processes when a sample's checks cost more than its bytes' hand-over:
        a decode (verify=decode, or a re-encode), or the header checks of small files
        (mean under SMALL_FILE: a file's per-file work, its open, read, check and hand-
        over between this process's threads, is then most of the conversion; 200,000
        files of 2.8 KB: 69.9 s in this process alone, 29.7 s with 2 workers). For
        larger files handing a batch's bytes to this process (pickle, pipe, unpickle:
        three copies) costs more than reading it here, with the next files' reads
        started ahead (autotune_converters.sourceread)."""
        if self.opts.verify == "decode" or self.opts.max_side:
            return requested
        src = self.plan.source
        if src.get("files") and src.get("bytes", 0) / src["files"] < SMALL_FILE:
            return requested
        return 1

    def work(self, unit: int) -> list[Sample | SkippedFile] | None:
        if self._in_writer():
            return None  # in the writing process: _accept reads the batch into the txn
        return list(self.samples(unit))  # each Sample with bytes of its own (dest: None)

    def _accept(self, unit: int, out: list[Sample | SkippedFile] | None) -> UnitResult:
        assert unit == self._next, (unit, self._next)
        count = self._count
        state: dict[str, Any] = {"attempt": 0}
        if out is None and self._ahead is None:
            self._ahead = _ReadAhead(self, list(range(unit, self.plan.units)),
                                     budget=_ReadAhead.budget_for(max(self.plan.unit_sizes)))

        def put_all(txn: Any, items: Any) -> UnitResult:
            res = UnitResult(unit=unit, samples=0, source_bytes=0, stored_bytes=0)
            for s, v, buf in items:
                if isinstance(s, SkippedFile):
                    res.skipped.append(s.to_dict())
                elif v is not None:  # read in place, after its header
                    txn.put(key(count + res.samples), v, append=True)
                else:
                    txn.put(key(count + res.samples), encode_value(s.label, s.relpath, s.data),
                            append=True)
                if buf is not None:
                    self._ahead.give_back(buf)
                if isinstance(s, SkippedFile):
                    continue
                res.samples += 1
                res.source_bytes += s.source_bytes
                res.stored_bytes += len(s.data)
                res.reencoded += s.reencoded
            return res

        def write(txn: Any) -> None:
            import lmdb

            state["attempt"] += 1
            if out is not None:
                items = ((s, None, None) for s in out)
            elif state["attempt"] == 1:
                items = self._ahead.unit(unit)
            else:  # a retry after MapFullError: the read-ahead has moved on; read again here
                items = ((s, None, None) for s in self.samples(unit))
            try:
                res = put_all(txn, items)
            except lmdb.MapFullError:
                if out is None and state["attempt"] == 1:
                    self._ahead.skip(unit)
                raise
            # The record first: a kill before the commit only leaves a record the rerun
            # rewrites; after the commit, the record is there for the summary and manifest.
            self.workdir.write_done(res)
            txn.put(PROGRESS_KEY, json.dumps(
                {"next_unit": unit + 1, "samples": count + res.samples,
                 "map_size": self._map_size}, sort_keys=True).encode())
            state["res"] = res

        # Map growth is sized by the unit's planned source bytes: the same whether the
        # batch was read here or by workers, so the file is the same either way.
        self._commit(write, self.plan.unit_sizes[unit])
        res = state["res"]
        self._count += res.samples
        self._next = unit + 1
        return res

    def _publish(self, results: list[UnitResult]) -> list[dict[str, Any]]:
        if self._published is None:
            samples = sum(r.samples for r in results)
            self._finish_env(samples)
            env_dir = self.workdir.lmdb
            size, sha = self._hash_and_index(samples)
            idx = env_dir / INDEX_FILE
            isize, isha = sha256_file(idx)
            # The index lists no samples of its own: the manifest's sample counts add up.
            pub = [{"file": DATA_FILE, "samples": samples, "bytes": size, "sha256": sha},
                   {"file": INDEX_FILE, "samples": 0, "bytes": isize, "sha256": isha}]
            write_json_atomic(self.workdir.path / "published.json", pub)
            os.replace(idx, self.dst / INDEX_FILE)
            os.replace(env_dir / DATA_FILE, self.dst / DATA_FILE)
            fsync_dir(self.dst)
            self._published = pub
        return [dict(f) for f in self._published]

    def _hash_and_index(self, samples: int) -> tuple[int, str]:
        """(bytes, sha256) of the finished data.mdb, and its index written to data.idx.

        One sequential read that walks LMDB's pages (autotune_converters.lmdb.pages) and
        is checked against LMDB's own answer for a spread of keys; where that reader
        does not know the file, LMDB locates every value, while a thread hashes."""
        from autotune_converters.lmdb.pages import PageFormatError, hash_and_index

        path = self.workdir.lmdb / DATA_FILE
        try:
            size, sha, idx = hash_and_index(str(path), samples)
            picks = sorted({0, samples - 1, *range(0, samples, max(1, samples // 16))})
            if samples and (self._lmdb_index(picks) != idx[picks]).any():
                raise PageFormatError("the pages' index differs from LMDB's own")
        except PageFormatError:
            # hashlib and the reads release the GIL: both passes run at once
            return _in_thread(sha256_file, path,
                              lambda: self._save_index(self._lmdb_index(range(samples))))
        self._save_index(idx)
        return size, sha

    def _lmdb_index(self, keys: Any) -> Any:
        from autotune_converters.lmdb.pages import index_through_lmdb

        return index_through_lmdb(self.workdir.lmdb / DATA_FILE, keys)

    def _save_index(self, idx: Any) -> None:
        with open(self.workdir.lmdb / INDEX_FILE, "wb") as f:
            f.write(idx.tobytes())
            f.flush()
            os.fsync(f.fileno())

    def _finish_env(self, num_samples: int) -> None:
        if not self._complete:
            meta = json.dumps({"layout_version": LAYOUT_VERSION, "layout": DESCRIPTION,
                               "num_samples": num_samples,
                               "num_classes": len(self.plan.classes),
                               "classes": self.plan.classes}, sort_keys=True).encode()

            def write(txn: Any) -> None:
                txn.delete(PROGRESS_KEY)
                txn.put(META_KEY, meta)

            self._commit(write, len(meta), last=True)
            self._complete = True

    def _close(self) -> None:
        if getattr(self, "_ahead", None) is not None:
            self._ahead.stop()
            self._ahead = None
        if self._env is not None:
            self._env.close()
            self._env = None
        if getattr(self, "_heap", None) is not None:
            self._heap.release()
            self._heap = None


def _in_thread(fn: Any, arg: Any, meanwhile: Any) -> Any:
    """fn(arg) in a thread while meanwhile() runs here; fn's result (or its error)."""
    import threading

    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["r"] = fn(arg)
        except BaseException as e:  # noqa: BLE001 (re-raised below)
            out["e"] = e

    t = threading.Thread(target=run, name="autotune-lmdb-hash", daemon=True)
    t.start()
    try:
        meanwhile()
    finally:
        t.join()
    if "e" in out:
        raise out["e"]
    return out["r"]


class _Stopped(Exception):
    pass


class _ReadAhead:
    """A thread that reads and checks the pending batches' samples, in order, while the
    writing thread puts and commits the ones before: py-lmdb releases the GIL in put and
    commit, so reading, checking and LMDB's copying and syncing overlap on two cores.

    Each sample is read into a value slot (its header and path first, so the slot is the
    LMDB value), handed over, and the slot comes back after its put. Up to a batch of
    values (`budget` bytes, at most `SLOTS` samples) wait read ahead, so the next batch
    is read and checked while this one is written and synced, and its puts then only
    copy (64 buffers, as before, stopped the reads early in each commit and left the
    disk idle while the batch was read after it). The slots are one private anonymous
    mapping, resident only where used, and the most recently freed slot is taken first, so
    a run touches about its budget of them and small files cost only what they fill (taken
    in turn, every slot was filled: 256 MiB resident whatever the budget); a value larger
    than a slot gets a buffer of its own for its time in flight, within the same budget.
    """

    SLOT = 256 << 10
    SLOTS = 1024
    BUDGET = 32 << 20  # the least; a batch's bytes when larger (budget_for)
    BUDGET_MAX = 256 << 20

    @classmethod
    def budget_for(cls, batch_bytes: int) -> int:
        return max(cls.BUDGET, min(int(batch_bytes), cls.BUDGET_MAX))

    def __init__(self, writer: LmdbWriter, units: list[int], budget: int = BUDGET) -> None:
        import mmap
        import queue
        import threading

        self._q: queue.Queue[tuple[str, Any, Any, Any]] = queue.Queue()
        # Last in, first out: the slots just given back are reused, so a run keeps about
        # its budget of the arena resident (in turn, every slot was filled: 256 MiB).
        self._free: queue.LifoQueue[memoryview] = queue.LifoQueue()
        arena = memoryview(mmap.mmap(-1, self.SLOT * self.SLOTS, flags=mmap.MAP_PRIVATE))
        for i in range(self.SLOTS):
            self._free.put(arena[i * self.SLOT:(i + 1) * self.SLOT])
        self.budget = budget
        self._room = threading.Condition()
        self._inflight = 0  # bytes of values handed out and not given back
        self._stopping = threading.Event()
        self._t = threading.Thread(target=self._run, args=(writer, units), daemon=True,
                                   name="autotune-lmdb-read-ahead")
        self._t.start()

    def _buffer(self, need: int) -> tuple[memoryview, tuple[memoryview, int]]:
        """A buffer of at least `need` bytes and the token that gives it back."""
        import queue

        with self._room:
            while self._inflight and self._inflight + need > self.budget:
                if self._stopping.is_set():
                    raise _Stopped
                self._room.wait(0.1)
            self._inflight += need
        while True:
            if self._stopping.is_set():
                raise _Stopped
            try:
                slot = self._free.get(timeout=0.1)
            except queue.Empty:
                continue
            buf = slot if need <= len(slot) else memoryview(bytearray(need))
            return buf, (slot, need)

    def _run(self, writer: LmdbWriter, units: list[int]) -> None:
        try:
            for u in units:
                cur: dict[str, Any] = {}

                def dest(entry: Any, cur: dict[str, Any] = cur) -> memoryview:
                    head = value_head(entry.label, entry.relpath)
                    start = len(head)
                    need = start + entry.size + 1
                    buf, token = self._buffer(need)
                    buf[:start] = head
                    cur["buf"], cur["token"], cur["start"] = buf, token, start
                    return buf[start:need]

                for s in writer.samples_into(u, dest):
                    buf, token = cur.pop("buf", None), cur.pop("token", None)
                    if isinstance(s, Sample) and isinstance(s.data, memoryview):
                        self._q.put(("s", s, buf[:cur["start"] + len(s.data)], token))
                    else:
                        self._q.put(("s", s, None, token))
                self._q.put(("end", u, None, None))
        except _Stopped:
            return
        except BaseException as e:  # noqa: BLE001 (re-raised by the writing thread)
            self._q.put(("err", e, None, None))

    def unit(self, unit: int) -> Any:
        """(sample, value or None, token to give back or None) for each sample of `unit`."""
        while True:
            kind, a, v, buf = self._q.get()
            if kind == "err":
                raise a
            if kind == "end":
                assert a == unit, (a, unit)
                return
            yield a, v, buf

    def skip(self, unit: int) -> None:
        """Drop what is left of `unit` (its transaction was aborted)."""
        for _, _, buf in self.unit(unit):
            if buf is not None:
                self.give_back(buf)

    def give_back(self, token: tuple[memoryview, int]) -> None:
        slot, need = token
        self._free.put(slot)
        with self._room:
            self._inflight -= need
            self._room.notify()

    def stop(self) -> None:
        self._stopping.set()
        while self._t.is_alive():
            try:  # unblock a reader waiting for a buffer
                while True:
                    _, _, _, token = self._q.get_nowait()
                    if token is not None:
                        self.give_back(token)
            except Exception:  # noqa: BLE001 (queue.Empty)
                pass
            self._t.join(0.2)
