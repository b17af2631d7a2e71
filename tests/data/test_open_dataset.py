"""autotune.open_dataset: one torch Dataset over a folder, its conversions and their staged
copies; every sample once per epoch with the source folder's labels, through real
DataLoader worker processes; ranks split equally (dropped or padded); each bad input in
one line."""

from __future__ import annotations

import collections
import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch.utils.data

import autotune
from autotune.errors import DatasetError, SampleError, UsageError


def _h(b: bytes) -> str:
    return hashlib.sha1(b).hexdigest()


def hash_bytes(b: bytes) -> str:   # module level: picklable for the workers
    return _h(b)


@pytest.fixture(scope="module")
def made(small_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The folder, its WebDataset (about a dozen shards) and LMDB conversions, and staged
    copies of the WebDataset conversion and of the folder."""
    from autotune_converters import ConvertOptions, convert
    from autotune_converters.stage import stage

    base = tmp_path_factory.mktemp("opends")
    out = {"folder": small_dataset}
    convert(small_dataset, base / "wds", ConvertOptions(format="wds", workers=1, readers=6,
                                                        shard_size=400_000))
    convert(small_dataset, base / "lmdb", ConvertOptions(format="lmdb", workers=1))
    out["wds"], out["lmdb"] = base / "wds", base / "lmdb"
    for name in ("wds", "folder"):
        res = stage(out[name], base / f"staged-{name}", workers=1)
        assert not res.partial
        out[f"staged-{name}"] = base / f"staged-{name}"
    return out


@pytest.fixture(scope="module")
def truth(small_dataset: Path) -> collections.Counter:
    """(sha1 of the file's bytes, class folder) of every image in the source folder."""
    return collections.Counter((_h(p.read_bytes()), p.parent.name)
                               for p in small_dataset.glob("*/*.jpg"))


def _epoch(ds, workers: int = 2) -> collections.Counter:
    loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=workers,
                                         collate_fn=list)
    batches = iter(loader)
    try:
        return collections.Counter((h, ds.classes[label]) for batch in batches
                                   for h, label in batch)
    finally:
        # After a worker's error torch's reraise leaves the iterator in a reference cycle;
        # by the time the garbage collector frees it the queues' finalizers have stopped
        # their feeder threads, so the workers never get the stop sentinel and torch
        # waits its 5 s join timeout for each (any dataset's error, not open_dataset's).
        # Stopping them here, while the queues work, takes milliseconds.
        if workers:
            batches._shutdown_workers()


@pytest.mark.parametrize("kind", ["folder", "wds", "lmdb", "staged-wds", "staged-folder",
                                  "lmdb-stream"])
def test_every_sample_once_an_epoch_with_the_folders_labels(made, truth, kind):
    stream = kind == "lmdb-stream"
    ds = autotune.open_dataset(made["lmdb" if stream else kind], transform=hash_bytes,
                               decode=False, iterable=True if stream else None)
    assert ds.classes == sorted(p.name for p in made["folder"].iterdir())
    assert ds.class_to_idx == {c: i for i, c in enumerate(ds.classes)}
    iterable = isinstance(ds, torch.utils.data.IterableDataset)
    assert iterable == (kind.endswith("wds") or stream)
    assert ds.format == {"lmdb-stream": "lmdb"}.get(kind, kind.split("-")[-1])
    assert len(truth) == sum(truth.values()) == 64   # distinct images
    assert _epoch(ds) == truth
    if iterable:   # the next epoch: another order, the same samples
        ds.set_epoch(1)
        assert _epoch(ds) == truth


def test_the_default_sample_is_the_decoded_rgb_image(made):
    from PIL import Image

    for kind in ("folder", "lmdb", "wds"):
        ds = autotune.open_dataset(made[kind])
        im, label = ds[0] if kind != "wds" else next(iter(ds))
        assert isinstance(im, Image.Image) and im.mode == "RGB" and 0 <= label < 4


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("kind", ["wds", "lmdb"])
def test_ranks_read_equal_counts_the_remainder_dropped_or_padded(made, truth, drop_last, kind):
    world = 3 if kind == "wds" else 5   # 64 one-sample LMDB blocks: 5 ranks leave 4 over
    per_rank = []
    for rank in range(world):
        ds = autotune.open_dataset(made[kind], transform=hash_bytes, decode=False,
                                   rank=rank, world_size=world, drop_last=drop_last,
                                   num_workers=2, iterable=True)
        got = _epoch(ds)
        assert sum(got.values()) == len(ds)
        per_rank.append(got)
    counts = [sum(c.values()) for c in per_rank]
    assert len(set(counts)) == 1, counts
    union = sum(per_rank, collections.Counter())
    if drop_last:    # nothing twice, some left out
        assert set(union) <= set(truth) and max(union.values()) == 1
        assert sum(union.values()) < 64
    else:            # everything at least once, some twice
        assert set(union) == set(truth) and sum(union.values()) > 64
    # Rank 0's first worker says it, once per process (here: in this one, no workers).
    ds = autotune.open_dataset(made[kind], decode=False, rank=0, world_size=world,
                               drop_last=drop_last, seed=5, iterable=True)
    with pytest.warns(UserWarning, match="dropped" if drop_last else "read twice, padded"):
        list(ds)


def test_no_shuffle_reads_the_stored_order(made):
    ds = autotune.open_dataset(made["wds"], transform=hash_bytes, decode=False, shuffle=False)
    from autotune_converters.wds.reader import WdsSource

    stored = [_h(b) for b, _, _ in WdsSource(made["wds"]).records()]
    assert [h for h, _ in ds] == stored


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def test_a_path_with_nothing_readable_names_the_path_and_the_formats(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "a.jpg").write_bytes(b"x")
    (tmp_path / "empty").mkdir()
    for p in (flat, tmp_path / "empty", tmp_path / "missing", flat / "a.jpg"):
        with pytest.raises(DatasetError) as e:
            autotune.open_dataset(p)
        msg = _one_line(e)
        assert str(p) in msg and "manifest.json" in msg and "PATH/CLASS/IMAGE.jpg" in msg, msg
        assert isinstance(e.value, ValueError) and e.value.exit_code == 2


def test_a_manifest_from_a_newer_autotune_names_both_versions(made, tmp_path):
    for kind in ("wds", "staged-folder"):
        copy = tmp_path / kind
        shutil.copytree(made[kind], copy)
        m = json.loads((copy / "manifest.json").read_text())
        m["version"] = 7
        (copy / "manifest.json").write_text(json.dumps(m))
        with pytest.raises(DatasetError) as e:
            autotune.open_dataset(copy)
        msg = _one_line(e)
        assert "manifest version 7" in msg and "version 1" in msg and "upgrade" in msg, msg


def test_more_readers_than_shards_names_both_numbers(made, small_dataset, tmp_path):
    ds = autotune.open_dataset(made["wds"])
    shards = len(ds.shards)
    with pytest.raises(DatasetError) as e:
        autotune.open_dataset(made["wds"], num_workers=shards + 1)
    msg = _one_line(e)
    assert f"{shards + 1} readers" in msg and f"{shards} shards" in msg, msg
    assert f"num_workers={shards} or fewer" in msg and "--readers" in msg, msg
    # Found in the workers too when open_dataset was not told: 2 workers, one shard.
    from autotune_converters import ConvertOptions, convert

    convert(small_dataset, tmp_path / "one", ConvertOptions(format="wds", workers=1, readers=1,
                                                           shard_size=1 << 30))
    one = autotune.open_dataset(tmp_path / "one", decode=False)
    assert len(one.shards) == 1
    with pytest.raises(DatasetError, match=r"2 readers \(2 DataLoader worker\(s\) x 1 rank"):
        _epoch(one)


def bad_transform(x):
    raise ValueError("no good")


@pytest.mark.parametrize("kind", ["folder", "lmdb", "wds", "lmdb-stream"])
def test_a_transform_that_raises_names_the_sample_and_its_source(made, kind):
    stream = kind == "lmdb-stream"
    ds = autotune.open_dataset(made["lmdb" if stream else kind], transform=bad_transform,
                               iterable=True if stream else None)
    with pytest.raises(SampleError) as e:
        ds[0] if kind in ("folder", "lmdb") else next(iter(ds))
    msg = str(e.value)
    assert "bad_transform raised ValueError: no good" in msg, msg
    assert isinstance(e.value.__cause__, ValueError)
    if kind == "folder":
        assert str(made["folder"]) in msg and ".jpg" in msg
    elif kind == "lmdb":
        assert "data.mdb key 0000000000" in msg and ".jpg" in msg
    elif stream:
        assert "data.mdb#" in msg and " key 00000000" in msg and ".jpg" in msg
    else:
        assert ".tar key " in msg and ".jpg" in msg
    # Through a worker process: the same type, the same message inside torch's.
    with pytest.raises(SampleError, match="bad_transform raised ValueError"):
        _epoch(ds)


def test_importing_autotune_does_not_import_torch():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", "import autotune, sys; "
                        "assert callable(autotune.__getattr__('open_dataset').__call__); "
                        "print('torch' in sys.modules)"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-c", "import autotune, sys; print('torch' in sys.modules)"],
                       capture_output=True, text=True)
    assert r.stdout.strip() == "False", r.stdout + r.stderr


