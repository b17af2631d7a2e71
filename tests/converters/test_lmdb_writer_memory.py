"""How the LMDB writer holds memory, with real glibc malloc and a real conversion: the
pages each commit frees stay mapped for the next batch while the writer runs and go back
to the kernel when it closes; the read-ahead keeps reading past 64 samples while the
writing thread is busy, within its byte budget, and values larger than a slot still go
in whole."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from autotune_converters import ConvertOptions, LmdbSource, convert
from autotune_converters.lmdb import heap
from autotune_converters.lmdb import writer as lmdb_writer

MiB = 1 << 20
glibc = pytest.mark.skipif(heap._glibc() is None, reason="glibc malloc only")


# In a fresh interpreter: in a process with a history (the tests before it, in whatever
# order a CI worker ran them), freed pages already resident in the heap are reused and the
# RSS grows less than the churn (seen: 11 MiB for 48 MiB beside another test file).
_HELD = """
import ctypes, json
from autotune_converters.lmdb import heap
MiB = 1 << 20
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
def churn(libc, chunks, size):
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    ptrs = [libc.malloc(size) for _ in range(chunks)]
    for p in ptrs:
        ctypes.memset(p, 1, size)
    for p in reversed(ptrs):
        libc.free(p)
libc = heap._glibc()
kept = heap.KeptHeap(256 * MiB)
ok = kept.hold()
try:
    before = rss()
    churn(libc, 48, MiB)  # 1 MiB blocks: above glibc's default mmap threshold
    held = rss() - before
finally:
    kept.release()
released = rss() - before
before = rss()
churn(libc, 48, MiB)
print(json.dumps({"hold": ok, "held": held, "released": released, "after": rss() - before}))
"""


@glibc
def test_freed_memory_stays_while_held_and_goes_back_on_release():
    r = subprocess.run([sys.executable, "-c", _HELD], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads(r.stdout)
    assert m["hold"]
    assert m["held"] >= 40 * MiB, m  # freed, but still mapped for the next batch
    assert m["released"] < m["held"] - 32 * MiB, m  # released: trimmed back to the kernel
    assert m["after"] < 8 * MiB, m  # and freeing returns memory again afterwards


@glibc
def test_the_writer_keeps_freed_pages_while_it_runs_and_not_after(img_src, tmp_path,
                                                                  monkeypatch):
    seen = []
    commit = lmdb_writer.LmdbWriter._commit

    def spy(self, write, batch_bytes, **kw):
        seen.append(self._heap is not None and self._heap.held)
        return commit(self, write, batch_bytes, **kw)

    monkeypatch.setattr(lmdb_writer.LmdbWriter, "_commit", spy)
    released = []
    monkeypatch.setattr(heap.KeptHeap, "release",
                        lambda self, f=heap.KeptHeap.release: (released.append(1), f(self)))
    convert(img_src, tmp_path / "out", ConvertOptions(format="lmdb", shard_size=1 << 20))
    assert len(seen) > 2 and all(seen)
    assert released == [1]


class _Writer:
    """The part of LmdbWriter the read-ahead uses: samples_into, over files of given
    sizes (no disk), each read into the buffer dest() gives."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def samples_into(self, unit, dest):
        from autotune_converters.records import Entry, Sample

        for i, n in enumerate(self.sizes):
            e = Entry(position=i, label=i % 3, relpath=f"c/{i}.jpg", size=n)
            mv = dest(e)
            mv[:n] = bytes([i % 251]) * n
            yield Sample(i, e.label, e.relpath, "jpg", mv[:n], source_bytes=n)


def _ahead_while_blocked(sizes: list[int], seconds: float = 1.0) -> tuple[int, int]:
    """(samples, bytes) the read-ahead has read while nobody takes them."""
    ra = lmdb_writer._ReadAhead(_Writer(sizes), [0])
    try:
        time.sleep(seconds)
        return ra._q.qsize(), ra._inflight
    finally:
        ra.stop()


def test_the_read_ahead_reads_on_past_64_samples_while_the_writer_is_busy():
    n, inflight = _ahead_while_blocked([20_000] * 1000)
    assert n > 64  # 64 pooled buffers stopped it here, a quarter into a 64 MiB commit
    assert n <= lmdb_writer._ReadAhead.SLOTS


def test_the_read_ahead_stops_at_its_byte_budget():
    big = lmdb_writer._ReadAhead.SLOT * 3  # larger than a slot: a buffer of its own
    n, inflight = _ahead_while_blocked([big] * 100)
    assert 0 < inflight <= lmdb_writer._ReadAhead.BUDGET
    assert n <= lmdb_writer._ReadAhead.BUDGET // big + 1


def test_values_larger_than_a_slot_are_stored_whole(tmp_path):
    from PIL import Image
    import numpy as np

    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(3):  # noise JPEGs of ~400 KB: above the 256 KiB slot
        Image.fromarray(rng.integers(0, 255, (600, 600, 3), dtype=np.uint8)).save(
            src / f"{i}.jpg", quality=95)
    assert min(p.stat().st_size for p in src.iterdir()) > lmdb_writer._ReadAhead.SLOT
    dst = tmp_path / "out"
    convert(tmp_path / "src", dst, ConvertOptions(format="lmdb"))
    got = sorted(bytes(LmdbSource(dst).read(i)[0]) for i in range(3))
    assert got == sorted(p.read_bytes() for p in src.iterdir())


def test_batches_flush_once_and_the_last_commit_twice(img_src, tmp_path, monkeypatch):
    """metasync off for the batches (their meta page goes out with the next commit's
    sync), on for the commit that completes the environment, which is then published."""
    import lmdb

    opened = []
    real = lmdb.open

    def spy(path, **kw):
        if not kw.get("readonly"):
            opened.append(kw.get("metasync", True))
        return real(path, **kw)

    monkeypatch.setattr(lmdb, "open", spy)
    dst = tmp_path / "out"
    convert(img_src, dst, ConvertOptions(format="lmdb", shard_size=1 << 20))
    assert len(opened) > 2
    assert opened[-1] is True and not any(opened[:-1])
    assert len(LmdbSource(dst)) == 96


def test_the_read_ahead_touches_only_the_slots_its_budget_holds():
    """Slots come back to the front of the free list: a run touches (and keeps resident)
    about its byte budget of the arena, not every slot. Taken in turn (a FIFO), all 1,024
    slots were filled in any run of more than 1,024 samples: 256 MiB resident with 230 KB
    images whatever the budget, shared memory that an OOM kill in a 300 MiB container
    showed and no reclaim gives back."""
    size, n = 200_000, 3000
    ra = lmdb_writer._ReadAhead(_Writer([size] * n), [0], budget=8 * MiB)
    touched = set()
    try:
        for _sample, value, token in ra.unit(0):
            touched.add(id(token[0]))
            assert value is not None
            ra.give_back(token)
    finally:
        ra.stop()
    assert len(touched) <= 8 * MiB // size + 2, len(touched)
