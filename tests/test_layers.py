"""The house in layers: every import points down or sideways, never up, and no circles.

    cli       autotune.cli (and emulate's own command line)
    decide    verdict, search, online, analyze, report, handoff, integrations
    measure   probe, monitor, bench, data (open_dataset), emulate, synth, instrumentation,
              verdict._base and verdict.storage (the rule base; the probe's storage rules)
    convert   autotune_converters: scan, plan, pool, workdir, conversion, ranks, Ray, stage
    formats   autotune_converters: source/writer contracts, folder, wds, lmdb, manifest, registry
    storage   autotune_converters.storage (one interface: local, s3) and objstore (client, URLs)
    system    autotune: cgroups, cpus, environment, block devices, read caps, caches, shm fit, open files
    base      autotune_base (errors, units, filesystem-safe I/O), autotune.errors, params

Read from the source with `ast` (imports inside functions count: a lazy import is still an
arrow). The folders install under other names (setup.py): converters/ as
autotune_converters, base/ as autotune_base. docs/development.md draws the same picture.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"autotune": "autotune", "converters": "autotune_converters", "base": "autotune_base"}

# Bottom to top; a module belongs to the layer of its longest matching prefix.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("autotune_base", "autotune.errors", "autotune.thresholds", "autotune.params",
              "autotune.configfiles")),
    ("system", ("autotune.cgroups", "autotune.blockdev", "autotune.readcap", "autotune.cpus",
                "autotune.cache", "autotune.environment", "autotune.shmfit", "autotune.sendable",
                "autotune.openfiles")),
    ("storage", ("autotune_converters.objstore", "autotune_converters.objstore.url",
                 "autotune_converters.objstore.client", "autotune_converters.storage")),
    ("formats", ("autotune_converters.source", "autotune_converters.writer",
                 "autotune_converters.records", "autotune_converters.images",
                 "autotune_converters.jpeghead",
                 "autotune_converters.folder", "autotune_converters.wds",
                 "autotune_converters.lmdb", "autotune_converters.manifest",
                 "autotune_converters.sourceread", "autotune_converters.registry")),
    ("convert", ("autotune_converters", "autotune_converters.scan", "autotune_converters.plan",
                 "autotune_converters.pool", "autotune_converters.workdir",
                 "autotune_converters.conversion", "autotune_converters.ranks",
                 "autotune_converters.ray_engine", "autotune_converters.stage",
                 "autotune_converters.stagesrc", "autotune_converters.objstore.upload",
                 "autotune_converters.objstore.convsource")),
    # The verdict's rule base and the storage's rules (the probe's verdict) sit with the
    # probe that reads them, below the job's engine (autotune.verdict.rules).
    ("measure", ("autotune.data", "autotune.synth", "autotune.emulate", "autotune.monitor",
                 "autotune.runqueue", "autotune.probe", "autotune.bench",
                 "autotune.instrumentation", "autotune.verdict._base",
                 "autotune.verdict.storage")),
    ("decide", ("autotune.verdict", "autotune.analyze", "autotune.search", "autotune.online",
                "autotune.report", "autotune.handoff", "autotune.integrations")),
    ("cli", ("autotune", "autotune.cli", "autotune.__main__", "autotune.emulate.cli",
             "autotune.emulate.__main__")),
]

# Arrows that climb today, each with why it is still there. An entry here is a debt: the
# test fails when one is paid (so the list shrinks) and on any arrow not listed.
KNOWN_CLIMBS: set[tuple[str, str]] = set()


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for folder, name in FOLDERS.items():
        for p in sorted((ROOT / folder).rglob("*.py")):
            parts = list(p.relative_to(ROOT / folder).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts.pop()
            out[".".join([name, *parts])] = (p, is_pkg)
    return out


MODULES = _modules()


def _owner(name: str) -> str | None:
    """The project's module that `import name` runs (a name inside it: its module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(mod: str) -> set[str]:
    path, is_pkg = MODULES[mod]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(filter(None, (_owner(a.name) for a in node.names)))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                here = mod.split(".") if is_pkg else mod.split(".")[:-1]
                here = here[: len(here) - node.level + 1]
                base = ".".join(here + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for a in node.names:   # `from pkg import sub` is the submodule, not pkg
                full = f"{base}.{a.name}"
                out.update(filter(None, [full if full in MODULES else _owner(base)]))
    out.discard(mod)
    return out


GRAPH = {m: _imports(m) for m in MODULES}


def _layer(mod: str) -> int | None:
    best: tuple[int, int] | None = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (mod == p or mod.startswith(p + ".")) and (best is None or len(p) > best[1]):
                best = (i, len(p))
    return best[0] if best else None


def test_every_module_has_a_layer():
    lost = sorted(m for m in MODULES if _layer(m) is None)
    assert not lost, f"modules in no layer (add them to LAYERS here and in docs/development.md): {lost}"


def test_no_import_climbs_a_layer():
    climbs = {(m, d) for m, deps in GRAPH.items() for d in deps
              if _layer(d) is not None and _layer(m) is not None and _layer(d) > _layer(m)}
    new = sorted(climbs - KNOWN_CLIMBS)
    assert not new, "imports that climb a layer:\n" + "\n".join(
        f"  {m} ({LAYERS[_layer(m)][0]}) imports {d} ({LAYERS[_layer(d)][0]})" for m, d in new)
    paid = sorted(KNOWN_CLIMBS - climbs)
    assert not paid, f"no longer climbs: remove from KNOWN_CLIMBS: {paid}"


def test_the_lower_packages_never_import_autotune():
    # The layer rule DESIGN.md states: base imports neither side, converters nothing of
    # autotune (autotune_base is their common floor).
    bad = sorted((m, d) for m, deps in GRAPH.items() for d in deps
                 if (m.startswith("autotune_base") and not d.startswith("autotune_base"))
                 or (m.startswith("autotune_converters") and d.split(".")[0] == "autotune"))
    assert not bad, bad


def test_no_circles():
    # Tarjan's strongly connected components; a component of two or more is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not circles, circles


def test_the_walk_sees_the_arrows_it_judges():
    # The graph is not empty by accident (a renamed folder would make every test above pass).
    assert len(MODULES) > 150
    assert "autotune_base.errors" in GRAPH["autotune.errors"]
    assert "autotune_converters.registry" in GRAPH["autotune.data.open"]


# The sizes a newcomer can read in one sitting (docs/development.md): a function fits a
# screen, a class a responsibility, a module a subject.
MAX_FUNCTION, MAX_CLASS, MAX_MODULE = 60, 300, 600


def test_no_function_class_or_module_past_its_size():
    over = []
    for folder in FOLDERS:
        for f in sorted((ROOT / folder).rglob("*.py")):
            text = f.read_text(encoding="utf-8")
            rel = f.relative_to(ROOT)
            if len(text.splitlines()) > MAX_MODULE:
                over.append(f"{rel}: {len(text.splitlines())} lines (module, {MAX_MODULE})")
            for node in ast.walk(ast.parse(text)):
                limit = (MAX_CLASS if isinstance(node, ast.ClassDef) else MAX_FUNCTION
                         if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None)
                if limit and node.end_lineno - node.lineno + 1 > limit:
                    over.append(f"{rel}:{node.lineno} {node.name}: "
                                f"{node.end_lineno - node.lineno + 1} lines ({limit})")
    assert not over, "\n".join(over)