def test_a_format_that_is_not_there_is_a_usage_error(made):
    with pytest.raises(UsageError, match="format lmdb needs the manifest.json"):
        autotune.open_dataset(made["folder"], format="lmdb")
    with pytest.raises(UsageError, match="no stored order to stream"):
        autotune.open_dataset(made["folder"], iterable=True)
    with pytest.raises(UsageError, match="no random access"):
        autotune.open_dataset(made["wds"], iterable=False)


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("kind", ["wds", "lmdb"])
def test_the_ranks_warning_names_only_what_open_dataset_takes(made, drop_last, kind):
    """The warning that ranks were equalized says what to pass instead; an open_dataset
    user who passed what it names got a TypeError (it named the reader's `equalize=` and
    `pad=`, which open_dataset does not take)."""
    import inspect
    import re

    ds = autotune.open_dataset(made[kind], decode=False, rank=0, world_size=3 if kind == "wds"
                               else 5, drop_last=drop_last, seed=11, iterable=True)
    with pytest.warns(UserWarning, match="every rank takes the same number") as rec:
        list(ds)
    text = " ".join(str(w.message) for w in rec if "every rank" in str(w.message))
    named = set(re.findall(r"\b([a-z_]+)=", text))
    assert named, text
    assert named <= set(inspect.signature(autotune.open_dataset).parameters), (named, text)
