"""The documentation site: it builds in strict mode, and its examples run.

Every bash or python example in docs/ carries a marker (see docs/hooks/autotune_docs.py):
`<!-- run -->` examples are run here, page by page in document order, in a fresh directory
where `/data/train` is a small generated image folder and `/local/nvme/` a directory on
the same disk; `<!-- not-run: REASON -->` ones are shown with their reason (a GPU, a
cluster, a server this machine has not). The first example of each command's page, the
getting-started page and the library pages must be runnable.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
COMMANDS = ("probe", "bench", "search", "convert", "stage", "monitor", "analyze")
ALL_RUN = ("library/index.md", "library/dataloader.md")


def _hook():
    spec = importlib.util.spec_from_file_location("autotune_docs", DOCS / "hooks" / "autotune_docs.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # its dataclass looks its module up there
    spec.loader.exec_module(mod)
    return mod


HOOK = _hook()
PAGES = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))


def _examples(page: str):
    return HOOK.examples((DOCS / page).read_text())


def counts() -> tuple[int, int]:
    """(examples run by the tests, examples marked not runnable here) over the site."""
    ex = [e for p in PAGES for e in _examples(p) if not e.file]
    return sum(e.runs for e in ex), sum(not e.runs for e in ex)


def test_every_example_is_marked_and_every_unrun_one_says_why():
    assert PAGES, "no pages under docs/"
    for page in PAGES:
        text = (DOCS / page).read_text()
        assert HOOK.unmarked(text) == 0, (
            f"docs/{page}: a bash/python example without <!-- run --> or "
            "<!-- not-run: REASON --> before it")
        for e in _examples(page):
            assert e.runs or len(e.reason) > 5, f"docs/{page}: not-run without a reason"
    run, not_run = counts()
    print(f"examples: {run} run in the tests, {not_run} marked not runnable here")
    assert run >= 20 and not_run >= 1


def test_the_first_example_of_each_command_and_the_getting_started_and_api_ones_run():
    for c in COMMANDS:
        ex = _examples(f"commands/{c}.md")
        assert ex and ex[0].runs, f"docs/commands/{c}.md: its first example is not run"
        assert f"<!-- autotune-help: {c} -->" in (DOCS / f"commands/{c}.md").read_text()
    # Getting started: every step by hand runs; only the two commands (the demo, minutes
    # as root, and the suite itself) are shown, not run, here.
    ex = _examples("getting-started.md")
    assert [e.code.split()[0] for e in ex if not e.runs] == ["scripts/demo"]
    assert sum(e.runs for e in ex) >= 3
    for page in ALL_RUN:
        ex = _examples(page)
        assert ex and all(e.runs for e in ex), f"docs/{page}: an example that is not run"


def test_the_cli_reference_is_the_parsers_own_help():
    from autotune.cli import build_parser

    for c in COMMANDS:
        text = HOOK.cli_help(c)
        assert text.startswith(f"usage: autotune {c}"), text[:80]
    # Every option the parser knows is in the generated text (nothing copied by hand).
    text = HOOK.cli_help("search")
    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices
               and "search" in a.choices)
    for action in sub.choices["search"]._actions:
        for flag in action.option_strings:
            assert flag in text, flag


def test_no_issue_numbers_or_internal_history_in_the_readme_or_the_docs():
    for f in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        text = f.read_text()
        assert not re.search(r"\bissues? \d+|(?<!&)#\d{1,3}\b", text, re.IGNORECASE), f


@pytest.mark.slow
def test_the_site_builds_in_strict_mode(tmp_path):
    # No skip: scripts/setup always installs the docs extra, so a missing mkdocs is a
    # broken set-up, which CI must see.
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.fail("mkdocs or mkdocstrings is not installed: run scripts/setup (the docs extra: "
                    "pip install -e '.[docs]')")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                        str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "WARNING" not in out, out[-3000:]
    site = tmp_path / "site"
    for page in PAGES:
        html = site / page.replace(".md", "/index.html").replace("index/index.html", "index.html")
        assert html.exists(), html
    # The generated CLI reference is there, and the markers are rendered.
    cli = (site / "reference/cli/index.html").read_text()
    assert "usage: autotune probe" in cli and "--min-iops" in cli
    assert "Not run by the tests here" in (site / "integrations/slurm/index.html").read_text()
    api = (site / "reference/api/index.html").read_text()
    for name in ("loader_kwargs", "tune", "instrument", "DataLoader"):
        assert name in api


@pytest.fixture(scope="session")
def docs_dataset(tmp_path_factory) -> Path:
    """256 ImageNet-like JPEGs in 4 classes: enough for cold windows of batches of 8."""
    from autotune.synth import make_image_folder

    root = tmp_path_factory.mktemp("docs-ds") / "train"
    make_image_folder(root, 256, 4, seed=1, workers=1)
    return root


def _venv() -> Path:
    v = ROOT / ".venv"
    return v if (v / "bin" / "activate").exists() else Path(sys.prefix)


def _localise(code: str, work: Path) -> str:
    """The page's paths, pointed at this test's directory and this checkout."""
    code = re.sub(r"(?<![\w./])/data/", f"{work}/data/", code)
    code = re.sub(r"(?<![\w./])/local/nvme/", f"{work}/local/nvme/", code)
    code = re.sub(r"(?<![\w./])(examples|scripts)/", lambda m: f"{ROOT}/{m.group(1)}/", code)
    return re.sub(r"(?<![\w./])\.venv/", f"{_venv()}/", code)


RUNNABLE = [p for p in PAGES if any(e.runs and not e.file for e in _examples(p))]
# Pages whose examples repeat, at a page's cost, what a test in CI runs apart (marked
# extended: scripts/test runs them, CI leaves them out): the search with ranks
# (tests/search/test_user_job.py), a journal-storage study (tests/search/test_shared_study.py),
# train_cnn with the searched settings and bench --step (tests/examples/test_train_cnn.py),
# the Lightning and Accelerate loops (tests/integrations/); commands/analyze.md's example is
# commands/monitor.md's (the same monitored train_cnn run, then analyze) with `--json`, which
# tests/analyze/test_analysis.py's CLI test checks; commands/search.md's search of the
# folder is library/index.md's run_search (the same options) through the CLI, whose
# `autotune search` with the storage replay getting-started.md runs.
EXTENDED_PAGES = {"integrations/ddp.md", "integrations/postgresql.md",
                  "integrations/real-step.md", "integrations/lightning.md",
                  "integrations/accelerate.md", "commands/analyze.md", "commands/search.md"}


# Pages are independent (each its own directory, dataset copy and cache) and their examples
# are judged by their exit status alone, never by a figure: they run one more at a time than
# there are cores (at most 3), started together when the first page test asks. Their
# searches wait on timed windows part of the time: on 2 cores, 2 lanes took 209 s for the
# 20 pages, 3 lanes 191 s.
JOBS = max(1, min(3, (os.cpu_count() or 1) + 1))


def _run_page(page: str, dataset: Path, work: Path) -> str | None:
    """Run the page's examples in order in `work`; None, or why the first failure failed."""
    shutil.copytree(dataset, work / "data" / "train")
    (work / "local" / "nvme").mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(work / "cache"),
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
           "COLUMNS": "120"}
    for i, e in enumerate(_examples(page)):
        if not e.runs:
            continue
        code = _localise(e.code, work)
        if e.file:
            (work / e.file).write_text(code)
            continue
        if e.lang == "python":
            script = work / f"example_{i}.py"
            script.write_text(code)
            cmd = [sys.executable, str(script)]
        else:
            cmd = ["bash", "-e", "-o", "pipefail", "-c", code]
        try:
            r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True,
                               timeout=600)
        except subprocess.TimeoutExpired:
            return f"docs/{page}, example {i + 1} ({e.lang}) ran past 600 s:\n{e.code}"
        if r.returncode != 0:
            return (f"docs/{page}, example {i + 1} ({e.lang}) exited {r.returncode}:\n{e.code}\n"
                    f"--- stdout ---\n{r.stdout[-2000:]}\n--- stderr ---\n{r.stderr[-3000:]}")
    return None


