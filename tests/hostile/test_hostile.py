"""Hostile datasets against stage, the shard and LMDB readers and analyze (see conftest).

Each property builds one case from a grammar, mutates it, and asserts what autotune
promises of any input: no write outside DST, memory bounded by the input's size, no
exception outside autotune's tree (a traceback or an "internal error" is a failure), and
the same answer for the same input.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tarfile
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from autotune_base.errors import AutotuneError
from autotune_converters.wds.tarfmt import ShardFormatError, iter_members

ALLOWED = (AutotuneError, ShardFormatError)


# -- helpers -----------------------------------------------------------------------------
def _snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under root (symlinks not followed): kind, mode, inode, bytes."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for n in dirnames + filenames:
            p = Path(dirpath, n)
            s = p.lstat()
            body = p.read_bytes() if stat.S_ISREG(s.st_mode) else os.readlink(p) \
                if stat.S_ISLNK(s.st_mode) else None
            out[str(p.relative_to(root))] = (stat.S_IFMT(s.st_mode), stat.S_IMODE(s.st_mode),
                                             s.st_ino, body)
    return out


class _Timeout(Exception):
    pass


def _within(seconds: int, fn, *a, **kw):
    """fn(*a, **kw), or _Timeout when it takes longer (a FIFO must never hang stage)."""
    def on_alarm(*_):
        raise _Timeout(f"no answer within {seconds} s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        return fn(*a, **kw)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _outcome(fn, root: Path):
    """("ok", summary) or ("error", type name, message with the case's root removed)."""
    try:
        res = _within(30, fn)
    except ALLOWED as e:
        # The disk's free space in a "needs N MiB" error moves with whatever else writes
        # to the disk between two tries (another CI worker, say): not part of the answer.
        msg = re.sub(r"[\d,.]+ MiB free", "N MiB free", str(e).replace(str(root), "ROOT"))
        return ("error", type(e).__name__, msg)
    return ("ok", type(res).__name__)


# -- stage: names from a stranger's manifest, symlinks planted in DST ----------------------
NAMES = st.one_of(
    # Plain names most of the time, so that the planted symlinks and the copy are reached.
    st.sampled_from(["REAL", "REAL", "sub/x.tar", "new-000.tar", "link", "fifo", "adir"]),
    st.from_regex(r"[a-z]{1,6}(/[a-z]{1,6}){0,2}\.tar", fullmatch=True),
    st.sampled_from(["REAL", "../outside/secret.txt", "ABS", "sub/../../outside/secret.txt",
                     "", ".", "..", "a\x00b", "link", "fifo", "adir", "sub/x.tar", "/",
                     "./REAL", "REAL/", "x" * 300, "outside/../REAL"]),
    st.integers(), st.none(), st.lists(st.text(max_size=3), max_size=2),
    st.text(max_size=12))
PLANTS = st.sets(st.sampled_from([".autotune-stage", "sub", "lockdir", "manifest.json"]))


def _stage_case(base: Path, conv: Path, entries: list, plants: set[str]) -> tuple[Path, Path, Path]:
    src, dst, outside = base / "src", base / "dst", base / "outside"
    shutil.copytree(conv, src)
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"keep me\n")
    os.chmod(outside / "secret.txt", 0o600)
    (outside / "tmp").mkdir()
    (outside / "tmp" / "keep").write_bytes(b"keep\n")
    os.symlink(outside / "secret.txt", src / "link")
    os.mkfifo(src / "fifo")
    (src / "adir").mkdir()
    man = json.loads((src / "manifest.json").read_text())
    real = man["shards"][0]
    shards = []
    for name, size in entries:
        if name == "REAL":
            name = real["file"]
        elif name == "ABS":
            name = str(outside / "secret.txt")
        shards.append(dict(real, file=name,
                           bytes=size if size is not None else real["bytes"]))
    man["shards"] = shards or man["shards"]
    (src / "manifest.json").write_text(json.dumps(man))
    dst.mkdir()
    for p in plants:
        if p == "lockdir":
            (dst / ".autotune-stage").mkdir(exist_ok=True)
            if not (dst / ".autotune-stage" / "lock").exists():
                os.symlink(outside / "secret.txt", dst / ".autotune-stage" / "lock")
        elif p == ".autotune-stage":
            if not (dst / p).exists():
                os.symlink(outside, dst / p)
        elif p == "manifest.json":
            os.symlink(outside / "secret.txt", dst / p)
        else:
            os.symlink(outside, dst / p)
    return src, dst, outside


