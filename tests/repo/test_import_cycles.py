"""No import cycles inside lfed: every ``import``/``from ... import`` of an lfed module counts.

Function-local imports count too (a local import that only dodges a cycle hides it, it does
not remove it); imports under ``if TYPE_CHECKING:`` do not (they never run). Importing a
submodule does not count as importing its parent packages' ``__init__``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

#: Cycles known and being removed elsewhere; each entry names the modules of one cycle. An edge
#: between two modules of an entry is ignored. Delete an entry when its cycle is gone
#: (test_known_cycles_still_exist says when).
KNOWN_CYCLES: set[frozenset[str]] = {
}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST):
    """Every Import/ImportFrom node of ``tree``, at any depth, except under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """``module -> {modules of the package it imports}`` for every ``.py`` file under ``package_dir``."""
    root = package_dir.parent
    package = package_dir.name
    files = {module_name(p, root): p for p in sorted(package_dir.rglob("*.py"))}
    modules = set(files)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in files.items():
        is_package = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:  # relative: resolve against this module's package
                    base = mod.split(".") if is_package else mod.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:  # `from lfed.data import leaf`: the submodule, if it is one
                    sub = f"{source}.{alias.name}"
                    targets.append(sub if sub in modules else source)
            for target in targets:
                if target.split(".")[0] != package:
                    continue
                while target not in modules and "." in target:  # `import lfed.x.Name`-like: the module part
                    target = target.rsplit(".", 1)[0]
                if target in modules and target != mod:
                    graph[mod].add(target)
    return graph


def cycles(graph: dict[str, set[str]], known: set[frozenset[str]] = frozenset()) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), edges within ``known`` ignored."""
    edges = {m: {t for t in ts if not any({m, t} <= k for k in known)} for m, ts in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def describe(graph: dict[str, set[str]], component: list[str]) -> str:
    inside = set(component)
    return "; ".join(f"{m} imports {', '.join(sorted(graph[m] & inside))}" for m in component)


def test_lfed_has_no_import_cycles():
    graph = import_graph(REPO / "lfed")
    assert "lfed.data.tensors" in graph["lfed.data.leaf"]  # the walk sees the package's imports
    found = cycles(graph, KNOWN_CYCLES)
    assert not found, "import cycles in lfed:\n" + "\n".join(describe(graph, c) for c in found)


def test_cli_and_grid_do_not_import_each_other():
    """``lfed grid`` builds its runs with lfed.lightning.cli's parser; the command's dispatch is lfed.entry, above both."""
    graph = import_graph(REPO / "lfed")
    assert "lfed.lightning.cli" in graph["lfed.lightning.grid"] and "lfed.lightning.grid" not in graph["lfed.lightning.cli"]
    assert {"lfed.lightning.cli", "lfed.lightning.grid"} <= graph["lfed.entry"]


def test_data_datasets_and_leaf_do_not_import_each_other():
    graph = import_graph(REPO / "lfed")
    assert "lfed.data.leaf" in graph["lfed.data.datasets"]
    assert "lfed.data.datasets" not in graph["lfed.data.leaf"]


def test_the_walk_finds_function_local_and_relative_cycles(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from pkg import a  # local import: a imports this module\n")
    (pkg / "c.py").write_text("from . import d\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import c\n"
                              "def g():\n    import pkg.c\n")
    (pkg / "e.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n")
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"}
    assert graph["pkg.c"] == {"pkg.d"} and graph["pkg.d"] == {"pkg.c"} and graph["pkg.e"] == set()
    assert cycles(graph) == [["pkg.a", "pkg.sub.b"], ["pkg.c", "pkg.d"]]
    assert cycles(graph, {frozenset({"pkg.c", "pkg.d"})}) == [["pkg.a", "pkg.sub.b"]]


#: What a package below the Lightning layer may not import (docs/architecture.md): no package but lfed.lightning (and
#: lfed.entry, the command) imports Lightning's layer; the round core and the component contract import no feature.
FEATURES = ("lfed.personal", "lfed.privacy", "lfed.robust")
#: The one core module that names features: the registry is the table of every built-in name (its presets build
#: DP-FedAvg; it refuses a composition that would drop DP), read where a run is built, not in the round.
NAMES_FEATURES = {"lfed.core.registry"}


def test_only_the_lightning_layer_imports_it():
    graph = import_graph(REPO / "lfed")
    below = {m: ts for m, ts in graph.items() if not m.startswith("lfed.lightning") and m not in ("lfed.entry", "lfed.__main__")}
    bad = {m: sorted(t for t in ts if t.startswith("lfed.lightning")) for m, ts in below.items()}
    bad = {m: ts for m, ts in bad.items() if ts and m != "lfed"}  # lfed/__init__: names only, imported on first use
    assert not bad, f"modules below the Lightning layer import it: {bad}"


def test_the_core_and_the_contract_import_no_feature_package():
    graph = import_graph(REPO / "lfed")
    core = {m: ts for m, ts in graph.items() if m.startswith(("lfed.core", "lfed.base")) and m not in NAMES_FEATURES}
    assert "lfed.core.algorithm" in core and "lfed.base.sharing" in core["lfed.core.algorithm"]  # the walk sees the core
    bad = {m: sorted(t for t in ts if t.startswith(FEATURES)) for m, ts in core.items()}
    bad = {m: ts for m, ts in bad.items() if ts}
    assert not bad, f"the core imports features: {bad}"
