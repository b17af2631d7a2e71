"""The Python scripts under scripts/ are one package, run from the root as
`python -m scripts.NAME`: none puts a folder on sys.path or imports a sibling by its bare
name, nothing says to run one as `python scripts/NAME.py`, and what they share
(scripts/_common.py) imports neither autotune nor torch (a child that must import no
autotune, the plain boto3 loop of scripts.s3_probe_check, imports its script and so it).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))
SIBLINGS = {p.stem for p in SCRIPTS} - {"__init__"}


def _bare_sibling_imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        out += [f"{path.name}:{node.lineno}: import {n}" for n in names
                if n.split(".")[0] in SIBLINGS]
    return out


def test_the_scripts_are_a_package_that_never_touches_sys_path():
    assert (ROOT / "scripts" / "__init__.py").is_file()
    assert len(SCRIPTS) > 20
    # Child programs held in strings count too: text, not the syntax tree.
    touched = [p.name for p in SCRIPTS if "sys.path" in p.read_text()]
    assert touched == [], f"scripts that put a folder on sys.path: {touched}"
    bare = [hit for p in SCRIPTS for hit in _bare_sibling_imports(p)]
    assert bare == [], "import a sibling as scripts.NAME (`python -m` from the root):\n" + \
        "\n".join(bare)


def test_nothing_says_to_run_a_script_as_a_file():
    said = re.compile(r"\bpython3?\s+(?:\S*/)?scripts/(\w+)\.py\b")
    places = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
              *sorted(p for p in (ROOT / "scripts").iterdir() if p.is_file())]
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in places
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
            if said.search(line)]
    assert hits == [], "say `python -m scripts.NAME`:\n" + "\n".join(hits)


def test_a_script_starts_as_a_module_and_the_shared_module_imports_no_autotune():
    env = {**os.environ, "PYTHONPATH": ""}   # the root comes from `-m` run there
    r = subprocess.run([sys.executable, "-m", "scripts.bench_convert", "--help"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("usage: bench_convert.py"), r.stderr
    r = subprocess.run([sys.executable, "-c", "import json, sys, scripts._common, "
                        "scripts.s3_probe_check; print(json.dumps(list(sys.modules)))"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    loaded = {m.split(".")[0] for m in json.loads(r.stdout)}
    assert not loaded & {"autotune", "autotune_base", "autotune_converters", "torch"}, loaded


def test_bench_scale_measures_each_step_as_a_process_tree(tmp_path):
    # The scale benchmark at a toy size: the tree made, two steps run, their figures and
    # the table out; each output deleted once measured, the tree kept on request.
    out = tmp_path / "scale.json"
    r = subprocess.run([sys.executable, "-m", "scripts.bench_scale", "--sizes", "300",
                        "--rounds", "1", "--only", "convert wds,stage", "--keep-data", "--warm",
                        "--work", str(tmp_path / "w"), "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(out.read_text())
    assert [x["step"] for x in d["rounds"]] == ["convert wds", "stage wds"]
    for x in d["rounds"]:
        assert x["files"] == 300 and x["wall_s"] > 0 and x["peak_mib"] > 10, x
    assert "| convert wds | 300 |" in r.stdout and "| stage wds | 300 |" in r.stdout
    assert sorted(os.listdir(tmp_path / "w")) == ["tree-300"]
    assert len([f for _, _, fs in os.walk(tmp_path / "w" / "tree-300") for f in fs]) == 300


def test_bench_spdl_rotates_its_rows_and_tables_every_round_with_its_load():
    # The SPDL side-by-side's order and table on fake rounds (its passes need root, SPDL
    # and minutes: a benchmark, not a test).
    from scripts import bench_spdl as b

    rows = list(b.ROWS)
    assert [b.rotated(rows, k)[0] for k in range(6)] == [*rows, rows[0]]
    assert all(sorted(b.rotated(rows, k)) == sorted(rows) for k in range(5))
    rate = {"rule of thumb": 400, "recommendation": 600, "SPDL 2 threads": 200,
            "SPDL 4 threads": 300, "SPDL 8 threads": 250}
    reads = [{"row": row, "cond": cond, "round": k, "load": f"1.{k}0 1.00 1.00",
              "images_per_s": rate[row] + k, "images_per_cpu_s": rate[row] / 2}
             for k in range(3) for cond in b.CONDS for row in rows]
    md = b.markdown({"images": 10_000, "mean_kb": 82.5, "cpus": 2, "batch": 64, "seconds": 10,
                     "warmup": 1.5, "rule_label": "w2 pf2", "reads": reads,
                     "search": {"label": "w2 pf4", "wall_s": 90, "load": "1.0 1.0 1.0"},
                     "load_before": "1.0 1.0 1.0", "load_after": "1.1 1.0 1.0"})
    assert "| recommendation | 601 | 601 | 600 @ 1.00 1.00 1.00 / 601 @ 1.10 1.00 1.00 / " \
           "602 @ 1.20 1.00 1.00 |" in md
    assert "warm: recommendation / SPDL's best (SPDL 4 threads) = 2.00x" in md