@given(entries=st.lists(st.tuples(NAMES, st.one_of(st.none(), st.integers(-5, 10**13))),
                        min_size=1, max_size=4),
       plants=PLANTS)
@example(entries=[("../outside/secret.txt", None)], plants=set())
@example(entries=[("ABS", 999)], plants=set())
@example(entries=[("ABS", None)], plants=set())
@example(entries=[("link", None)], plants=set())
@example(entries=[("fifo", None)], plants=set())
@example(entries=[(5, None)], plants=set())
@example(entries=[("REAL", None)], plants={".autotune-stage"})
@example(entries=[("REAL", None)], plants={"lockdir"})
@example(entries=[("sub/x.tar", None)], plants={"sub"})
def test_stage_never_writes_outside_dst(tmp_path_factory, conversions, entries, plants):
    from autotune_converters.stage import stage

    answers = []
    for attempt in range(2):
        base = tmp_path_factory.mktemp("stage-case")
        src, dst, outside = _stage_case(base, conversions["wds"], entries, plants)
        before_out, before_src = _snapshot(outside), _snapshot(src)
        answers.append(_outcome(lambda: stage(src, dst, workers=2), base))
        assert _snapshot(outside) == before_out, (entries, plants)
        assert _snapshot(src) == before_src, (entries, plants)
        assert sorted(p.name for p in base.iterdir()) == ["dst", "outside", "src"]
        shutil.rmtree(base)
    assert answers[0] == answers[1], (entries, plants)


# -- tar shards: headers mutated from a good shard -----------------------------------------
def _good_shard(conversions) -> bytes:
    conv = conversions["wds"]
    man = json.loads((conv / "manifest.json").read_text())
    return (conv / man["shards"][0]["file"]).read_bytes()


def _set_checksum(b: bytearray, at: int) -> None:
    h = b[at:at + 512]
    h[148:156] = b" " * 8
    b[at + 148:at + 156] = b"%06o\0 " % sum(h)


MUTATION = st.one_of(
    st.tuples(st.just("size"), st.sampled_from([b"777777777777", b"00001000000\0",
                                                b"\x80\0\0\0\0\0\0\x10\0\0\0\0", b"-1",
                                                b"99999999999\0", b"00000000000\0"])),
    st.tuples(st.just("type"), st.sampled_from(list(b"0125SLKxgX7\0"))),
    st.tuples(st.just("name"), st.sampled_from([b"../x.jpg", b"/etc/passwd", b"a.b.c",
                                                b"k.jpg", b"", b"k\x00.cls"])),
    st.tuples(st.just("flip"), st.tuples(st.integers(0, 511), st.integers(0, 255))),
    st.tuples(st.just("cut"), st.integers(0, 4096)),
)


