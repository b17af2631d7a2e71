"""The open-files limit (`ulimit -n`): the workers autotune starts stay within it.

With torch's file_descriptor sharing strategy every tensor of a batch in flight is an open
file in its worker. Over the limit the worker's queue thread failed with EMFILE and dropped
the batch, and the training loop waited for it for ever: a hang the user, who gave no
num_workers, would never have had with torch's default of none."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_TRAIN = textwrap.dedent("""
    import logging, torch, autotune
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")

    class Many(torch.utils.data.Dataset):   # 48 tensors a sample, as a detection target's
        def __len__(self):
            return 400

        def __getitem__(self, i):
            return [torch.full((8,), i) for _ in range(48)]

    dl = autotune.DataLoader(Many(), batch_size=4)
    for epoch in range(2):
        seen = sorted(int(v) for b in dl for v in b[0][:, 0])
        print("epoch", epoch, seen == list(range(400)), flush=True)
    print("workers", dl.num_workers, "prefetch", dl.prefetch_factor, flush=True)
    dl.close()
""")


def _raise_to() -> str:
    """The fix the tests' children are told: their soft limit is 140, their hard one this
    process's, which `ulimit -n` may reach without privilege."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return f"`ulimit -n {65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)}`"


def _run_at_soft_limit(tmp_path: Path, code: str, soft: int,
                       timeout: int) -> subprocess.CompletedProcess:
    """`code` as a script in a process whose soft open-files limit is `soft` (the hard one
    this process's); a run past `timeout` is a hang, and fails the test."""
    script = tmp_path / "train.py"
    script.write_text(code)

    def low_limit() -> None:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    env = dict(os.environ, PYTHONPATH=str(ROOT), AUTOTUNE_CACHE_DIR=str(tmp_path / "cache"))
    try:
        return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              env=env, cwd=tmp_path, preexec_fn=low_limit, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the run hung past {timeout} s: {(e.stderr or b'')[-3000:]!r}")


def test_the_fix_names_the_hard_limit_where_the_soft_one_may_rise_to_it():
    """A container's soft 1024 under a hard 524288 needs no privilege to raise: the fix says
    so with the figure; a soft limit already at the hard one needs the container's."""
    code = "from autotune.openfiles import fix; print(fix())"
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    for soft_hard, said in (((140, hard), "so no privilege is needed"),
                            ((140, 140), "at its hard limit: docker run --ulimit nofile=")):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60,
                           preexec_fn=lambda sh=soft_hard: resource.setrlimit(
                               resource.RLIMIT_NOFILE, sh))
        assert r.returncode == 0 and said in r.stdout, (soft_hard, r.stdout, r.stderr[-2000:])
    assert _raise_to() in subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (140, hard))).stdout


