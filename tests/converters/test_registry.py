"""The format registry: one place that knows the formats; a new format is one module plus
one `register` line, and `autotune bench` reads it (in its own measurement process)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from autotune.bench import BenchConfig, run_bench
from autotune.errors import UsageError
from autotune_converters import registry
from autotune_converters.registry import Format

# A whole format, as a newcomer would write it: a reader over one file of concatenated
# JPEGs with a JSON index, and a sniff that recognises its index file.
TOY_MODULE = textwrap.dedent('''
    import json, os
    from pathlib import Path
    from autotune_converters.source import SampleSource

    def sniff(path):
        return (Path(path) / "toy.json").is_file()

    class ToySource(SampleSource):
        format = "toy"

        def __init__(self, root, **kw):
            super().__init__(root)
            self.index = json.loads((self.root / "toy.json").read_text())
            self._fd = None

        def __len__(self):
            return len(self.index["samples"])

        @property
        def classes(self):
            return self.index["classes"]

        def read(self, i):
            if self._fd is None or self._pid != os.getpid():
                self._fd, self._pid = os.open(self.root / "blob.bin", os.O_RDONLY), os.getpid()
            off, n, label = self.index["samples"][i]
            return os.pread(self._fd, n, off), label

        def describe(self, i):
            return f"{self.root}/blob.bin sample {i}"

        def files(self):
            return iter([self.root / "blob.bin", self.root / "toy.json"])

        def __getstate__(self):
            d = self.__dict__.copy()
            d["_fd"] = None
            return d
''')


@pytest.fixture
def toy(tmp_path: Path, img_src: Path):
    """The toy format registered from this test, and a 96-image dataset written in it."""
    mod = tmp_path / "toyfmt.py"
    mod.write_text(TOY_MODULE)
    ds = tmp_path / "toy-ds"
    ds.mkdir()
    classes = sorted(p.name for p in img_src.iterdir() if p.is_dir())
    samples, off = [], 0
    with open(ds / "blob.bin", "wb") as f:
        for label, c in enumerate(classes):
            for img in sorted((img_src / c).iterdir()):
                b = img.read_bytes()
                f.write(b)
                samples.append([off, len(b), label])
                off += len(b)
    (ds / "toy.json").write_text(json.dumps({"classes": classes, "samples": samples}))
    fmt = registry.register(Format("toy", reader=f"{mod}:ToySource", sniff=f"{mod}:sniff",
                                   description="a toy format of the registry test"))
    yield fmt, ds
    registry.unregister("toy")


def test_a_registered_format_is_detected_chosen_and_read(toy) -> None:
    fmt, ds = toy
    assert "toy" in registry.choices() and "toy" not in registry.names(writable=True)
    assert registry.detect(ds) == "toy"
    src = registry.open_source(ds)
    assert src.format == "toy" and len(src) == 96 and len(src.classes) == 4
    data, label = src.read(5)
    assert data[:2] == b"\xff\xd8" and 0 <= label < 4          # a whole JPEG comes back
    with pytest.raises(UsageError, match="cannot be written"):
        fmt.writer_class()


def test_bench_reads_a_format_registered_by_the_caller(toy) -> None:
    # The measurement runs in a fresh process: the registration travels with it.
    _fmt, ds = toy
    cfg = BenchConfig.from_preset("decode-only", num_workers=1, batch_size=8, seconds=1.0,
                                  cold=False, warmup_batches=1)
    res = run_bench(ds, cfg)
    assert not res.failed, (res.reason, res.process.get("log_tail"))
    assert res.dataset["format"] == "toy" and res.dataset["images"] == 96
    assert res.images_per_s and res.images_per_s > 0


def test_registry_refuses_misuse() -> None:
    with pytest.raises(ValueError, match="already registered"):
        registry.register(Format("wds", reader="x:y", sniff="x:z"))
    with pytest.raises(ValueError, match="reserved"):
        Format("auto", reader="x:y", sniff="x:z")
    with pytest.raises(ValueError, match="built in"):
        registry.unregister("lmdb")
    with pytest.raises(UsageError, match="format must be one of auto, folder, lmdb, wds"):
        registry.get("parquet")
