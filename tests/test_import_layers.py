"""Layers point one way: no import circle among the modules of ``src/asynccube``.

The graph is read statically (``ast``) from every import statement, at module level and
inside functions alike (a deferred import still makes the importing module depend on
the imported one); imports under ``if TYPE_CHECKING:`` are left out (they never run).
A package's ``__init__`` is the package; ``from pkg import x`` depends on the submodule
``pkg.x`` where there is one, else on ``pkg``. Nothing inside a package may import the
package itself (``from ... import __version__`` in ``_core`` would close a circle through
the top ``__init__``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "asynccube"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, skipping the bodies of ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            for other in node.orelse:
                yield from _imports(other)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        yield from _imports(node)


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level:
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    # ``from pkg import name``: name is a submodule of pkg, or an attribute of pkg.
    return [f"{prefix}.{alias.name}" for alias in node.names] + [prefix]


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of this package it imports."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        is_package = path.name == "__init__.py"
        deps = graph.setdefault(name, set())
        for node in _imports(tree):
            found = [t for t in _targets(name, is_package, node) if t in modules]
            deps.update(found[:-1] if len(found) > 1 else found)  # submodules, else pkg
        deps.discard(name)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected components of two or more modules."""
    edges = graph
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return out


def test_the_graph_sees_the_package() -> None:
    graph = import_graph()
    assert "asynccube._core.client" in graph
    assert "asynccube._core.channel" in graph["asynccube._core.client"]


def test_a_circle_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c"]]


def test_no_import_circles() -> None:
    cycles = find_cycles(import_graph())
    assert not cycles, "import circles (layers must point one way):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )
