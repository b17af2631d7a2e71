"""autotune.DataLoader on a torch older than 2.6, whose DataLoader has no in_order=: the
environment's torch is kept (pyproject.toml's floor is 2.1), so the keyword is left out
where in_order=True (batches come in order there anyway), and in_order=False is one line
naming both versions, not a TypeError from inside torch. The old torch is imitated by
torch's own DataLoader refusing the keyword, as torch 2.5's did; the suite also ran whole
on a real torch 2.1.2 (docs/install.md)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import TensorDataset

import autotune
from autotune.errors import UsageError
from autotune.online import loader


@pytest.fixture
def old_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    real = TorchLoader.__init__

    def init(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if "in_order" in kwargs:
            raise TypeError("DataLoader.__init__() got an unexpected keyword argument "
                            "'in_order'")
        real(self, *args, **kwargs)

    monkeypatch.setattr(TorchLoader, "__init__", init)
    monkeypatch.setattr(loader, "_TORCH_IN_ORDER", False, raising=False)


def test_an_older_torch_runs_the_tuned_loader_in_order(old_torch: None) -> None:
    dl = autotune.DataLoader(TensorDataset(torch.arange(64)), batch_size=8, num_workers=2)
    for _ in range(2):
        assert torch.cat([b for (b,) in dl]).tolist() == list(range(64))


def test_out_of_order_on_an_older_torch_is_named_in_one_line(old_torch: None) -> None:
    with pytest.raises(UsageError) as e:
        autotune.DataLoader(TensorDataset(torch.arange(8)), batch_size=2, in_order=False)
    msg = str(e.value)
    assert "\n" not in msg and "torch 2.6 or newer" in msg and torch.__version__ in msg, msg


def test_a_callers_type_error_fallback_for_an_older_torch_still_works(old_torch: None) -> None:
    """Code written for several torches tries the keyword and falls back where torch's
    DataLoader refuses it with a TypeError; autotune's refusal is one too."""
    try:
        dl = autotune.DataLoader(TensorDataset(torch.arange(8)), batch_size=2, in_order=False)
    except TypeError:
        dl = autotune.DataLoader(TensorDataset(torch.arange(8)), batch_size=2)
    assert [b.tolist() for (b,) in dl] == [[0, 1], [2, 3], [4, 5], [6, 7]]
