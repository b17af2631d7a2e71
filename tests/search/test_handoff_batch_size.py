"""autotune.loader_kwargs hands back the loader's own settings and leaves the user's to
them: no shuffle, the batch size theirs (the preset's never slips in, nor torch's 1), a
warning for another batch size, another machine or another dataset; and search.json's
`train` lines run as they stand."""

from __future__ import annotations

import json
import socket
import warnings
from pathlib import Path

import pytest

import autotune
from autotune.errors import UsageError

CONFIG = {"num_workers": 2, "prefetch_factor": 4, "persistent_workers": True,
          "pin_memory": False}


def _write(tmp_path: Path, *, source: str | None = "preset", given: int | None = None,
           **extra) -> Path:
    from autotune.search.recommend import kwargs_of

    d = {"schema": "autotune.search/2", "dataset": str(tmp_path / "data"), "batch_size": 256,
         "options": {"preset": "resnet50", "batch_size": given},
         "recommended": {"config": CONFIG}, "ceilings": {"cores": None},
         "host": {"hostname": socket.gethostname()},
         # what an older autotune wrote: shuffle=True inside
         "loader_kwargs": {"shuffle": True, **kwargs_of(CONFIG, 256)}, **extra}
    if source is not None:
        d["batch_size_from"] = source
    p = tmp_path / "search.json"
    p.write_text(json.dumps(d))
    return p


def test_never_shuffle_and_the_batch_size_the_user_gave(tmp_path):
    p = _write(tmp_path, source="option", given=256)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kw = autotune.loader_kwargs(p)
        assert kw == {"batch_size": 256, **CONFIG}
        assert autotune.loader_kwargs(p, batch_size=256) == kw   # the same: no warning


def test_a_preset_batch_size_the_user_never_chose_is_refused_in_one_line(tmp_path):
    for source in ("preset", None):   # None: an older search.json, its options say so
        p = _write(tmp_path, source=source)
        with pytest.raises(UsageError) as e:
            autotune.loader_kwargs(p)
        msg = str(e.value)
        assert "\n" not in msg and "batch_size=256" in msg and "resnet50 preset" in msg, msg
        assert "batch_size=N" in msg and str(p) in msg, msg
        with pytest.warns(RuntimeWarning, match="measured batch_size=256, you pass batch_size=32"):
            kw = autotune.loader_kwargs(p, batch_size=32)   # theirs: used, with a warning
        assert kw["batch_size"] == 32 and "shuffle" not in kw


def test_another_batch_size_than_the_measured_one_warns_naming_both(tmp_path):
    p = _write(tmp_path, source="searched")
    assert autotune.loader_kwargs(p)["batch_size"] == 256
    with pytest.warns(RuntimeWarning, match="measured batch_size=256, you pass batch_size=64"):
        kw = autotune.loader_kwargs(p, batch_size=64)
    assert kw == {"batch_size": 64, **CONFIG}
    with pytest.raises(UsageError, match="batch_size must be a whole number"):
        autotune.loader_kwargs(p, batch_size=0)


def test_another_machine_or_another_dataset_warns_naming_both(tmp_path):
    p = _write(tmp_path, source="option", given=256, host={"hostname": "gpu-node-17"})
    with pytest.warns(RuntimeWarning, match=f"ran on gpu-node-17, this is {socket.gethostname()}"):
        autotune.loader_kwargs(p)
    p = _write(tmp_path, source="option", given=256)
    (tmp_path / "other").mkdir()
    with pytest.warns(RuntimeWarning, match=f"measured {tmp_path / 'data'}, you train on "
                                            f"{tmp_path / 'other'}"):
        autotune.loader_kwargs(p, dataset=tmp_path / "other")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        autotune.loader_kwargs(p, dataset=tmp_path / "data")


def test_the_after_side_of_a_loop_is_read(tmp_path):
    # A convert/stage loop: the staged copy's recommendation, its own batch size record.
    from autotune.search.recommend import kwargs_of

    one = {**CONFIG, "num_workers": 1}
    staged = {"dataset": str(tmp_path / "staged"), "recommended": {"config": one},
              "loader_kwargs": kwargs_of(one, 256), "ceilings": {}}
    p = _write(tmp_path, source="option", given=256, after=staged)
    assert autotune.loader_kwargs(p)["num_workers"] == 1


@pytest.mark.parametrize("kind", ["folder", "wds"])
def test_the_train_lines_of_search_json_run(small_dataset, tmp_path, kind):
    from autotune.search.recommend import train_code

    data = small_dataset
    if kind == "wds":
        from autotune_converters import ConvertOptions, convert

        data = tmp_path / "wds"
        convert(small_dataset, data, ConvertOptions(format="wds", workers=1, readers=2))
    code = train_code(str(data), {**CONFIG, "num_workers": 2}, 16, iterable=kind == "wds",
                      batch_size_from="preset")
    assert "shuffle" in code if kind == "folder" else "set_epoch" in code
    assert "put yours" in code   # the preset's batch size is marked
    seen = []
    code = code.replace("...  # your step", "seen.append(len(labels))")
    ns = {"transform": _to_tensor, "epochs": 1, "seen": seen}
    exec(compile(code, "<train>", "exec"), ns)
    assert sum(seen) == 64


