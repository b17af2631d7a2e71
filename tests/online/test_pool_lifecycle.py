"""A pool's start, hand-off and end with real worker processes, spawn and forkserver
included: a pool still starting on its own thread when the epoch ends."""

from __future__ import annotations

import pytest

import autotune
from online_datasets import Slow


class _Heavy(Slow):
    """A dataset whose pickle fills the pipe to a spawned worker: its Process.start returns
    only once the new interpreter has imported torch and read it (a second or more), so a
    pool started on its own thread is still starting when a short epoch ends."""

    def __init__(self, n: int) -> None:
        super().__init__(n, 0.0)
        self.ballast = bytes(1 << 20)


@pytest.mark.parametrize("ctx", ["fork", "spawn", "forkserver"])
def test_a_pool_handed_on_while_starting_loses_no_batch(ctx):
    """Each epoch forces a new pool at its first batch and ends (or is left at its second
    batch) long before that pool's spawn/forkserver workers are up: the next epoch starts on
    it. Opened while its own thread still started it, a second inner iterator lost the
    index batches the first had taken (48 of 80 samples, out of order)."""
    loader = autotune.DataLoader(_Heavy(40), batch_size=4, shuffle=False,
                                 multiprocessing_context=ctx, _controller=False)
    got = []
    try:
        for e in range(4):
            seen = []
            for i, b in enumerate(loader):
                if i == 0:
                    loader._force_config(1, 2 + e % 2)  # one worker: a new pool each time
                seen += b.flatten().tolist()
                if e % 2 and i == 1:
                    break  # left early: the next iter() takes the pool still starting
            got.append(seen)
    finally:
        loader.close()
    for e, seen in enumerate(got):
        want = list(range(8)) if e % 2 else list(range(40))
        assert seen == want, f"epoch {e}"