def _mutate(shard: bytes, muts: list, header: int, fix_sum: bool) -> bytes:
    b = bytearray(shard)
    at = min(header, len(b) // 512 - 1) * 512
    for kind, v in muts:
        if kind == "size":
            b[at + 124:at + 136] = v.ljust(12, b"\0")[:12]
        elif kind == "type":
            b[at + 156] = v
        elif kind == "name":
            b[at:at + 100] = v.ljust(100, b"\0")[:100]
        elif kind == "flip":
            b[at + v[0]] = v[1]
        elif kind == "cut":
            del b[max(0, len(b) - v):]
    if fix_sum and len(b) >= at + 512:
        _set_checksum(b, at)
    return bytes(b)


@given(muts=st.lists(MUTATION, min_size=1, max_size=3), header=st.integers(0, 6),
       fix_sum=st.booleans())
@example(muts=[("size", b"777777777777")], header=0, fix_sum=True)     # 64 GiB claimed
@example(muts=[("size", b"01440000000\0")], header=0, fix_sum=True)   # 200 MiB claimed
@example(muts=[("type", ord("S"))], header=0, fix_sum=True)            # GNU sparse
def test_tar_reader_bounded_and_clean(tmp_path_factory, conversions, muts, header, fix_sum):
    data = _mutate(_good_shard(conversions), muts, header, fix_sum)
    path = tmp_path_factory.mktemp("tar") / "shard-000000.tar"
    path.write_bytes(data)
    answers = []
    for _ in range(2):
        tracemalloc.start()
        try:
            try:
                n = sum(len(d) for _, _, d in iter_members(path))
                answers.append(("ok", n))
            except ALLOWED as e:
                answers.append(("error", str(e)))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        # The good shard's largest member plus the reader's 1 MiB buffer, with room.
        assert peak < len(data) + 16 * 2**20, (muts, peak)
    assert answers[0] == answers[1]


def test_sparse_member_is_refused(tmp_path):
    """A GNU sparse member is not a regular file whatever isreg() says."""
    p = tmp_path / "shard-000000.tar"
    with tarfile.open(p, "w", format=tarfile.GNU_FORMAT) as tf:
        ti = tarfile.TarInfo("k.jpg")
        ti.size = 4
        import io
        tf.addfile(ti, io.BytesIO(b"abcd"))
    b = bytearray(p.read_bytes())
    b[156] = ord("S")
    _set_checksum(b, 0)
    p.write_bytes(bytes(b))
    with pytest.raises(ALLOWED):
        list(iter_members(p))


# -- LMDB: values and pages damaged ---------------------------------------------------------
_LMDB_READ = r"""
import json, sys
from autotune_converters.lmdb.reader import LmdbSource
from autotune_base.errors import AutotuneError
def read_all():
    out = []
    try:
        s = LmdbSource(sys.argv[1], io=sys.argv[2])
        for i in range(len(s)):
            try:
                b, label = s.read(i)
                out.append(["ok", len(b), label, 0 <= label < len(s.classes)])
            except AutotuneError as e:
                out.append(["error", type(e).__name__])
    except AutotuneError as e:
        out.append(["open-error", type(e).__name__])
    return out
# Two opens of the damaged environment, one process (a crash still shows as its exit).
print(json.dumps([read_all(), read_all()]))
"""


def _lmdb_values(env_dir: Path) -> list[bytes]:
    import lmdb
    env = lmdb.open(str(env_dir), readonly=True, lock=False, subdir=True)
    with env.begin() as txn:
        keys = [k for k, _ in txn.cursor()]
    env.close()
    return keys


@example(which=0, how="label", blob=b"", io="mmap")
@example(which=0, how="label", blob=b"", io="pread")
@example(which=0, how="index-label", blob=b"", io="pread")
@example(which=0, how="index-length", blob=b"", io="pread")
@given(which=st.integers(0, 40),
       how=st.sampled_from(["random", "label", "version", "pathlen", "index-label",
                            "index-length", "index-offset"]),
       blob=st.binary(min_size=0, max_size=64), io=st.sampled_from(["pread", "mmap"]))
def test_lmdb_values_checked(tmp_path_factory, conversions, which, how, blob, io):
    """Values patched in place in data.mdb (the file keeps its size, so the manifest's
    size check passes), or the index's records patched: labels stay in range, nothing
    but our errors, the same answer twice."""
    import numpy as np

    from autotune_converters.lmdb.layout import index_dtype

    d = tmp_path_factory.mktemp("lmdb") / "conv"
    shutil.copytree(conversions["lmdb"], d)
    idx = np.frombuffer((d / "data.idx").read_bytes(), dtype=index_dtype()).copy()
    i = which % len(idx)
    off, length = int(idx["offset"][i]), int(idx["length"][i])
    big = 10**9 if not blob else int.from_bytes((blob + bytes(4))[:4], "little")
    if how.startswith("index-"):
        field = how[len("index-"):]
        idx[field][i] = big if field != "offset" else big * 4096
        (d / "data.idx").write_bytes(idx.tobytes())
    else:
        data = bytearray((d / "data.mdb").read_bytes())
        v = memoryview(data)[off:off + length]
        if how == "random":
            v[:len(blob)] = blob[:length]
        elif how == "label":      # the head's u32 label (converters/lmdb/layout.py)
            v[1:5] = struct.pack("<I", big)
        elif how == "version":
            v[0] = (blob or b"\x07")[0]
        else:                     # the u16 path length
            v[5:7] = struct.pack("<H", 0xFFFF if not blob else blob[0])
        del v
        (d / "data.mdb").write_bytes(bytes(data))
    r = subprocess.run([sys.executable, "-c", _LMDB_READ, str(d), io], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    answers = json.loads(r.stdout)
    for got in answers:
        assert all(x[0] != "ok" or x[3] for x in got), got   # every label in range
    assert answers[0] == answers[1]


@given(offset=st.integers(2 * 4096, 64 * 4096), blob=st.binary(min_size=1, max_size=256),
       io=st.sampled_from(["pread", "mmap"]))
def test_lmdb_damaged_pages(tmp_path_factory, conversions, offset, blob, io):
    d = tmp_path_factory.mktemp("lmdbpage") / "conv"
    shutil.copytree(conversions["lmdb"], d)
    data = d / "data.mdb"
    b = bytearray(data.read_bytes())
    at = offset % max(1, len(b) - len(blob))
    b[at:at + len(blob)] = blob
    data.write_bytes(bytes(b))
    r = subprocess.run([sys.executable, "-c", _LMDB_READ, str(d), io], capture_output=True,
                       text=True, timeout=120)
    # No crash (a signal), no traceback: every damaged page is one of our errors.
    assert r.returncode == 0, r.stderr[-2000:]
    for got in json.loads(r.stdout):
        assert all(x[0] != "ok" or x[3] for x in got), got


# -- logs: lines from the formats' grammars, and junk ---------------------------------------
def _imagenet_line(epoch: int, i: int, t: float, d: float) -> str:
    return (f"Epoch: [{epoch}][{i:3d}/200]\tTime {t:6.3f} ({t:6.3f})\tData {d:6.3f} ({d:6.3f})"
            "\tLoss 6.9000e+00 (6.9000e+00)")


def _steps_line(step: int, wait: float) -> str:
    return json.dumps({"t": 1000.0 + step, "epoch": 0, "step": step, "wait_s": wait,
                       "step_s": 0.1})


JUNK = st.one_of(
    st.text(max_size=80),
    st.integers(1, 3000).map(lambda n: "[" * n + "]" * n),
    st.integers(1, 3000).map(lambda n: '{"a":' * n + "1" + "}" * n),
    st.sampled_from(["Epoch: [0][1/2]\tTime nan (nan)\tData inf (inf)",
                     "Epoch: [99999999999999999999][1/0]\tTime 1e309 (1)\tData -1 (-1)",
                     '{"t": 1e999, "step": -1, "wait_s": "x"}', "\x1b[31mred\x1b[0m",
                     '{"t": 1, "epoch": 0, "step": 1, "wait_s": 1e308, "step_s": -1e308}']),
)


@given(fmt=st.sampled_from(["imagenet", "own"]),
       lines=st.lists(st.one_of(st.tuples(st.just("good"), st.floats(0, 5), st.floats(0, 5)),
                                st.tuples(st.just("junk"), JUNK)), min_size=0, max_size=40),
       gz=st.booleans(), cut=st.integers(0, 64))
@example(fmt="own", lines=[("good", 0.1, 0.1)] * 20, gz=True, cut=20)   # truncated gzip
@example(fmt="own", lines=[("good", 0.1, 0.1)] * 20 + [("junk", '{"a":' * 5000 + "1" + "}" * 5000)],
         gz=False, cut=0)                                               # deep JSON
def test_analyze_never_tracebacks(tmp_path_factory, fmt, lines, gz, cut):
    import gzip

    from autotune.analyze.analysis import analyze

    d = tmp_path_factory.mktemp("log")
    text = []
    for k, item in enumerate(lines):
        if item[0] == "good":
            text.append(_imagenet_line(0, k + 1, item[1], item[2]) if fmt == "imagenet"
                        else _steps_line(k, item[2]))
        else:
            text.append(item[1].replace("\n", " ").replace("\r", " "))
    body = ("\n".join(text) + "\n").encode("utf-8", "surrogatepass")
    name = "steps.jsonl" if fmt == "own" else "train.log"
    if gz:
        body = gzip.compress(body)
        body = body[:max(10, len(body) - cut)] if cut else body
        name += ".gz"
    (d / name).write_bytes(body)
    answers = []
    for _ in range(2):
        try:
            a = _within(60, analyze, d / name, batch_size=64)
            answers.append(("ok", a.steps, a.verdict.bottleneck if hasattr(a, "verdict") else None))
        except ALLOWED as e:
            answers.append(("error", type(e).__name__, str(e)))
    assert answers[0] == answers[1]


# -- a monitor's metrics.jsonl, a stranger's: any JSON value where a figure should be ------
FIGURE = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**6), st.just(10**400),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5),
                   st.lists(st.integers(0, 3), max_size=3), st.dictionaries(st.text(max_size=3),
                                                                            st.integers(),
                                                                            max_size=2))