def test_a_low_open_files_limit_is_fitted_not_a_hang(tmp_path):
    """ulimit -n 140 and 48 tensors a batch: 2 workers 2 batches ahead held about 157 files
    each (measured), their batches were dropped and the first epoch never ended (killed
    here after 60 s; at ulimit -n 190 with 64 tensors the run died of an EOFError instead).
    Now the start point is fitted to the limit, both epochs deliver every sample, and the
    decision names the limit and its fix."""
    r = _run_at_soft_limit(tmp_path, _TRAIN, 140, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines()[:2] == ["epoch 0 True", "epoch 1 True"], r.stdout
    fit = [ln for ln in r.stderr.splitlines() if ln.startswith(("INFO start at", "WARNING start at"))
           and "open files" in ln]
    assert fit and "over this process's limit of 140 (ulimit -n)" in fit[0], r.stderr[-3000:]
    assert _raise_to() in fit[0] and "--shm-size" not in r.stderr, r.stderr[-3000:]


def test_the_training_process_running_out_of_files_is_named_as_such():
    """torch's own error when the training process cannot take a batch's tensors: the
    fallback names the open-files limit and its fix, not /dev/shm and --shm-size."""
    from autotune.online.failure import classify

    for text in ("Too many open files. Communication with the workers is no longer "
                 "possible. Please increase the limit using `ulimit -n` in the shell",
                 "received 0 items of ancdata",
                 "unable to open shared memory object </torch_1_2_3> in read-write mode: "
                 "Too many open files (24)"):
        why = classify(RuntimeError(text), [])
        assert why is not None and why.kind == "files", (text, why)
        assert "open-files limit" in why.detail and "ulimit -n" in why.detail
    assert classify(RuntimeError("unable to allocate shared memory(shm) for file "
                                 "</torch_1>: No space left on device (28)"), []).kind == "shm"

    def rebuild_storage_fd():   # torch's, where a worker past its limit hangs up
        raise EOFError

    try:
        rebuild_storage_fd()
    except EOFError as e:
        assert classify(e, []).kind == "files"
    assert classify(EOFError(), []) is None   # any other EOFError is the user's


_HANDOFF = textwrap.dedent("""
    import json, socket, sys, warnings, torch, autotune

    class Many(torch.utils.data.Dataset):
        def __len__(self):
            return 400

        def __getitem__(self, i):
            return [torch.full((8,), i) for _ in range(48)]

    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        kw = autotune.loader_kwargs(sys.argv[1])
    print(json.dumps({"kw": kw, "said": [str(w.message) for w in ws]}), flush=True)
    seen = sorted(int(v) for b in torch.utils.data.DataLoader(Many(), **kw) for v in b[0][:, 0])
    print("epoch", seen == list(range(400)), flush=True)
""")


def test_a_search_from_a_machine_with_more_open_files_is_fitted_here(tmp_path):
    """A search made where `ulimit -n` is high recommended 2 workers 2 batches ahead for a
    batch of 48 tensors. Handed to a plain DataLoader under `ulimit -n 140` they dropped
    batches and the epoch waited for ever. loader_kwargs now fits them to this process's
    limit, says so, and the epoch ends with every sample."""
    import json
    import socket

    p = tmp_path / "search.json"
    config = {"num_workers": 2, "prefetch_factor": 2, "persistent_workers": False,
              "pin_memory": False}
    p.write_text(json.dumps({
        "batch_size": 4, "batch_size_from": "option",
        "recommended": {"config": config}, "loader_kwargs": {"batch_size": 4, **config},
        "host": {"hostname": socket.gethostname()},
        "shm": {"batch_bytes": 48 * 8 * 4 * 8, "batch_size": 4, "budget_bytes": None,
                "batch_tensors": 48}}))
    script = tmp_path / "train.py"
    script.write_text(_HANDOFF)

    def low_limit() -> None:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (140, hard))

    try:
        r = subprocess.run([sys.executable, str(script), str(p)], capture_output=True,
                           text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=tmp_path,
                           preexec_fn=low_limit, timeout=60)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the epoch hung past 60 s: {(e.stderr or b'')[-2000:]!r}")
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout.splitlines()
    d = json.loads(out[0])
    assert (d["kw"]["num_workers"], d["kw"].get("prefetch_factor")) != (2, 2), d
    said = [w for w in d["said"] if "open files" in w]
    assert len(said) == 1 and "limit of 140 (ulimit -n)" in said[0], d["said"]
    assert "epoch waits for it for ever" in said[0] and _raise_to() in said[0]
    assert out[1] == "epoch True", r.stdout


