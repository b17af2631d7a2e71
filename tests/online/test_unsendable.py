"""A batch a worker cannot send back: loading stays in the training process.

A worker's queue thread pickles each batch; where that fails (a sample holding a
generator, a lock, an open handle) it prints the error and drops the batch, and the loop
waits for it for ever. With torch's default num_workers=0 the same dataset trains: the
workers autotune starts where the user gave none must not hang it."""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from autotune.sendable import why_unsendable

ROOT = Path(__file__).resolve().parents[2]

_TRAIN = textwrap.dedent("""
    import logging, torch, autotune
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")

    class Lazy(torch.utils.data.Dataset):   # a sample with a generator in it
        def __len__(self):
            return 256

        def __getitem__(self, i):
            return torch.full((4,), i), (i * k for k in range(3))

    dl = autotune.DataLoader(Lazy(), batch_size=8, collate_fn=lambda b: b)
    for epoch in range(3):
        seen = sorted(int(x[0][0]) for b in dl for x in b)
        print("epoch", epoch, seen == list(range(256)), flush=True)
    print("workers", dl.num_workers, flush=True)
    dl.close()
""")


def test_a_batch_workers_cannot_send_keeps_loading_in_this_process(tmp_path):
    """Before: the first batch was made here, 2 workers started, their batches were
    dropped, and the second epoch never ended (killed here after 60 s)."""
    script = tmp_path / "train.py"
    script.write_text(_TRAIN)
    env = dict(os.environ, PYTHONPATH=str(ROOT), AUTOTUNE_CACHE_DIR=str(tmp_path / "cache"))
    try:
        r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           env=env, cwd=tmp_path, timeout=60)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the run hung: {(e.stderr or b'')[-3000:]!r}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == ["epoch 0 True", "epoch 1 True", "epoch 2 True",
                                     "workers 0"], (r.stdout, r.stderr[-3000:])
    said = [ln for ln in r.stderr.splitlines()
            if ln.startswith("WARNING the first batch cannot be sent from a worker")]
    assert len(said) == 1 and "cannot pickle 'generator' object" in said[0], r.stderr[-3000:]
    assert "_feed" not in r.stderr   # no worker's queue thread ever tried


def test_what_the_check_lets_through_and_what_it_stops():
    import threading

    fine = [torch.zeros(3), {"image": np.zeros((2, 2)), "name": "a.jpg", "label": 3},
            (torch.zeros(2).untyped_storage(),)]
    assert why_unsendable(fine) is None
    t = torch.zeros(1000)
    why_unsendable([t])
    assert not t.is_shared()   # the check moved nothing to shared memory
    assert "generator" in why_unsendable([(k for k in range(2))])
    assert "lock" in why_unsendable({"x": [threading.Lock()]})
    # An array of objects is looked into; one of numbers never fails.
    assert why_unsendable(np.array([threading.Lock()], dtype=object)) is not None
    # torch's own refusal in a worker: a non-leaf tensor that requires grad.
    leaf = torch.ones(2, requires_grad=True)
    assert "non-leaf tensor" in why_unsendable([leaf * 2]) and why_unsendable([leaf]) is None
    # A partial is pickled through, and what it holds may fail.
    assert why_unsendable([functools.partial(lambda x: x, 1)]) is not None
    # A socket goes multiprocessing's way: taken as sent, with no descriptor or thread made.
    with socket.socket() as sock:
        fds, threads = len(os.listdir("/proc/self/fd")), threading.active_count()
        assert why_unsendable([sock]) is None
        assert (len(os.listdir("/proc/self/fd")), threading.active_count()) == (fds, threads)
