"""`autotune.DataLoader` is exported lazily: `import autotune` stays free of torch."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import autotune
from autotune.errors import UsageError
from online_datasets import Slow


def test_import_autotune_does_not_import_torch():
    code = ("import sys, autotune; assert 'torch' not in sys.modules; "
            "autotune.DataLoader; assert 'torch' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert "DataLoader" in autotune.__all__


def test_torch_argument_errors_are_torchs():
    with pytest.raises(ValueError, match="mutually exclusive"):
        autotune.DataLoader(Slow(8), batch_size=2, batch_sampler=[[0, 1]])
    with pytest.raises(ValueError, match="teleport"):
        autotune.DataLoader(Slow(8), multiprocessing_context="teleport")
    with pytest.raises(UsageError, match="memory_budget must be a positive"):
        autotune.DataLoader(Slow(8), memory_budget=-1)
    # Given with num_workers=0, the worker-only settings are refused as torch refuses them
    # (not given, they are tuned: no error).
    for kw, msg in ((dict(prefetch_factor=2), "prefetch_factor option could only"),
                    (dict(persistent_workers=True), "persistent_workers option needs"),
                    (dict(multiprocessing_context="spawn"), "multiprocessing_context can only"),
                    (dict(), "num_workers option should be non-negative")):
        nw = -1 if not kw else 0
        with pytest.raises(ValueError, match=msg):
            torch.utils.data.DataLoader(Slow(8), num_workers=nw, **kw)
        with pytest.raises(ValueError, match=msg):
            autotune.DataLoader(Slow(8), num_workers=nw, _controller=False, **kw)
    autotune.DataLoader(Slow(8), prefetch_factor=2, persistent_workers=True, _controller=False)


def test_attributes_as_torch_has_them():
    g = torch.Generator()
    loader = autotune.DataLoader(Slow(10), batch_size=3, shuffle=True, generator=g,
                                 _controller=False)
    plain = torch.utils.data.DataLoader(Slow(10), batch_size=3, shuffle=True, generator=g)
    assert len(loader) == len(plain) == 4
    assert type(loader.sampler) is type(plain.sampler) and loader.sampler.generator is g
    assert loader.batch_size == 3 and loader.drop_last is False and loader.generator is g
    assert isinstance(loader.num_workers, int)
    loader.close()


def _accelerator() -> bool:
    acc = getattr(torch, "accelerator", None)
    return bool(acc.is_available()) if acc is not None else torch.cuda.is_available()


@pytest.mark.skipif(_accelerator(), reason="pin_memory pins where an accelerator is present")
def test_pin_memory_without_an_accelerator_is_said_once_at_the_users_line():
    """pin_memory=True on a machine without a GPU (a CUDA torch on a CPU host, a laptop):
    torch's DataLoader says once that nothing is pinned. autotune.DataLoader made a torch
    iterator per pool (the first batch's, the workers', each switch) inside
    warnings.catch_warnings(), which resets Python's once-per-location record, so the same
    torch warning came again at each pool, pointing into torch."""
    import warnings

    dataset = torch.utils.data.TensorDataset(torch.randn(512, 3, 8, 8), torch.arange(512))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("default")
        loader = autotune.DataLoader(dataset, batch_size=16, shuffle=True, pin_memory=True)
        seen = []
        for _ in range(2):
            seen += [y for _, y in loader]
        loader.close()
    assert sorted(torch.cat(seen).tolist()) == sorted(list(range(512)) * 2)
    said = [w for w in rec if "pin_memory" in str(w.message)]
    assert len(said) == 1, [f"{w.filename}:{w.lineno}: {w.message}" for w in said]
    assert said[0].filename == __file__, said[0].filename
