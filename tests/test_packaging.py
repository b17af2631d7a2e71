"""autotune installed from its wheel, outside the checkout: every module imports, the
presets and spaces are there as package data, `bench --preset resnet50` and a one-trial
`search` run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("wheel")
    # --no-build-isolation: the build uses this venv's setuptools (no download).
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp / "dist"), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    [wheel] = (tmp / "dist").glob("autotune-*.whl")
    site = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(site), str(wheel)], check=True, capture_output=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    return site, env


def _run(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 300):
    return subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_every_module_and_the_package_data_come_from_the_wheel(installed, tmp_path):
    site, env = installed
    # A module of an optional extra imports where its framework is installed (setup
    # installs the lightning extra); elsewhere it raises the one line naming the extra.
    code = ("import importlib, importlib.util, pkgutil, autotune, converters\n"
            "extra = {'autotune.integrations.lightning': ('lightning', 'pytorch_lightning')}\n"
            "mods = [m.name for p in (autotune, converters) for m in\n"
            "        pkgutil.walk_packages(p.__path__, p.__name__ + '.')]\n"
            "for m in mods:\n"
            "    if m in extra and not any(importlib.util.find_spec(x) for x in extra[m]):\n"
            "        continue\n"
            "    if m != 'autotune.emulate._fusefs' and not m.endswith('__main__'):\n"
            "        importlib.import_module(m)\n"
            "from autotune.data.presets import list_presets, load_preset\n"
            "from autotune.search.space import SPACES_DIR\n"
            "print(autotune.__file__, len(mods), list_presets(), SPACES_DIR,\n"
            "      load_preset('resnet50').batch_size)\n")
    r = _run(["-c", code], env, tmp_path)
    assert r.returncode == 0, r.stderr
    where, n, *rest = r.stdout.split(" ", 2)
    assert where.startswith(str(site)) and int(n) > 50
    assert "resnet50" in rest[0] and "autotune_configs/search" in rest[0], rest


@pytest.mark.slow
def test_bench_and_a_one_trial_search_run_from_the_wheel(installed, small_dataset, tmp_path):
    _site, env = installed
    r = _run(["-m", "autotune", "-q", "bench", str(small_dataset), "--preset", "resnet50",
              "--workers", "1", "--batch-size", "4", "--seconds", "1", "--warmup-batches", "1",
              "--warm", "--compute-ms", "0", "--json", "-"], env, tmp_path)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["config"]["preset"] == "resnet50" and d["images_per_s"] > 0
    r = _run(["-m", "autotune", "-q", "search", str(small_dataset), "--trials", "1",
              "--no-probe", "--confirm", "0", "--seconds", "1", "--warm", "--batch-size", "4",
              "--compute-ms", "0", "--space", "small", "--out", str(tmp_path / "out"),
              "--json", "-"], env, tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["recommended"] and d["space"]["source"].endswith("autotune_configs/search/small.yaml")
