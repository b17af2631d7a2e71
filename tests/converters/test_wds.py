"""WebDataset shards with real clients (GNU tar, webdataset's own WebDataset) and the
reader's contract: a partition across DataLoader workers and ranks, exact lengths, seeded
shuffles, and clear errors for hostile or truncated shards (nothing ever extracted)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import tarfile
from collections import Counter
from pathlib import Path

import pytest
import torch.utils.data

from autotune_converters import ConvertOptions, WdsSource, convert, read_manifest
from autotune_base.errors import SampleError


@pytest.fixture(scope="module")
def wds_dst(img_src, tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("wds") / "out"
    convert(img_src, dst, ConvertOptions(format="wds", shard_size=1 << 20, readers=4))
    return dst


def test_gnu_tar_lists_every_shard(wds_dst):
    m = read_manifest(wds_dst)
    names = []
    for s in m.shards:
        out = subprocess.run(["tar", "-tvf", str(wds_dst / s["file"])], capture_output=True,
                             text=True, check=True).stdout.splitlines()
        assert len(out) == 3 * s["samples"]
        for line in out:
            assert line.startswith("-r--r--r-- 0/0") and " 1970-01-01 00:00 " in line
            name = line.split()[-1]
            assert re.fullmatch(r"\d{10}\.(cls|jpg|json)", name)
            names.append(name)
    keys = Counter(n.split(".")[0] for n in names)
    assert len(keys) == 96 and set(keys.values()) == {3}  # unique keys, three members each


@pytest.mark.parametrize("name, size", [("0000000001.jpg", 91449), ("0000000001.cls", 1),
                                        ("0000000000.json", 0), ("x" * 100, 8 ** 11 - 1)])
def test_member_headers_are_what_tarfile_writes(name, size):
    from autotune_converters.wds.tarfmt import member_header

    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime, ti.mode, ti.uid, ti.gid, ti.uname, ti.gname = size, 0, 0o444, 0, 0, "", ""
    assert member_header(name, size) == ti.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict")


def test_webdatasets_own_reader_reads_every_sample_with_the_right_label(wds_dst, img_src):
    import webdataset as wds

    urls = [str(wds_dst / s["file"]) for s in read_manifest(wds_dst).shards]
    classes = sorted(p.name for p in img_src.iterdir())
    seen = {}
    for img, cls, meta in wds.WebDataset(urls, shardshuffle=False).to_tuple("jpg", "cls", "json"):
        meta = json.loads(meta)
        assert img == (img_src / meta["path"]).read_bytes() and meta["size"] == len(img)
        assert classes[int(cls)] == meta["path"].split("/")[0]
        seen[meta["path"]] = True
    assert len(seen) == 96


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("equalize", [True, False])
def test_ranks_and_workers_partition_the_samples(wds_dst, world, equalize):
    """equalize=False: every sample once across ranks and workers. Equalized (several
    ranks): every rank the same count, for each worker index too, no sample twice, and
    only the remainder of the manifest's counts dropped."""
    import warnings

    src = WdsSource(wds_dst)
    everything = Counter()
    per_rank = []
    for rank in range(world):
        ds = src.dataset(None, seed=7, rank=rank, world_size=world, equalize=equalize,
                         num_workers=2)
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                             multiprocessing_context="fork")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = [data for data, _ in loader]
        assert len(got) == len(ds)  # the length is this rank's exact count
        everything.update(got)
        per_rank.append(len(got))
    assert set(everything.values()) == {1}
    if equalize and world > 1:
        q = ds.quotas(0, world, 2)
        assert per_rank == [sum(q)] * world and sum(everything.values()) == world * sum(q)
        # what could not be kept: less than one shard's worth per worker and rank
        assert 96 - world * sum(q) < world * 2 * max(n for _, n in src.shards)
    else:
        assert sum(everything.values()) == 96


def test_shuffle_is_seeded_per_epoch_and_off_on_request(wds_dst):
    src = WdsSource(wds_dst)
    ds = src.dataset(None, seed=1, shuffle_buffer=50)
    e0 = [d for d, _ in ds]
    ds.set_epoch(0)
    assert [d for d, _ in ds] == e0  # same seed and epoch: same order
    ds.set_epoch(1)
    e1 = [d for d, _ in ds]
    assert e1 != e0 and sorted(e1) == sorted(e0)
    plain = [d for d, _, _ in src.records()]
    assert [d for d, _ in src.dataset(None, shuffle=False)] == plain != e0