def test_the_fit_shortens_the_queue_first_and_keeps_what_the_user_gave(monkeypatch):
    """The batches ahead are what the files grow with, in the workers and in this process:
    the prefetch is halved before a worker is cut, a num_workers given is kept with its
    prefetch still fitted, a prefetch_factor given is kept, and with the file_system
    sharing strategy (no file a tensor) nothing is cut for files."""
    from autotune import openfiles
    from autotune.online.controller import Controller, MemoryFigures
    from autotune.online.limits import fit

    monkeypatch.setattr(openfiles, "limit", lambda: 1024)
    monkeypatch.setattr(openfiles, "open_now", lambda: 60)
    monkeypatch.setattr(openfiles, "_shares_by_fd", lambda: True)

    def ctl(**fixed):
        return Controller(fixed=fixed, cuda=False, budget=10**12, bound=16,
                          memory=lambda: MemoryFigures(1, 1, True, tensors=48))

    c = ctl()
    # 8 x 8 ahead: 64 batches of 48 tensors in this process alone; 8 x 2 holds 60 + 48 x 17
    got = fit(c, c.make(8, 8))
    assert (got.num_workers, got.prefetch_factor) == (8, 2), got
    c = ctl(num_workers=8)
    got = fit(c, c.make(8, 8))
    assert (got.num_workers, got.prefetch_factor) == (8, 2), got
    c = ctl(prefetch_factor=8)
    got = fit(c, c.make(8, 8))
    assert got.prefetch_factor == 8 and got.num_workers < 8, got
    monkeypatch.setattr(openfiles, "_shares_by_fd", lambda: False)
    c = ctl()
    assert fit(c, c.make(8, 8)) == c.make(8, 8)


_DETECTION = textwrap.dedent("""
    import logging, torch, autotune
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")

    class Det(torch.utils.data.Dataset):   # torchvision detection's shape: a target dict
        def __len__(self):
            return 1000

        def __getitem__(self, i):
            return torch.full((3, 8, 8), float(i)), {"boxes": torch.zeros(5, 4),
                                                      "labels": torch.zeros(5), "i": torch.tensor(i)}

    dl = autotune.DataLoader(Det(), batch_size=32, num_workers=8,
                             collate_fn=lambda b: tuple(zip(*b)))   # 128 tensors a batch
    for epoch in range(3):
        seen = sorted(int(t["i"]) for _, targets in dl for t in targets)
        print("epoch", epoch, seen == list(range(1000)), flush=True)
    dl.close()
""")


def test_a_pool_the_open_files_limit_refused_is_followed_by_one_that_runs_or_a_named_error(
        tmp_path):
    """num_workers=8 given, 128 tensors a batch (a detection collate), soft ulimit -n 1024:
    8 workers 2 deep fail ("received 0 items of ancdata"), as torch's own DataLoader does.
    The fallback's new pool forked while the failed one's batches received ahead of their
    turn were still held (the error's traceback kept its iterator): every new worker
    inherited ~900 open files and the epoch hung on EMFILE. Now those batches are dropped
    first, and 8 workers 1 deep carry the epochs on; where they fail too, torch's error is
    raised after a WARNING that names the limit and its fix. Never a hang."""
    r = _run_at_soft_limit(tmp_path, _DETECTION, 1024, timeout=150)
    if r.returncode == 0:
        assert r.stdout.split() == ["epoch", "0", "True", "epoch", "1", "True",
                                    "epoch", "2", "True"], r.stdout
    else:
        said = [ln for ln in r.stderr.splitlines() if ln.startswith("WARNING")
                and "leaves nothing less within the open-files limit" in ln]
        assert said and "(1024, ulimit -n)" in said[0] and _raise_to() in said[0], \
            r.stderr[-3000:]
        # torch's error: where the training process met the limit ("received 0 items of
        # ancdata"), or met it elsewhere in the hand-over (EMFILE, EOFError).
        last = r.stderr.rstrip().splitlines()[-1]
        assert any(m in last for m in ("ancdata", "Too many open files", "EOFError")), \
            r.stderr[-2000:]


def test_a_forked_workers_count_includes_the_files_it_inherits(monkeypatch):
    """A worker started by fork holds every file the training process held then (500 files
    opened before the loader: its worker started with 515). One worker 2 deep, 48 tensors
    a batch, 100 files here: the worker's 276 pass a limit of 270 where the training
    process's 256 do not. (The limit is read as 270 rather than set: lowering this test
    process's own would fail whatever else it opens meanwhile.)"""
    from autotune import openfiles
    from autotune.online.config import Config

    monkeypatch.setattr(openfiles, "limit", lambda: 270)
    why = openfiles.over(Config(1, 2, False, False), 48, own=100)
    if openfiles.forks():
        assert why is not None and "a worker would hold about 276 open files" in why, why
        assert "100 inherited from this process" in why
    else:
        assert why is None
