"""No import cycle between the modules of ``pipeline/``, counting every import: at module level,
inside functions (a deferred import still ties two modules together; it only hides the tie) and
under ``TYPE_CHECKING``; and imports that point down the layers of docs/architecture.md.

The graph is read with ``ast``, not by importing: one node per module, an edge from a module to
each ``pipeline`` module it names (``from pkg import mod`` names ``pkg.mod`` when that is a module,
else ``pkg``). A cycle is a strongly connected component of more than one module. ``ALLOWED``
lists the cycles still in the tree, each with its owner; it may only shrink: a cycle that is not
listed fails the test, and so does a listed one that is gone or has changed (take it off the list).

The layers are the picture in docs/architecture.md ("Module layering"), read from the page: a
module belongs to the most specific package or module the picture names, and imports only from its
own layer or below. ``BACK_EDGES`` lists the imports that still point up, each with its reason; it
may only shrink, like ``ALLOWED``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pipeline.paths import PROJECT_ROOT
from tests.python_source import tree

ARCHITECTURE = PROJECT_ROOT / "docs" / "architecture.md"

ALLOWED: list[frozenset[str]] = []


BACK_EDGES: set[tuple[str, str]] = set()  # none left; a new one fails the test


def modules(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name → file, for every ``.py`` under ``root/package``."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _named(node: ast.AST, module: str, is_package: bool, known: dict[str, Path]) -> list[str]:
    """The modules of ``known`` one import node names."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative: from the importing module's package, one level up per extra dot
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([node.module] if node.module else []))
        targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    else:
        return []
    named = []
    for target in targets:
        while target and target not in known:  # `import a.b.c` of a name inside a module: the module
            target = target.rpartition(".")[0]
        if target and target != module:
            named.append(target)
    return named


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module → the modules it imports anywhere in its file (functions and TYPE_CHECKING included)."""
    known = modules(root, package)
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        graph[module] = {t for node in ast.walk(tree(path)) for t in _named(node, module, path.name == "__init__.py", known)}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def problems(found: list[frozenset[str]], allowed: list[frozenset[str]]) -> list[str]:
    """What breaks the rule: a cycle not on the list, or a listed cycle no longer in the tree."""
    out = [f"new import cycle: {' ↔ '.join(sorted(c))}" for c in found if c not in allowed]
    out += [f"listed cycle gone or changed, take it off ALLOWED: {' ↔ '.join(sorted(c))}"
            for c in allowed if c not in found]
    return out


@pytest.fixture(scope="module")
def pipeline_graph() -> dict[str, set[str]]:
    """The project's graph, parsed once for the two tests that read it (parsing every module of
    pipeline/ is most of their cost); neither changes it."""
    return import_graph(PROJECT_ROOT, "pipeline")


@pytest.mark.budget(4)  # its fixture parses every module of pipeline/ (~1-2 CPU s) unless a guard test did already
def test_no_import_cycle_but_the_listed_ones(pipeline_graph):
    assert problems(cycles(pipeline_graph), ALLOWED) == []


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


def test_a_planted_cycle_through_a_function_level_import_fails(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from pkg.b import helper\n",
        "b.py": "def helper():\n    from pkg import a  # deferred: the tie is still there\n    return a\n",
        "sub/__init__.py": "",
        "sub/c.py": "from .. import a\nfrom ..b import helper\n",  # relative imports resolve; c is on no cycle
    })
    graph = import_graph(root, "pkg")
    assert graph["pkg.sub.c"] == {"pkg.a", "pkg.b"}
    found = cycles(graph)
    assert found == [frozenset({"pkg.a", "pkg.b"})]
    assert problems(found, []) == ["new import cycle: pkg.a ↔ pkg.b"]
    assert problems(found, [frozenset({"pkg.a", "pkg.b"})]) == []


def test_a_type_checking_import_counts_and_a_vanished_listed_cycle_fails(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n",
        "b.py": "import pkg.a\n",
        "c.py": "import pkg.a\n",
    })
    found = cycles(import_graph(root, "pkg"))
    assert found == [frozenset({"pkg.a", "pkg.b"})]
    assert problems(found, [frozenset({"pkg.a", "pkg.b"}), frozenset({"pkg.a", "pkg.c"})]) == [
        "listed cycle gone or changed, take it off ALLOWED: pkg.a ↔ pkg.c"]
    grown = [frozenset({"pkg.a", "pkg.b", "pkg.c"})]  # a module joining a listed cycle is a new cycle
    assert problems(grown, [frozenset({"pkg.a", "pkg.b"})])[0].startswith("new import cycle")


def documented_layers(text: str) -> dict[str, int]:
    """``{"pipeline.x": layer}`` from the layer picture under "## Module layering": lines
    ``<layer>  a/, b.py, c/d.py    description`` inside its first fenced block."""
    block = text.split("## Module layering", 1)[1].split("```", 2)[1]
    layers = {}
    for line in block.splitlines():
        match = re.match(r"^\s*(\d+)\s{2,}(\S.*?)(?:\s{3,}.*)?$", line)
        if match:
            for name in (n.strip() for n in match.group(2).split(",")):
                dotted = ("pipeline." + name.removesuffix("/").removesuffix(".py").replace("/", ".")).removesuffix(".__init__")
                layers[dotted] = int(match.group(1))
    return layers


def layer_of(module: str, layers: dict[str, int]) -> int | None:
    """The layer of the most specific package or module named; None when only the root package is."""
    name = module
    while name not in layers and "." in name:
        name = name.rpartition(".")[0]
    if name not in layers or (name == module.partition(".")[0] and name != module):
        return None
    return layers[name]


def upward(graph: dict[str, set[str]], layers: dict[str, int]) -> set[tuple[str, str]]:
    return {(a, b) for a, targets in graph.items() for b in targets if layer_of(a, layers) < layer_of(b, layers)}


def test_imports_point_down_the_documented_layers(pipeline_graph):
    layers = documented_layers(ARCHITECTURE.read_text(encoding="utf-8"))
    graph = pipeline_graph
    assert [m for m in graph if layer_of(m, layers) is None] == [], "a module the layer picture does not place"
    found = upward(graph, layers)
    assert sorted(found - BACK_EDGES) == [], "imports pointing up a layer: move the code down, or the module up"
    assert sorted(BACK_EDGES - found) == [], "back edges gone: take them off BACK_EDGES"


def test_the_layer_check_sees_an_upward_import():
    page = "## Module layering\n\n```\n 1  pkg/top.py, pkg/mid/   the upper layer\n 0  pkg/low.py, __init__.py   the rest\n```\n"
    layers = {k.replace("pipeline.", "", 1): v for k, v in documented_layers(page).items()}
    assert layers == {"pkg.top": 1, "pkg.mid": 1, "pkg.low": 0, "pipeline": 0}
    graph = {"pkg.low": {"pkg.top"}, "pkg.top": {"pkg.low"}, "pkg.mid.x": {"pkg.low"}}
    assert upward(graph, layers) == {("pkg.low", "pkg.top")}
    assert layer_of("pkg.elsewhere", {"pkg.mid": 1, "pkg": 0}) is None  # unplaced, not the root's layer