def test_transform_errors_name_shard_key_and_path(wds_dst):
    def boom(data: bytes):
        raise ValueError("cannot decode")

    with pytest.raises(SampleError, match=r"shard-\d{6}\.tar key \d{10} \(class_\d{4}/img_\d+\.jpg\)"
                                          r": cannot decode"):
        next(iter(WdsSource(wds_dst).dataset(boom)))


def test_readers_note_and_read_by_index(wds_dst):
    src = WdsSource(wds_dst)
    assert src.readers_note(4) is None
    assert "get no data" in src.readers_note(8, world_size=2)
    with pytest.raises(SampleError, match="read sequentially"):
        src.read(0)
    assert len(src) == 96 and src.iterable and len(list(src.files())) == src.num_shards


# -- hostile and damaged shards ---------------------------------------------------------

def _add(tf: tarfile.TarFile, m: tarfile.TarInfo | tuple[str, bytes]) -> None:
    """A member as given (header only), or (name, bytes) as a regular file."""
    if isinstance(m, tarfile.TarInfo):
        tf.addfile(m)
    else:
        ti = tarfile.TarInfo(m[0])
        ti.size = len(m[1])
        tf.addfile(ti, io.BytesIO(m[1]))


def _fake_dataset(root: Path, members: list[tarfile.TarInfo | tuple[str, bytes]]) -> Path:
    root.mkdir(parents=True)
    with tarfile.open(root / "shard-000000.tar", "w", format=tarfile.GNU_FORMAT) as tf:
        for m in members:
            _add(tf, m)
    (root / "manifest.json").write_text(json.dumps({
        "version": 1, "format": "wds", "num_samples": 1, "num_classes": 1, "classes": ["a"],
        "shards": [{"file": "shard-000000.tar", "samples": 1, "sha256": "",
                    "bytes": (root / "shard-000000.tar").stat().st_size}],
        "skipped": [], "source": {}, "options": {}}))
    return root


def _link(name: str, target: str, kind: bytes) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.linkname = target
    return ti


@pytest.mark.parametrize("member, says", [
    (("../evil.jpg", b"x"), r"member name '\.\./evil\.jpg' is not KEY\.EXT"),
    (("/tmp/abs.jpg", b"x"), r"member name '/tmp/abs\.jpg' is not KEY\.EXT"),
    (("dir/0000000000.jpg", b"x"), r"member name 'dir/0000000000\.jpg'"),
    (_link("0000000000.jpg", "/etc/passwd", tarfile.SYMTYPE), r"is a symlink to '/etc/passwd'"),
    (_link("0000000000.jpg", "../../x", tarfile.LNKTYPE), r"is a hard link to '\.\./\.\./x'"),
])
def test_hostile_members_are_refused_naming_the_shard(tmp_path, member, says):
    root = _fake_dataset(tmp_path / "ds", [("0000000000.cls", b"0"), member])
    before = sorted(p.name for p in tmp_path.rglob("*"))
    for it in (lambda s: list(s.records()), lambda s: list(s.dataset(None))):
        with pytest.raises(SampleError, match=r"ds/shard-000000\.tar: .*" + says):
            it(WdsSource(root))
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing extracted
    assert not Path("/tmp/abs.jpg").exists()


def _cut(root: Path, shard: Path, data: bytes, n: int) -> None:
    """The shard cut to `n` bytes, and its manifest entry saying so (as if it was cut
    after the reader was opened: the open's size check does not see it)."""
    shard.write_bytes(data[:n])
    m = json.loads((root / "manifest.json").read_text())
    next(s for s in m["shards"] if s["file"] == shard.name)["bytes"] = n
    (root / "manifest.json").write_text(json.dumps(m))


