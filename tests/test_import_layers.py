"""Layers point one way: no import circle among the modules of ``src/asynccube``, and no
package of ``_core`` imports a package above it in :data:`LAYERS`.

The graph is read statically (``ast``) from every import statement, at module level and
inside functions alike (a deferred import still makes the importing module depend on
the imported one). Imports under ``if TYPE_CHECKING:`` never run, but they still tie
two files together for a reader: both graphs (with and without them) must be free of
circles, and both must respect the layers.
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

LAYERS: list[list[str]] = [
    ["errors", "version", "extensions", "html"],  # the foundation: flat modules
    ["values"],  # stream ids, handles, bindings, kernels, slice tokens
    ["config"],  # file, schema, environment, logging settings
    ["profiling"],  # tokens and records, timelines, their HTML
    ["monitor"],  # the loop monitor (lag percentiles, slow steps)
    ["memory"],  # storages, pools, the memory manager, the handle table
    ["stream"],  # multi-stream events and cursors, stream pool, scheduler
    ["server"],  # the ComputeServer protocol and what both servers share
    ["channel"],  # the actor channel, settling, held errors, completion, loop backends
    ["host"],  # the host (numpy) server
    ["cuda"],  # the CUDA server; cuda.native: the hot path, C beside its twin
    ["client"],  # ComputeClient and its parts, tensors, graphs, transfers, interop
    ["kernels"],  # kernels written once: elementwise and reduction, CUDA and numpy
    ["tune"],  # the autotuner
    ["runtime"],  # devices, making servers, opening clients
    ["cli"],  # the demo
    ["testing"],  # the pytest plugin's heavy half
]
"""The packages (and foundation modules) of ``asynccube._core``, lowest first: a module
may import its own layer and those below, never one above. ``asynccube`` itself, its
``__main__`` and ``pytest_plugin`` stand above them all. Written down here once;
CONTRIBUTING.md describes each layer."""

CORE = f"{PACKAGE}._core."


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


def _imports(tree: ast.AST, typing: bool = False) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement; those under ``if TYPE_CHECKING:`` only where ``typing``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node) and not typing:
            for other in node.orelse:
                yield from _imports(other, typing)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        yield from _imports(node, typing)


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


def import_graph(typing: bool = False) -> dict[str, set[str]]:
    """Module -> the modules of this package it imports (at run time; also for type
    checking where ``typing``)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        is_package = path.name == "__init__.py"
        deps = graph.setdefault(name, set())
        for node in _imports(tree, typing):
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
    assert "asynccube._core.client.client" in graph
    assert "asynccube._core.channel.channel" in graph["asynccube._core.client.client"]


def test_a_circle_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c"]]


def test_no_import_circles() -> None:
    cycles = find_cycles(import_graph())
    assert not cycles, "import circles (layers must point one way):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of a module of ``_core`` (None above ``_core``)."""
    if not module.startswith(CORE):
        return None
    top = module.removeprefix(CORE).split(".")[0]
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module}: its package {top!r} is in no layer of LAYERS")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``importer -> imported`` for each import of a higher layer from a lower one."""
    out = []
    for module, deps in sorted(graph.items()):
        low = layer_of(module)
        for dep in sorted(deps):
            high = layer_of(dep)
            if low is not None and (high is None or high > low):
                out.append(f"{module} -> {dep}")
    return out


def test_no_import_circles_with_type_checking_imports() -> None:
    cycles = find_cycles(import_graph(typing=True))
    assert not cycles, "import circles (type-checking imports included):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def test_a_type_checking_import_is_seen() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\n")
    assert len(list(_imports(tree))) == 1
    assert len(list(_imports(tree, typing=True))) == 2


def test_every_package_has_a_layer() -> None:
    for module in import_graph():
        layer_of(module)


def test_lower_layers_never_import_higher_ones() -> None:
    wrong = upward_imports(import_graph(typing=True))
    assert not wrong, "imports against the layers (see LAYERS):\n" + "\n".join(wrong)


def test_an_upward_import_is_caught() -> None:
    graph = {f"{CORE}memory.pools": {f"{CORE}client.client"}, f"{CORE}client.client": set()}
    assert upward_imports(graph) == [f"{CORE}memory.pools -> {CORE}client.client"]
