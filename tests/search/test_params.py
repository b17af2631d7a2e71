"""The parameter registry: each DataLoader setting is declared once, and a new one is one
`register(Param(...))` that reaches the space, the trial's DataLoader call, the knee, the
snippet, the YAML block and the tables."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autotune import params
from autotune.bench import BenchConfig, run_bench
from autotune.params import PARAMS, Param
from autotune.online import loader as loader_mod
from autotune.search.recommend import dataloader_snippet, knee, yaml_block
from autotune.search.records import TrialRecord
from autotune.search.space import load_space


@pytest.fixture
def in_order():
    """DataLoader's `in_order` (torch >= 2.6: batches may come out of order when a worker
    is slow), registered the way a newcomer would add a setting."""
    p = params.register(Param("in_order", bool, [True, False], workers_only=True, off=True,
                              column="in order", cost=4,
                              help="return batches in order (only with --workers > 0)"))
    yield p
    params.unregister("in_order")


def test_builtin_settings_are_declared_once() -> None:
    assert list(PARAMS) == ["num_workers", "prefetch_factor", "persistent_workers",
                            "pin_memory", "batch_size"]
    assert PARAMS["num_workers"].flag == "--workers" and PARAMS["prefetch_factor"].flag == \
        "--prefetch-factor"
    with pytest.raises(ValueError, match="already registered"):
        params.register(Param("num_workers", int, [1], help=""))
    with pytest.raises(ValueError, match="built in"):
        params.unregister("pin_memory")


def test_a_new_setting_reaches_space_snippet_yaml_knee_and_tables(tmp_path: Path,
                                                                  in_order: Param) -> None:
    sp = tmp_path / "space.yaml"
    sp.write_text("num_workers: {choices: [0, 2]}\nprefetch_factor: {choices: [2]}\n"
                  "persistent_workers: {choices: [false]}\nin_order: {choices: [true, false]}\n")
    space = load_space(sp, cores=2, cuda=False)
    grid = space.grid()
    # workers 0: in_order does not apply (off); workers 2: both values.
    assert sorted((g["num_workers"], g["in_order"]) for g in grid) == [(0, True), (2, False),
                                                                       (2, True)]
    cfg = {"num_workers": 2, "prefetch_factor": 2, "persistent_workers": False,
           "pin_memory": False, "in_order": False}
    code = dataloader_snippet(cfg, 64)
    assert "in_order=False" in code
    compile(code, "<snippet>", "exec")
    assert yaml.safe_load(yaml_block(cfg, 64))["dataloader"]["in_order"] is False
    assert [c.column for c in params.shown([cfg])][-1] == "in order"
    assert params.cells(cfg, params.shown([cfg]))[-1] == "n"
    # The knee prefers the cheaper value at equal speed (False sorts before True).
    a = TrialRecord(1, {**cfg, "in_order": True}, "complete", images_per_s=100.0)
    b = TrialRecord(2, cfg, "complete", images_per_s=99.0)
    assert knee([a, b]).number == 2


@pytest.mark.skipif(not loader_mod._TORCH_IN_ORDER,
                    reason="this torch's DataLoader has no in_order= (2.6 added it)")
def test_a_new_setting_is_applied_to_the_measured_dataloader(small_dataset: Path,
                                                             in_order: Param) -> None:
    # A real measurement passes it to DataLoader: a name DataLoader does not know would
    # fail the run with its TypeError, so this fails if the setting is dropped or mangled.
    cfg = BenchConfig.from_preset("decode-only", num_workers=1, batch_size=8, seconds=1.0,
                                  cold=False, warmup_batches=1, in_order=False)
    assert cfg.loader_settings()["in_order"] is False
    res = run_bench(small_dataset, cfg)
    assert not res.failed, res.reason
    assert res.config["loader_extra"] == {"in_order": False}
    params.register(Param("in_ordr", bool, [True], workers_only=True, off=True, help=""))
    try:
        bogus = BenchConfig.from_preset("decode-only", num_workers=1, batch_size=8,
                                        seconds=1.0, cold=False, warmup_batches=1,
                                        in_ordr=False)
        res = run_bench(small_dataset, bogus)
    finally:
        params.unregister("in_ordr")
    assert res.failed and "in_ordr" in (res.reason or "")


def test_one_loader_settings_for_bench_search_and_the_online_loader() -> None:
    from dataclasses import fields

    from autotune.errors import UsageError
    from autotune.online.config import TUNED, Config
    from autotune.params import LoaderSettings
    from autotune.search.recommend import baseline_params, kwargs_of

    # Its fields are the registered built-in settings the search tunes, in their order, and
    # a workers-only one defaults to its `off`.
    names = LoaderSettings.names()
    assert list(names) == [n for n, p in PARAMS.items() if p.searched_by_default]
    for f in fields(LoaderSettings):
        assert not PARAMS[f.name].workers_only or f.default == PARAMS[f.name].off
    assert TUNED == names and issubclass(Config, LoaderSettings)
    # The workers-only rule, once: refused when given, dropped when applied.
    for kw, msg in [({"prefetch_factor": 2}, "prefetch_factor=2 needs num_workers > 0: "),
                    ({"persistent_workers": True}, "persistent_workers needs num_workers > 0 "),
                    ({"num_workers": 2}, "prefetch_factor must be at least 1 when num_workers "
                                         "> 0, but got None."),
                    ({"num_workers": -1}, "num_workers must be at least 0, but got -1.")]:
        with pytest.raises(UsageError) as e:
            LoaderSettings(**kw).validate()
        assert str(e.value).startswith(msg)
        with pytest.raises(UsageError) as b:
            BenchConfig(**{**LoaderSettings().params(), **kw}).validate()
        assert str(b.value) == str(e.value) and b.value.settings == e.value.settings
    zero = LoaderSettings(0, 4, True, True)
    assert zero.applied() == LoaderSettings(0, None, False, True)
    assert Config(0, 4, True, True).kwargs() == zero.dataloader_kwargs() == \
        {"num_workers": 0, "pin_memory": True}
    # The same keywords and label wherever the settings come from.
    four = LoaderSettings(4, 2, True, False).validate()
    assert four.dataloader_kwargs() == Config(4, 2, True, False).kwargs() == \
        BenchConfig(num_workers=4, prefetch_factor=2, persistent_workers=True).loader \
        .dataloader_kwargs()
    assert four.label() == params.label(four.params()) == "w4 pf2 persistent"
    assert four.queue == 8 == BenchConfig.from_preset("resnet50", num_workers=4).prefetch_queue
    assert baseline_params(4, cuda=False) == four.params()
    assert kwargs_of(four.params(), 64) == {"batch_size": 64, **four.dataloader_kwargs()}