def test_a_truncated_shard_is_named_with_how_far_it_got(wds_dst, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(wds_dst, bad)
    shard = bad / read_manifest(bad).shards[0]["file"]
    data = shard.read_bytes()
    _cut(bad, shard, data, len(data) // 2)  # mid-member
    with pytest.raises(SampleError, match=rf"{shard.name}: truncated or corrupt after \d+ members"):
        list(WdsSource(bad).records())
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:  # cut after the first sample
        offs = [m.offset for m in tf.getmembers()]
    _cut(bad, shard, data, offs[3])
    with pytest.raises(SampleError, match=rf"{shard.name}: truncated: 1 of the \d+ samples"):
        list(WdsSource(bad).dataset(None, shuffle=False))


def test_the_training_transform_runs_in_dataloader_workers(wds_dst):
    from autotune.data.transforms import TransformSpec, build_transform

    ds = WdsSource(wds_dst).dataset(build_transform(TransformSpec.from_dict(None)), seed=3)
    loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2,
                                         multiprocessing_context="spawn")
    n = 0
    for images, labels in loader:
        assert images.shape[1] == 3 and images.dtype == torch.float32 and labels.max() < 4
        n += len(labels)
    assert n == 96


def test_the_fast_header_parser_reads_what_tarfile_reads(wds_dst):
    from autotune_converters.wds.tarfmt import _iter_tarfile, iter_members

    for s in read_manifest(wds_dst).shards:
        path = wds_dst / s["file"]
        with open(path, "rb") as f:
            assert list(iter_members(path)) == list(_iter_tarfile(f, path.name, 0))


@pytest.mark.parametrize("member, says", [
    (_link("0000000001.jpg", "/etc/passwd", tarfile.SYMTYPE), r"is a symlink to '/etc/passwd'"),
    (("../evil.jpg", b"x"), r"member name '\.\./evil\.jpg' is not KEY\.EXT"),
])
def test_a_hostile_ustar_member_after_good_ones_is_refused(tmp_path, member, says):
    """Our own writer's members first (the fast parser), then a USTAR member of another
    kind: it is refused with tarfile's reading of it, nothing extracted."""
    from autotune_converters.wds.tarfmt import TarShardWriter, iter_members

    p = tmp_path / "shard-000000.tar"
    tw = TarShardWriter(p)
    tw.add("0000000000.cls", b"0")
    tw.add("0000000000.jpg", b"x" * 1000)
    tw.finish()
    good = p.read_bytes().rstrip(b"\0")
    good += b"\0" * (-len(good) % 512)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        _add(tf, member)
    p.write_bytes(good + buf.getvalue())
    it = iter_members(p)
    assert next(it)[:2] == ("0000000000", "cls") and next(it)[:2] == ("0000000000", "jpg")
    from autotune_converters.wds.tarfmt import ShardFormatError

    with pytest.raises(ShardFormatError, match=r"shard-000000\.tar: .*" + says):
        next(it)


def test_a_damaged_header_is_named(tmp_path):
    from autotune_converters.wds.tarfmt import ShardFormatError, TarShardWriter, iter_members

    p = tmp_path / "shard-000000.tar"
    tw = TarShardWriter(p)
    for k in range(3):
        tw.add(f"{k:010d}.cls", b"0")
    tw.finish()
    data = bytearray(p.read_bytes())
    data[1024 + 10] ^= 0x01  # a byte of the second member's name
    p.write_bytes(bytes(data))
    with pytest.raises(ShardFormatError, match=r"after 1 members \(bad header checksum\)"):
        list(iter_members(p))


# -- bounded memory: sizes a shard claims, sparse members, counts and KEY.json ---------

def _hdr(name: str, size: int | bytes, typeflag: bytes = b"0", gnu: bytes = b"") -> bytes:
    """A tar header built by hand: ustar (or GNU with `gnu`, the bytes from offset 345:
    GNU's sparse map, isextended and realsize), `size` as 11 octal digits or raw bytes."""
    sz = size if isinstance(size, bytes) else b"%011o\0" % size
    h = bytearray(512)
    h[0:len(name)] = name.encode()
    h[100:124] = b"0000444\0" + b"0000000\0" * 2
    h[124:136] = sz.ljust(12, b"\0")
    h[136:148] = b"00000000000\0"
    h[156:157] = typeflag
    h[257:265] = b"ustar  \0" if gnu else b"ustar\x0000"
    h[345:345 + len(gnu)] = gnu
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def _member(name: str, data: bytes) -> bytes:
    return _hdr(name, len(data)) + data + bytes(-len(data) % 512)


def _pax(records: dict[str, str]) -> bytes:
    """A PAX extended header member ('x') holding `records`."""
    body = b""
    for k, v in records.items():
        rec = f" {k}={v}\n".encode()
        n = len(rec) + 1
        n = len(rec) + len(str(n + len(str(n)) - 1))
        body += str(n).encode() + rec
    return _hdr("PaxHeaders/0", len(body), b"x") + body + bytes(-len(body) % 512)


def _shard_dataset(root: Path, body: bytes, samples: int = 1) -> Path:
    """A one-shard wds dataset whose shard is `body` (+ the end blocks), as given."""
    root.mkdir(parents=True)
    (root / "shard-000000.tar").write_bytes(body + bytes(1024))
    (root / "manifest.json").write_text(json.dumps({
        "version": 1, "format": "wds", "num_samples": samples, "num_classes": 2,
        "classes": ["a", "b"],
        "shards": [{"file": "shard-000000.tar", "samples": samples, "sha256": "",
                    "bytes": len(body) + 1024}],
        "skipped": [], "source": {}, "options": {}}))
    return root


# 200 MiB (under the limit: the file is too short) and 64 GiB (octal 777777777777, over it)
_CLAIMS = [(200 << 20, r"claims 209,715,200 bytes, but the shard holds [\d,]+ more"),
           (8 ** 12 - 1, r"is 68,719,476,735 bytes, over the per-member limit of "
                         r"268,435,456 \(max_member_bytes\)")]

# The child's own peak: VmHWM of its address space. (ru_maxrss would not do: Linux carries
# it over exec from the forked copy of this pytest process, already larger than 200 MiB.)
_PEAK = r"""
import json, sys
from autotune_converters.wds.tarfmt import iter_members
def hwm():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
before = hwm()
try:
    list(iter_members(sys.argv[1]))
    said = "no error"
except BaseException as e:
    said = f"{type(e).__name__}: {e}"
print(json.dumps({"grew_kib": hwm() - before, "said": said}))
"""


@pytest.mark.parametrize("size, says", _CLAIMS)
def test_a_tiny_shard_claiming_a_huge_member_stays_in_bounded_memory(tmp_path, size, says):
    """Peak RSS of a reader in its own process: +50 MiB at most for a 2 KiB shard whose
    header claims 200 MiB or 64 GiB (it was +201 MiB, and a MemoryError)."""
    import os
    import sys

    p = tmp_path / "shard-000000.tar"
    p.write_bytes(_member("0000000000.cls", b"0") + _hdr("0000000000.jpg", size))
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", _PEAK, str(p)], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(root)}).stdout
    r = json.loads(out)
    assert re.search(r"ShardFormatError: shard-000000\.tar: .*member '0000000000\.jpg' " + says,
                     r["said"]), r
    assert r["grew_kib"] < 50 << 10, r


@pytest.mark.parametrize("size, says", _CLAIMS)
def test_a_huge_claim_after_a_pax_header_is_refused_the_same(tmp_path, size, says):
    """The same claims through the tarfile path (a PAX header first), and the reader's
    error naming the shard; a smaller max_member_bytes is obeyed."""
    body = _member("0000000000.cls", b"0") + _pax({"comment": "x"}) + _hdr("0000000000.jpg", size)
    root = _shard_dataset(tmp_path / "ds", body)
    with pytest.raises(SampleError, match=r"ds/shard-000000\.tar: .*member '0000000000\.jpg' "
                                          + says):
        list(WdsSource(root).records())
    ok = _member("0000000000.cls", b"0") + _member("0000000000.jpg", b"y" * 5000)
    small = _shard_dataset(tmp_path / "small", ok)
    assert [d for d, _, _ in WdsSource(small).records()] == [b"y" * 5000]
    with pytest.raises(SampleError, match=r"member '0000000000\.jpg' is 5,000 bytes, over the "
                                          r"per-member limit of 4,096 \(max_member_bytes\)"):
        list(WdsSource(small, max_member_bytes=4096).dataset(None))
    from autotune_base.errors import UsageError

    with pytest.raises(UsageError, match=r"max_member_bytes must be a positive number"):
        WdsSource(small, max_member_bytes=0)


def _gnu_sparse(name: str, realsize: int) -> bytes:
    """An old-GNU sparse member ('S'): one 512-byte chunk at the end of `realsize`."""
    sp = b"%011o\0" % (realsize - 512) + b"%011o\0" % 512  # (offset, numbytes)
    gnu = bytes(386 - 345) + sp + bytes(482 - 386 - len(sp)) + b"\0" + b"%011o\0" % realsize
    return _hdr(name, 512, b"S", gnu=gnu) + b"z" * 512


@pytest.mark.parametrize("sparse", [
    _gnu_sparse("0000000000.jpg", 200_000_000),
    _pax({"GNU.sparse.major": "1", "GNU.sparse.minor": "0",
          "GNU.sparse.name": "0000000000.jpg", "GNU.sparse.realsize": "200000000"})
    + _hdr("GNUSparseFile.0/0000000000.jpg", 1024) + b"1\n199999488\n512\n".ljust(512, b"\0")
    + b"z" * 512,
    _pax({"GNU.sparse.map": "199999488,512", "GNU.sparse.size": "200000000",
          "path": "0000000000.jpg"}) + _hdr("0000000000.jpg", 512) + b"z" * 512,
], ids=["gnu-S", "pax-1.0", "pax-0.1"])
def test_sparse_members_are_refused_naming_them(tmp_path, sparse):
    """A 3 KiB shard with a sparse member was read as a 200 MB sample of zeros."""
    root = _shard_dataset(tmp_path / "ds", _member("0000000000.cls", b"0") + sparse)
    for it in (lambda s: list(s.records()), lambda s: list(s.dataset(None))):
        with pytest.raises(SampleError, match=r"ds/shard-000000\.tar: member '0000000000\.jpg' "
                                              r"is a sparse file"):
            it(WdsSource(root))


def test_a_shard_with_more_samples_than_its_manifest_names_both_counts(tmp_path):
    body = b"".join(_member(f"{k:010d}.cls", b"1") + _member(f"{k:010d}.jpg", b"x")
                    for k in range(6))
    root = _shard_dataset(tmp_path / "ds", body, samples=3)
    for it in (lambda s: list(s.records()), lambda s: list(s.dataset(None, shuffle=False))):
        with pytest.raises(SampleError, match=r"ds/shard-000000\.tar: holds 6 samples but "
                                              r"manifest\.json lists 3"):
            it(WdsSource(root))


def test_a_deeply_nested_key_json_only_loses_the_path(tmp_path):
    """KEY.json is informational: unparseable, however deep (a RecursionError before),
    it gives path '?' as any other unparseable KEY.json, and the sample is read."""
    deep = b"[" * 200_000 + b"]" * 200_000
    body = (_member("0000000000.cls", b"1") + _member("0000000000.jpg", b"x")
            + _member("0000000000.json", deep))
    root = _shard_dataset(tmp_path / "ds", body)
    assert list(WdsSource(root).records()) == [(b"x", 1, "?")]
    assert list(WdsSource(root).dataset(None)) == [(b"x", 1)]


def test_a_member_over_the_read_buffer_with_padding_is_read(tmp_path: Path) -> None:
    """A member larger than the 1 MiB read buffer, its size not a multiple of 512: the
    padding after it was left unread and the next header failed its checksum."""
    import io
    import os
    import tarfile

    from autotune_converters.wds.tarfmt import iter_members

    p = tmp_path / "big.tar"
    sizes = (("a.jpg", 1_500_001), ("a.cls", 1), ("b.jpg", 10), ("b.cls", 1))
    with tarfile.open(p, "w", format=tarfile.USTAR_FORMAT) as tf:
        for name, n in sizes:
            ti = tarfile.TarInfo(name)
            ti.size = n
            tf.addfile(ti, io.BytesIO(os.urandom(n)))
    assert [(f"{k}.{s}", len(d)) for k, s, d in iter_members(p)] == list(sizes)


# -- shards named with a folder: walked beneath the dataset, no link followed ------------

def _nested(wds_dst: Path, root: Path) -> Path:
    """A copy of the conversion whose shards live in sub/ (a manifest may name them so:
    plain relative paths), read through a real folder."""
    import shutil

    shutil.copytree(wds_dst, root)
    (root / "sub").mkdir()
    m = json.loads((root / "manifest.json").read_text())
    for s in m["shards"]:
        (root / s["file"]).rename(root / "sub" / s["file"])
        s["file"] = f"sub/{s['file']}"
    (root / "manifest.json").write_text(json.dumps(m))
    return root


def test_shards_in_a_subfolder_are_read(wds_dst, tmp_path):
    root = _nested(wds_dst, tmp_path / "ds")
    assert sorted(b for b, _, _ in WdsSource(root).records()) == sorted(
        b for b, _, _ in WdsSource(wds_dst).records())
    assert sum(1 for _ in WdsSource(root).dataset(None)) == 96


def test_a_subfolder_that_is_a_link_is_refused_at_open_and_when_read(wds_dst, tmp_path):
    """sub -> a folder outside: refused by the check at open; and a folder swapped for a
    link after it (the shards' own opens walk beneath the dataset too)."""
    root = _nested(wds_dst, tmp_path / "ds")
    ds = WdsSource(root).dataset(None, shuffle=False)  # opened while sub/ is a folder
    (root / "sub").rename(tmp_path / "outside")
    (root / "sub").symlink_to(tmp_path / "outside")
    first = read_manifest(root).shards[0]["file"]
    with pytest.raises(SampleError, match=rf"^{root / first}: a symbolic link on its way "
                                          r"\(sub\), not followed \(\d+ of \d+ shards listed "
                                          r"in manifest\.json\); .*replace the link with the "
                                          r"file itself\.$"):
        WdsSource(root)
    with pytest.raises(SampleError, match=rf"{first.split('/')[1]}: a symbolic link, not "
                                          r"followed \(its folder 'sub'\); .*replace the link "
                                          r"with the file itself\.$"):
        list(ds)


def test_a_shard_is_read_through_a_blocking_descriptor(wds_dst, tmp_path):
    """O_NONBLOCK keeps a FIFO's open from waiting; it is cleared once the file is seen to
    be regular (Lustre gives a non-blocking descriptor's reads and locks EAGAIN)."""
    import shutil

    from autotune_converters.wds.tarfmt import open_shard

    root = tmp_path / "ds"
    shutil.copytree(wds_dst, root)
    (root / "sub").mkdir()
    name = read_manifest(root).shards[0]["file"]
    shutil.copy(root / name, root / "sub" / name)
    for path in (root / name, root / "sub" / name):   # one open, or a walk beneath root
        with open_shard(path, beneath=str(root)) as f:
            assert os.get_blocking(f.fileno()), path


def test_a_fifo_named_as_a_shard_is_refused_not_waited_on(wds_dst, tmp_path):
    """A FIFO in place of a shard: refused by the check at open, and by the read's open
    (O_NONBLOCK, then fstat) if it appears after: never a read that waits forever."""
    import shutil

    root = tmp_path / "ds"
    shutil.copytree(wds_dst, root)
    ds = WdsSource(root).dataset(None, shuffle=False)
    first = root / read_manifest(root).shards[0]["file"]
    first.unlink()
    os.mkfifo(first)
    with pytest.raises(SampleError, match=rf"^{first}: a FIFO, not a regular file; "):
        WdsSource(root)
    assert re.search(rf"SampleError: .*{first.name}: not a regular file; ", _read_apart(ds))


def _read_apart(ds) -> str:  # noqa: ANN001 (a WdsDataset)
    """What reading `ds` to its end raises, read in a forked child: a read that blocks
    (a FIFO opened without O_NONBLOCK) fails the test instead of hanging it."""
    import select
    import signal

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        said = "no error"
        try:
            list(ds)
        except BaseException as e:  # noqa: BLE001 (reported to the parent)
            said = f"{type(e).__name__}: {e}"
        finally:
            os.write(w, said.encode())
            os._exit(0)
    os.close(w)
    try:
        if not select.select([r], [], [], 30)[0]:
            os.kill(pid, signal.SIGKILL)
            pytest.fail("reading the dataset hung (a FIFO waited on)")
        return os.read(r, 1 << 16).decode()
    finally:
        os.close(r)
        os.waitpid(pid, 0)
