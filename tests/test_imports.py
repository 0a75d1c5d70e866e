"""Every module of the project imports on its own, and no modules import each other in a circle.

The packages are walked, so the test follows whatever modules they hold. The import graph is built
from the source (module-level imports only: an import inside a function, or under
``if TYPE_CHECKING:``, does not run when the module loads). An edge goes to the module named and to
its parent packages that are not already loading (the importer's own ancestors are), since
importing ``a.b.c`` runs ``a/b/__init__.py`` first. A second graph also counts the imports deferred
into functions and those under ``TYPE_CHECKING``: a circle hidden from the loader is still two
modules that depend on each other, and it must not exist either.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "gateway", "tenancy", "quotas", "migrations", "benchmarks")
# Scripts that do their work at import time, so they are not imported here: Alembic's environment
# runs the migrations when Alembic loads it, a __main__ runs its program.
NOT_IMPORTED = ("migrations.env",)


def project_modules() -> dict[str, Path]:
    """Dotted module name -> source file, for every .py file under PACKAGES."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def module_level_imports(body: list[ast.stmt]):
    """The Import / ImportFrom statements that run when the module loads."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not _type_checking(node.test):
                yield from module_level_imports(node.body)
            yield from module_level_imports(node.orelse)
        elif isinstance(node, (ast.Try, ast.TryStar)):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                yield from module_level_imports(block)
        elif isinstance(node, (ast.With, ast.ClassDef)):
            yield from module_level_imports(node.body)


def every_import(body: list[ast.stmt]):
    """Every Import / ImportFrom statement: those deferred into functions and those under
    TYPE_CHECKING too."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    yield from every_import([child])


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def imported_modules(name: str, path: Path, modules: dict[str, Path], deferred: bool = False) -> set[str]:
    """The project modules that loading module `name` (source `path`) imports, and so runs (with
    `deferred`, also those its functions import when they run and those it names for type checkers)."""
    is_package = path.name == "__init__.py"
    named: set[str] = set()
    statements = every_import if deferred else module_level_imports
    for node in statements(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
            continue
        if node.level:  # relative: from the importer's package, up level - 1 packages
            package = name.split(".") if is_package else name.split(".")[:-1]
            base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
        else:
            base = node.module
        for alias in node.names:  # `from pkg import sub` loads the submodule pkg.sub
            named.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    loading = set(_ancestors(name)) | ({name} if is_package else set())
    edges = set()
    for target in named:
        for module in (*_ancestors(target), target):
            if module in modules and module not in loading and module != name:
                edges.add(module)
    return edges


def import_graph(deferred: bool = False) -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imported_modules(name, path, modules, deferred) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a, b, ..., a) through each strongly connected component of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm (recursion depth <= the number of modules)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    found = []
    for component in components:  # the shortest way back to the component's first module
        start = min(component)
        paths = {start: [start]}
        frontier = [start]
        while frontier and start not in {w for v in frontier for w in graph[v]}:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & component):
                    if w not in paths:
                        paths[w] = paths[v] + [w]
                        nxt.append(w)
            frontier = nxt
        last = next(v for v in frontier if start in graph[v])
        found.append(paths[last] + [start])
    return found


def test_the_graph_sees_the_imports_that_run_at_load_time_only():
    graph = import_graph()
    assert "engine.scheduler.policy" in graph["engine.scheduler.registry"]
    assert "engine.scheduler.registry" not in graph["engine.scheduler.policy"]
    assert graph["engine"] == set()  # its public names load lazily (PEP 562), under TYPE_CHECKING for tools
    assert "engine.scheduler" in graph["engine.engine"]  # `from engine.scheduler import Scheduler`


def test_cycles_are_found_and_reported():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_project():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_deferred_imports_are_seen_only_when_asked_for():
    body = ast.parse(
        "import a\nif TYPE_CHECKING:\n    import b\ndef f():\n    import c\n"
        "class K:\n    import d\ntry:\n    import e\nexcept ImportError:\n    pass\n"
    ).body
    names = lambda found: sorted(alias.name for node in found for alias in node.names)  # noqa: E731
    assert names(module_level_imports(body)) == ["a", "d", "e"]
    assert names(every_import(body)) == ["a", "b", "c", "d", "e"]


def test_a_cycle_through_a_type_checking_import_is_found(tmp_path):
    """Two modules where one imports the other at load time and the other imports it back only
    for the type checker: the loader sees no circle, the deferred graph does."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text("from pkg.fast import Fast\n")
    (package / "fast.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.model import Model\n"
    )
    modules = {
        "pkg": package / "__init__.py",
        "pkg.model": package / "model.py",
        "pkg.fast": package / "fast.py",
    }

    def graph(deferred: bool) -> dict[str, set[str]]:
        return {name: imported_modules(name, path, modules, deferred) for name, path in modules.items()}

    assert cycles(graph(deferred=False)) == []
    assert cycles(graph(deferred=True)) == [["pkg.fast", "pkg.model", "pkg.fast"]]


def test_no_import_cycle_even_through_deferred_or_type_checking_imports():
    """An import deferred into a function, or one under TYPE_CHECKING, hides a circle from the loader,
    not from the reader: the two modules still depend on each other (a registry that imports the
    policies that import it, a fast path that names the model that chooses it)."""
    found = cycles(import_graph(deferred=True))
    assert not found, "import cycles through deferred or TYPE_CHECKING imports:\n" + "\n".join(
        " -> ".join(c) for c in found
    )


FRESH_IMPORTS = """
import importlib, json, subprocess, sys
from prometheus_client import REGISTRY
packages, modules = json.loads(sys.argv[1]), json.loads(sys.argv[2])
failed = {}
builtin = set(REGISTRY._collector_to_names)
for name in modules:
    for loaded in [m for m in sys.modules if m.split(".")[0] in packages]:
        del sys.modules[loaded]
    # the metrics the last module defined: registered again by the next load of their module
    for collector in [c for c in list(REGISTRY._collector_to_names) if c not in builtin]:
        REGISTRY.unregister(collector)
    try:
        importlib.import_module(name)
    except BaseException:
        # Third-party state that outlives sys.modules (a registry of metric names, say) can refuse
        # a second load of a module that imports fine: only a failure in its own interpreter counts.
        code = "import importlib, sys; importlib.import_module(sys.argv[1])"
        alone = subprocess.run([sys.executable, "-c", code, name], capture_output=True, text=True)
        if alone.returncode:
            lines = alone.stderr.strip().splitlines()
            failed[name] = lines[-1] if lines else "exit %d" % alone.returncode
print(json.dumps(failed), flush=True)
import gc
gc.freeze()  # the shutdown's collections then walk none of the objects of every module loaded
"""


def test_every_module_imports_on_its_own():
    modules = [m for m in project_modules() if m not in NOT_IMPORTED and not m.endswith("__main__")]
    assert len(modules) > 50 and "engine.scheduler.registry" in modules and "gateway" in modules
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # two interpreters, each loading every other module: the suite runs on two cores
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", FRESH_IMPORTS, json.dumps(PACKAGES), json.dumps(modules[i::2])],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    failed = {}
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
        failed.update(json.loads(out.strip().splitlines()[-1]))
    assert not failed, "modules that fail to import on their own:\n" + "\n".join(
        f"{m}: {e}" for m, e in failed.items()
    )