@pytest.fixture(scope="module")
def page_runs(request, docs_dataset, tmp_path_factory):
    """{page: Future of _run_page} for the pages this session's tests ask for; its lanes
    (threads) end with this module, not with the session (a later test file in the same
    process may count its threads)."""
    from concurrent.futures import ThreadPoolExecutor

    wanted = [it.callspec.params["page"] for it in request.session.items
              if getattr(it, "originalname", "") == "test_the_examples_of_a_page_run"]
    # The pages that search first (the longest), so that the two lanes end together.
    order = sorted(wanted, key=lambda p: -sum(e.code.count("search") for e in _examples(p)
                                               if e.runs))
    base = tmp_path_factory.mktemp("docs-pages")
    ex = ThreadPoolExecutor(JOBS, thread_name_prefix="docs-page")
    try:
        yield {p: ex.submit(_run_page, p, docs_dataset, base / f"{i:02d}" / "work")
               for i, p in enumerate(order)}
    finally:  # pages not started when the session stops early are not started at all
        ex.shutdown(wait=True, cancel_futures=True)


@pytest.mark.slow
@pytest.mark.parametrize("page", [pytest.param(p, marks=pytest.mark.extended)
                                  if p in EXTENDED_PAGES else p for p in RUNNABLE])
def test_the_examples_of_a_page_run(page, page_runs):
    failure = page_runs[page].result()
    assert failure is None, failure
