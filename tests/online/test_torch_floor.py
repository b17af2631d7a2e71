"""autotune.DataLoader on a torch older than its floor (2.6, DataLoader's in_order=): one
line naming both versions, not a TypeError from inside torch. The old torch is imitated by
a DataLoader class without the keyword; the real torch here has it (test_api covers it)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

import autotune
from autotune.errors import UsageError
from autotune.online import loader


class _OldTorchLoader:
    """torch 2.5's DataLoader signature: everything but in_order."""

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=0, collate_fn=None, pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor=None, persistent_workers=False, pin_memory_device=""):
        raise AssertionError("never reached: the floor is checked first")


def test_an_older_torch_is_named_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "TorchLoader", _OldTorchLoader)
    with pytest.raises(UsageError) as e:
        autotune.DataLoader(TensorDataset(torch.arange(8)), batch_size=2)
    msg = str(e.value)
    assert "\n" not in msg and "torch 2.6 or newer" in msg and torch.__version__ in msg, msg