def _to_tensor(im):
    import torch

    return torch.tensor(im.size)


def test_the_train_lines_of_a_search_of_the_users_own_dataset_build_it(small_dataset):
    """A search with --dataset-factory measured the user's Dataset, not open_dataset's: the
    lines call their factory, and they run with it."""
    import torch

    from autotune.search.recommend import train_code

    code = train_code(str(small_dataset), {**CONFIG, "num_workers": 0}, 8, iterable=False,
                      batch_size_from="option", factory="/home/me/my_data.py:make")
    assert "open_dataset" not in code and f"dataset = make({str(small_dataset)!r})" in code

    def make(root):
        return torch.utils.data.TensorDataset(torch.arange(20), torch.arange(20) % 2)

    seen = []
    code = code.replace("...  # your step", "seen.append(len(labels))")
    exec(compile(code, "<train>", "exec"), {"make": make, "epochs": 1, "seen": seen})
    assert sum(seen) == 20



def _rank_runs(rank: int, code: str, store: str, out: str) -> None:
    import json

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    seen: list[list[int]] = []

    def make(root):
        return torch.utils.data.TensorDataset(torch.arange(20), torch.arange(20) % 2)

    code = code.replace("...  # your step", "epoch_seen.extend(images.tolist())")
    code = code.replace("for images, labels in loader:",
                        "epoch_seen = []\n    seen.append(epoch_seen)\n"
                        "    for images, labels in loader:")
    exec(compile(code, "<train>", "exec"), {"make": make, "epochs": 2, "seen": seen})
    dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(seen, f)