SECTION_KEYS = {
    "proc": ("cpu_pct", "processes", "open_files", "open_files_limit", "open_files_hard",
             "open_files_pid", "root_pid"),
    "cpu": ("total_pct", "iowait_pct", "per_core_pct"),
    "disk": ("util_pct", "r_await_ms", "reads_per_s", "read_mib_s", "device", "cap_iops"),
    "shm": ("used_bytes", "total_bytes"),
    "memcg": ("working_set_bytes", "limit_bytes", "oom_kills", "limit_file"),
    "gpu": ("devices",),
    "sched": ("cpus", "wanted_pct"),
    "cpu_quota": ("periods", "throttled", "throttled_s", "cores"),
    "budget": ("wall_s", "samples", "classes"),
}
SECTION = st.sampled_from(sorted(SECTION_KEYS)).flatmap(lambda name: st.tuples(
    st.just(name), st.one_of(FIGURE, st.fixed_dictionaries(
        {"available": st.one_of(st.just(True), FIGURE)},
        optional={k: FIGURE for k in SECTION_KEYS[name]}))))


@given(samples=st.lists(st.lists(SECTION, max_size=4), min_size=1, max_size=6))
def test_analyze_never_tracebacks_on_a_strangers_metrics(tmp_path_factory, samples):
    """A metrics.jsonl whose sections hold strings, bools, 400-digit integers, NaN, lists
    where figures should be: analyze answers, or says what is wrong, never a traceback (a
    400-digit open-files count once raised OverflowError, a list for a section
    AttributeError)."""
    from autotune.analyze.analysis import analyze

    d = tmp_path_factory.mktemp("mon")
    (d / "steps.jsonl").write_text("".join(_steps_line(k, 0.02) + "\n" for k in range(30)))
    recs = [{"time": 1000.0 + 0.5 * (k + 1), "interval_s": 0.5, **dict(secs)}
            for k, secs in enumerate(samples)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "run.json").write_text(json.dumps({"command": ["python"], "returncode": 1,
                                            "seconds": 10**400}))
    try:
        _within(60, analyze, d, batch_size=64)
    except ALLOWED:
        pass
