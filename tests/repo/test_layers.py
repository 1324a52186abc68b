"""The package's layers (docs/architecture.md): a package imports only its own layer and the layers below it.

Every ``import`` counts, function-local ones too, except under ``if TYPE_CHECKING:`` (the import graph of
``test_import_cycles.py``). The methods (client, server, privacy, personal, robust) share one layer and may import each
other; the root helpers (``rng``, ``checks``, the root ``__init__``'s lazy exports and version) are the bottom layer.
"""

from __future__ import annotations

from conftest import REPO
from test_import_cycles import import_graph

#: Top to bottom; one tuple is one layer.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__main__", "entry", "precheck", "precheck_tables"),
    ("lightning",),
    ("core",),
    ("personal", "privacy", "client", "server", "robust"),
    ("participation",),
    ("base",),
    ("evaluation",),
    ("models",),
    ("data",),
    ("engine",),
    ("state",),
    ("", "rng", "checks"),  # "": the root package lfed itself
)
RANK = {package: len(LAYERS) - i for i, layer in enumerate(LAYERS) for package in layer}


def package_of(module: str) -> str:
    """``lfed.core.round`` -> ``core``; ``lfed`` -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            pa, pb = package_of(a), package_of(b)
            if pa != pb and RANK[pb] > RANK[pa]:
                out.append(f"{a} -> {b}")
    return out


def test_every_package_has_a_layer():
    graph = import_graph(REPO / "lfed")
    assert {package_of(m) for m in graph} <= set(RANK), "a new package: give it a layer in LAYERS and docs/architecture.md"


def test_no_package_imports_one_above_it():
    assert upward_imports(import_graph(REPO / "lfed")) == []


def test_the_check_catches_an_upward_import():
    """The check itself: an engine module importing the core, or the root importing the Lightning package, is named."""
    graph = {"lfed.engine.vmap": {"lfed.core.round"}, "lfed": {"lfed.lightning.reporting"}, "lfed.core.run": {"lfed.engine"}}
    assert upward_imports(graph) == ["lfed -> lfed.lightning.reporting", "lfed.engine.vmap -> lfed.core.round"]