def test_the_train_lines_of_a_ranks_search_give_each_rank_its_share(small_dataset, tmp_path):
    """A --procs-per-node search's lines: each DDP rank reads its share, through a
    DistributedSampler and its set_epoch. With `shuffle=True`, as written before, each
    of the 2 gloo ranks below trained on all 20 samples, every epoch."""
    import json
    import multiprocessing as mp

    from autotune.search.recommend import dataloader_snippet, train_code

    code = train_code(str(small_dataset), {**CONFIG, "num_workers": 0}, 4, iterable=False,
                      batch_size_from="option", factory="my_data.py:make", ranks=2)
    assert "shuffle=True" not in code and "sampler.set_epoch(epoch)" in code
    snippet = dataloader_snippet({**CONFIG, "num_workers": 0}, 4, ranks=2)
    assert "DistributedSampler(dataset)" in snippet and "sampler=sampler" in snippet
    assert "shuffle" not in dataloader_snippet(CONFIG, 4, iterable=True, ranks=2)
    ctx = mp.get_context("fork")
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    procs = [ctx.Process(target=_rank_runs, args=(r, code, str(tmp_path / "store"), str(o)))
             for r, o in enumerate(outs)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0, p.exitcode
    seen = [json.loads(o.read_text()) for o in outs]
    for epoch in range(2):
        a, b = seen[0][epoch], seen[1][epoch]
        assert len(a) == len(b) == 10 and sorted(a + b) == list(range(20)), (epoch, a, b)
    assert seen[0][0] != seen[0][1]   # set_epoch: another order the second epoch


MiB = 2**20


def _shm_json(tmp_path: Path, config: dict, *, searched_at: int, recommended_bs: int) -> Path:
    # A search.json as a search in Docker's 64 MiB /dev/shm writes it: 48 MiB for this
    # rank, the first batch's bytes at the search's own batch size (`shm.batch_size`).
    p = tmp_path / "search.json"
    kw = {"batch_size": recommended_bs, **config}
    p.write_text(json.dumps({
        "batch_size": searched_at, "batch_size_from": "searched",
        "recommended": {"config": {**config, "batch_size": recommended_bs}},
        "loader_kwargs": kw, "host": {"hostname": socket.gethostname()},
        "shm": {"batch_bytes": 4 * MiB, "batch_size": searched_at, "budget_bytes": 48 * MiB}}))
    return p


@pytest.mark.parametrize("bs, want", [
    (8, {"num_workers": 2, "prefetch_factor": 2}),     # as measured: handed back as it is
    (16, {"num_workers": 2, "prefetch_factor": 1}),    # 8 MiB: 5 live do not fit, 3 do
    (24, {"num_workers": 1, "prefetch_factor": 1}),    # 12 MiB: 2 live fit
    (64, {"num_workers": 0}),                          # 32 MiB: not even 2
])
def test_a_larger_batch_is_fitted_to_the_searched_dev_shm(tmp_path, bs, want):
    cfg = {"num_workers": 2, "prefetch_factor": 2, "persistent_workers": True,
           "pin_memory": False}
    p = _shm_json(tmp_path, cfg, searched_at=8, recommended_bs=8)
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        kw = autotune.loader_kwargs(p, bs)
    got = {k: kw[k] for k in ("num_workers", "prefetch_factor") if k in kw}
    assert got == want, kw
    assert list(kw)[:2] == ["batch_size", "num_workers"] and kw["pin_memory"] is False
    # persistent_workers stays with workers, and goes with them (torch refuses it alone).
    assert ("persistent_workers" in kw) == bool(want["num_workers"])
    said = [str(w.message) for w in ws if "/dev/shm" in str(w.message)]
    assert bool(said) == (bs != 8), said
    if said:
        assert f"at batch_size={bs}" in said[0] and f"--batch-size {bs}" in said[0]


def test_the_bytes_are_scaled_from_the_batch_size_they_were_measured_at(tmp_path):
    # A search of batch sizes: the bytes measured at 8, 16 recommended; at 24 the batch is
    # 12 MiB (3x the measured 4 MiB), not 6 MiB (1.5x, scaled from the recommended 16).
    cfg = {"num_workers": 2, "prefetch_factor": 2}
    p = _shm_json(tmp_path, cfg, searched_at=8, recommended_bs=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kw = autotune.loader_kwargs(p, 24)
    assert (kw["num_workers"], kw["prefetch_factor"]) == (1, 1), kw


def test_a_smaller_dev_shm_here_than_the_searchs_fits_the_same_batch_size(tmp_path):
    # Searched where 48 MiB were free; this machine (a container) allows 16: at the
    # searched batch size, 2 x 2 batches of 4 MiB (29 MiB with margin) no longer fit,
    # 1 x 1 (14 MiB) does. The real container run is in test_search_shm.py.
    from autotune.handoff import _fitted_to_shm
    from autotune.shmfit import ShmBudget

    kw = {"batch_size": 8, "num_workers": 2, "prefetch_factor": 2, "persistent_workers": True}
    shm = {"batch_bytes": 4 * MiB, "batch_size": 8, "budget_bytes": 48 * MiB}
    here = ShmBudget(16 * MiB, 16 * MiB, 16 * MiB, source="free /dev/shm")
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        got = _fitted_to_shm(dict(kw), shm, 8, here, tmp_path / "search.json", True)
    assert (got["num_workers"], got["prefetch_factor"]) == (1, 1), got
    said = " ".join(str(w.message) for w in ws)
    assert "16 MiB this machine's /dev/shm allows (free /dev/shm; the search's allowed 48 MiB)" \
        in said and "--batch-size" not in said, said
    # A larger /dev/shm here changes nothing: the search's budget is what it measured at.
    big = ShmBudget(1024 * MiB, 1024 * MiB, 1024 * MiB, source="free /dev/shm")
    assert _fitted_to_shm(dict(kw), shm, 8, big, tmp_path / "search.json", True) == kw
    # Unread here: the search's figure stands.
    assert _fitted_to_shm(dict(kw), shm, 8, None, tmp_path / "search.json", True) == kw


_KWARGS_IN_A_CGROUP = """
import json, sys, warnings
import autotune
with warnings.catch_warnings(record=True) as ws:
    warnings.simplefilter("always")
    autotune.loader_kwargs(sys.argv[1], 8)
print(json.dumps([str(w.message) for w in ws if "memory" in str(w.message)]))
"""


@pytest.mark.root
def test_a_memory_limit_here_tighter_than_the_searchs_is_warned_about(tmp_path, memory_cgroup):
    # Searched on the host (its trials bounded by 12 GiB, half of its memory); the
    # recommended loader peaked at 600 MiB. In a container of 1 GiB that is over half of
    # the job's memory: a warning names both figures. On the host, nothing is said.
    import subprocess
    import sys

    p = tmp_path / "search.json"
    p.write_text(json.dumps({
        "batch_size": 8, "batch_size_from": "option", "options": {"batch_size": 8},
        "recommended": {"config": {"num_workers": 2}, "peak_pss_mib": 600.0},
        "loader_kwargs": {"batch_size": 8, "num_workers": 2},
        "max_memory": {"mib": 12288.0, "source": "half of the host's 24.0 GiB"},
        "host": {"hostname": socket.gethostname()}}))
    code = ["-c", _KWARGS_IN_A_CGROUP, str(p)]
    host = subprocess.run([sys.executable, *code], capture_output=True, text=True, timeout=120)
    assert host.returncode == 0 and json.loads(host.stdout) == [], host.stderr[-2000:]
    with memory_cgroup(2**30) as cg:
        r = subprocess.run(["sh", "-c", f'echo $$ > "{cg}/cgroup.procs" && exec "$@"', "sh",
                            sys.executable, *code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    said = json.loads(r.stdout)
    assert len(said) == 1 and "600 MiB" in said[0] and "over 512 MiB" in said[0], said
    assert "memory.limit_in_bytes" in said[0] and "Search again here" in said[0], said
