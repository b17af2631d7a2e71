"""The contract every writer/reader pair passes (LMDB and WebDataset alike): every image
stored once with its original bytes and label, a truthful manifest, byte-identical output
for the same input and options whatever the worker count, and a seeded shuffle; and, read
back, a conversion checked against its manifest when it is opened: sizes, counts, links."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from autotune.errors import UsageError
from autotune_converters import ConvertOptions, convert, open_converted, read_manifest


def _source_map(src: Path) -> dict[str, tuple[bytes, int]]:
    classes = sorted(p.name for p in src.iterdir() if p.is_dir())
    return {str(p.relative_to(src)): (p.read_bytes(), classes.index(p.relative_to(src).parts[0]))
            for p in sorted(src.rglob("*.jpg"))}


def _opts(fmt: str, **kw) -> ConvertOptions:
    kw.setdefault("shard_size", 1 << 20)
    kw.setdefault("readers", 2)
    return ConvertOptions(format=fmt, **kw)


def test_every_image_is_stored_once_with_its_original_bytes_and_label(img_src, fmt, work_dir,
                                                                      read_all):
    res = convert(img_src, work_dir / "out", _opts(fmt))
    assert res.samples == 96 and res.skipped == [] and not res.already_complete
    assert read_all(work_dir / "out") == _source_map(img_src)


def test_manifest_lists_shards_with_true_sizes_and_checksums(img_src, fmt, work_dir):
    dst = work_dir / "out"
    res = convert(img_src, dst, _opts(fmt))
    raw = json.loads((dst / "manifest.json").read_text())
    assert list(raw)[0] == "version" and raw["version"] == 1
    for k in ("format", "num_samples", "num_classes", "classes", "shards", "skipped", "source",
              "options", "created"):
        assert k in raw, k
    m = read_manifest(dst)
    assert (m.format, m.num_samples, m.num_classes) == (fmt, 96, 4)
    assert m.classes == sorted(p.name for p in img_src.iterdir())
    assert m.source["root"] == str(img_src) and m.source["files"] == 96
    assert m.source["bytes"] == sum(p.stat().st_size for p in img_src.rglob("*.jpg"))
    assert sum(s["samples"] for s in m.shards) == 96 == res.samples
    for s in m.shards:
        data = (dst / s["file"]).read_bytes()
        assert len(data) == s["bytes"] and hashlib.sha256(data).hexdigest() == s["sha256"]
    expected = {"data.mdb", "data.idx"} if fmt == "lmdb" else {s["file"] for s in m.shards}
    assert {p.name for p in dst.iterdir()} == expected | {"manifest.json"}  # work dir gone
    if fmt == "wds":
        assert len(m.shards) % 2 == 0 and len(m.shards) >= 2  # a multiple of --readers 2


def test_output_is_byte_identical_whatever_the_worker_count(img_src, fmt, work_dir, tree_digest):
    convert(img_src, work_dir / "w1", _opts(fmt, workers=1))
    convert(img_src, work_dir / "w2", _opts(fmt, workers=2))
    a, b = tree_digest(work_dir / "w1"), tree_digest(work_dir / "w2")
    assert a == b and len(a) >= 2


def test_output_is_the_same_read_in_the_writer_or_by_workers(img_src, fmt, work_dir,
                                                             tree_digest):
    """LMDB reads in the writing process for the header checks and hands batches over
    from workers for full decodes; WebDataset stages shards in an 8 MiB buffer or, for
    a smaller one, writes members straight through: the bytes are the same."""
    import autotune_converters.wds.tarfmt as tarfmt

    convert(img_src, work_dir / "w1", _opts(fmt, workers=1, verify="decode"))
    convert(img_src, work_dir / "w2", _opts(fmt, workers=2, verify="decode"))
    old = tarfmt.TarShardWriter.BUFFER
    tarfmt.TarShardWriter.BUFFER = 96 << 10  # smaller than some images: the direct path
    try:
        convert(img_src, work_dir / "small", _opts(fmt, workers=1, verify="decode"))
    finally:
        tarfmt.TarShardWriter.BUFFER = old
    a, b, c = (tree_digest(work_dir / d) for d in ("w1", "w2", "small"))
    assert a == b == c and len(a) >= 2


def test_seed_changes_the_order_not_the_content(img_src, fmt, work_dir, tree_digest, read_all):
    convert(img_src, work_dir / "s0", _opts(fmt, seed=0))
    convert(img_src, work_dir / "s1", _opts(fmt, seed=1))
    assert tree_digest(work_dir / "s0") != tree_digest(work_dir / "s1")
    assert read_all(work_dir / "s0") == read_all(work_dir / "s1")


def test_samples_are_shuffled_across_classes(img_src, fmt, work_dir):
    convert(img_src, work_dir / "out", _opts(fmt))
    labels = [label for _, label, _ in open_converted(work_dir / "out").records()]
    assert sorted(labels) == sorted(i % 4 for i in range(96))
    # ImageFolder order would be 24 x class 0, 24 x class 1, ...: every stretch of 12
    # consecutive samples must mix classes.
    assert all(len(set(labels[i:i + 12])) > 1 for i in range(0, 96, 12))


def test_a_rerun_of_a_complete_conversion_does_nothing(img_src, fmt, work_dir, tree_digest):
    dst = work_dir / "out"
    first = convert(img_src, dst, _opts(fmt))
    before = tree_digest(dst)
    again = convert(img_src, dst, _opts(fmt))
    assert again.already_complete and again.samples == 96 and tree_digest(dst) == before
    # Every unit the first run wrote is kept (LMDB's two files are not two units).
    assert again.resumed_units == first.units_written > 1 and again.units_written == 0
    with pytest.raises(UsageError, match="other options .*seed 0 -> 5"):
        convert(img_src, dst, _opts(fmt, seed=5))
    other = "lmdb" if fmt == "wds" else "wds"   # an option only one of them has
    with pytest.raises(UsageError, match=r"other options \(format '%s' -> '%s'; readers "
                       % (fmt, other)) as e:
        convert(img_src, dst, _opts(other))
    assert "None" not in str(e.value), e.value


def test_dst_must_be_ours_and_outside_src(img_src, fmt, work_dir):
    foreign = work_dir / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("user data")
    with pytest.raises(UsageError, match="not empty and not an autotune conversion"):
        convert(img_src, foreign, _opts(fmt))
    assert (foreign / "keep.txt").read_text() == "user data"
    with pytest.raises(UsageError, match="inside SRC"):
        convert(img_src, img_src / "out", _opts(fmt))
    with pytest.raises(UsageError, match="no such file"):
        convert(work_dir / "missing", work_dir / "o", _opts(fmt))


def test_too_small_a_dataset_for_the_readers_is_said(img_src, fmt, work_dir):
    res = convert(img_src, work_dir / "out", _opts(fmt, readers=200))
    if fmt == "wds":
        assert res.shards == 96 and any("fewer than the 200 readers" in w for w in res.warnings)
    else:
        assert res.shards == 2 and not res.warnings  # data.mdb + data.idx; read by index


def test_reencode_shrinks_oversized_images_only(img_src, fmt, work_dir, read_all):
    from PIL import Image
    import io

    res = convert(img_src, work_dir / "out", _opts(fmt, max_side=400, quality=80))
    src = _source_map(img_src)
    got = read_all(work_dir / "out")
    assert got.keys() == src.keys()
    big = [p for p in src if max(Image.open(img_src / p).size) > 400]
    assert 0 < len(big) < 96 and res.reencoded == len(big)
    for p, (data, label) in got.items():
        assert label == src[p][1]
        if p in big:
            im = Image.open(io.BytesIO(data))
            assert max(im.size) == 400 and im.format == "JPEG" and data != src[p][0]
        else:
            assert data == src[p][0]
    m = read_manifest(work_dir / "out")
    assert m.stats["reencoded"] == len(big) and m.stats["bytes_saved"] == res.bytes_saved > 0


def test_progress_reports_every_phase_up_to_the_total(img_src, fmt, work_dir):
    seen = []
    convert(img_src, work_dir / "out", _opts(fmt, workers=2), progress=seen.append)
    phases = [p.phase for p in seen]
    assert "convert" in phases and phases[-1] == "publish"
    last = [p for p in seen if p.phase == "convert"][-1]
    assert last.samples == last.total == 96 and last.source_bytes == last.total_bytes
    assert last.units_done == last.units


# -- opening a conversion from a stranger: checked when opened, not mid-epoch -----------
# Every check below happens in open_dataset, before a DataLoader starts: a training run
# must not fail after hours on something a stat or the manifest already said.

@pytest.fixture(scope="module")
def converted(img_src, tmp_path_factory) -> dict[str, Path]:
    """Both formats converted once; each test copies the one it damages."""
    root = tmp_path_factory.mktemp("opened")
    for fmt in ("lmdb", "wds"):
        convert(img_src, root / fmt, _opts(fmt))
    return {fmt: root / fmt for fmt in ("lmdb", "wds")}


def _copy(converted: dict[str, Path], fmt: str, dst: Path) -> tuple[Path, str]:
    """A copy of the `fmt` conversion at `dst`, and the name of its first data file (a
    shard, or data.mdb)."""
    import shutil

    shutil.copytree(converted[fmt], dst)
    return dst, read_manifest(dst).shards[0]["file"]


def _edit(root: Path, change) -> None:  # noqa: ANN001 (a function of the manifest's dict)
    m = json.loads((root / "manifest.json").read_text())
    change(m)
    (root / "manifest.json").write_text(json.dumps(m))


def _read_all_samples(ds) -> int:  # noqa: ANN001 (a dataset of open_dataset)
    if hasattr(ds, "set_epoch"):
        return sum(1 for _ in ds)
    return sum(1 for i in range(len(ds)) if ds[i] is not None)


def test_a_file_cut_short_is_refused_when_opened(converted, fmt, tmp_path):
    """It was found only when an epoch reached the shard (WebDataset), after steps of
    training; LMDB refused it at open already. A manifest's size edited far beyond any
    file's is the same mismatch."""
    from autotune import open_dataset
    from autotune_base.errors import SampleError

    d, name = _copy(converted, fmt, tmp_path / "d")
    size = (d / name).stat().st_size
    os.truncate(d / name, size // 2)
    with pytest.raises(SampleError, match=rf"^{d / name}: {size // 2:,} bytes but manifest\.json "
                                          rf"says {size:,}; .*: copy \(or convert\) again\.$"):
        open_dataset(d, num_workers=2)
    os.truncate(d / name, size)
    _edit(d, lambda m: m["shards"][0].update(bytes=10 ** 30))
    with pytest.raises(SampleError, match=rf"{name}: {size:,} bytes but manifest\.json says "
                                          rf"1,000,000,000,000,000,000,000,000,000,000;"):
        open_dataset(d, num_workers=2)


def test_a_file_that_is_a_link_out_of_the_folder_is_refused_when_opened(converted, fmt,
                                                                        tmp_path):
    """A shard (or data.mdb) replaced by a link to a file elsewhere was read through the
    link; `autotune stage` already refused it. One line naming the file and the fix."""
    from autotune import open_dataset
    from autotune_base.errors import SampleError

    d, name = _copy(converted, fmt, tmp_path / "d")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.rename(d / name, elsewhere / name)
    (d / name).symlink_to(elsewhere / name)
    with pytest.raises(SampleError) as e:
        open_dataset(d, num_workers=2)
    assert str(e.value) == (f"{d / name}: a symbolic link, not followed; a dataset is read only "
                            "from inside its own folder: replace the link with the file itself.")


def test_a_manifest_that_is_a_link_out_of_the_folder_is_refused(converted, fmt, tmp_path):
    """manifest.json is read beneath the folder like the files it lists (it was read
    through a link, whatever its size)."""
    from autotune import open_dataset

    d, _ = _copy(converted, fmt, tmp_path / "d")
    os.rename(d / "manifest.json", tmp_path / "manifest.json")
    (d / "manifest.json").symlink_to(tmp_path / "manifest.json")
    from autotune_converters.registry import manifest_format

    for read in (open_dataset, manifest_format):   # the CLI's --format auto reads it too
        with pytest.raises(UsageError) as e:
            read(d)
        assert str(e.value) == (f"{d / 'manifest.json'}: unreadable (a symbolic link, not "
                                "followed); replace the link with the file itself.")


def test_a_file_swapped_for_a_link_after_opening_is_not_read_through_it(converted, fmt,
                                                                        tmp_path):
    """The readers' own opens (a shard per epoch, data.mdb per process) follow no link
    either: what the check at open saw cannot be replaced behind it."""
    from autotune import open_dataset
    from autotune_base.errors import SampleError

    d, name = _copy(converted, fmt, tmp_path / "d")
    ds = open_dataset(d, decode=False, shuffle=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.rename(d / name, elsewhere / name)
    (d / name).symlink_to(elsewhere / name)
    with pytest.raises(SampleError, match=rf"^{d / name}: a symbolic link, not followed; a "
                                          r"dataset is read only from inside its own folder: "
                                          r"replace the link with the file itself\.$"):
        _read_all_samples(ds)


def test_a_dataset_folder_reached_through_a_link_is_read(converted, fmt, tmp_path):
    """The folder the user names is theirs: /data -> /mnt/nvme/data is read as it is."""
    import torch.utils.data

    from autotune import open_dataset

    (tmp_path / "data").symlink_to(converted[fmt])
    ds = open_dataset(tmp_path / "data", decode=False, num_workers=2)
    assert len(ds) == 96 and _read_all_samples(ds) == 96
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                         shuffle=not hasattr(ds, "set_epoch"))
    assert sum(1 for _ in loader) == 96


@pytest.mark.parametrize("edit, says", [
    (lambda m: m.update(num_samples=m["num_samples"] + 1), r"num_samples is 97 but"),
    (lambda m: m.update(num_samples=10 ** 12), r"num_samples is 1,000,000,000,000 but"),
    (lambda m: m.update(num_samples=10 ** 30), r"num_samples is 1,000,000,000,000,000,000,000,"),
    (lambda m: m.update(num_samples=-1), r"num_samples is -1, not a whole number"),
    (lambda m: m["shards"][0].update(samples=10 ** 30),
     r"shards\[0\] \(shard-\d+\.tar\) lists 1,000,000,000,000,000,000,000,000,000,000 samples "
     r"in [\d,]+ bytes, more than one per 1,024 bytes"),
], ids=["plus-one", "1e12", "1e30", "negative", "shard-1e30"])
def test_hand_edited_counts_are_refused_when_opened(converted, fmt, tmp_path, edit, says):
    """The counts a manifest gives are cross-checked with what the files hold (a shard's
    bytes bound its samples, the shards' samples add up to num_samples, data.idx holds
    one entry per sample) before len() or an index is sized from them: it was a bare
    OverflowError in len() (WebDataset), or an error at the first read (LMDB)."""
    from autotune import open_dataset

    if fmt == "lmdb" and says.startswith("shards"):
        pytest.skip("LMDB's shards are data.mdb and data.idx: no per-shard count is read")
    d, _ = _copy(converted, fmt, tmp_path / "d")
    _edit(d, edit)
    with pytest.raises(UsageError, match=rf"^{d / 'manifest.json'}: {says}") as e:
        open_dataset(d, num_workers=2)
    assert "\n" not in str(e.value) and str(e.value).endswith("convert again.")


def test_opening_and_dropping_a_dataset_keeps_no_descriptor(converted, fmt):
    """A hundred open_dataset calls, a sample read from each and the dataset dropped: as
    many descriptors open after as before (LMDB kept one per call: under `ulimit -n 64`
    the 60th open failed)."""
    import gc

    from autotune import open_dataset

    def one() -> None:
        ds = open_dataset(converted[fmt], decode=False, shuffle=False)
        it = iter(ds) if hasattr(ds, "set_epoch") else iter([ds[0]])
        next(it)
        del it, ds

    one()  # imports, caches: whatever a first call keeps for the process
    gc.collect()
    before = sorted(os.listdir("/proc/self/fd"))
    for _ in range(100):
        one()
    gc.collect()  # only for cycles not of our making: the sources themselves die at `del`
    assert sorted(os.listdir("/proc/self/fd")) == before
