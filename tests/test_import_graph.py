"""No import cycles among fusethrottle's modules, lazy ones included.

An import inside a function, or under ``if TYPE_CHECKING:``, still says that one module needs
another; a cycle hidden that way is still a cycle (it only moves the failure from import time to
the first call, or to the type checker). So every import statement of every module counts,
wherever it stands. The graph is read from the source (ast), nothing is imported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fusethrottle"

#: Import edges known to close a cycle, each (importer, imported). Every other cycle fails.
KNOWN: set[tuple[str, str]] = set()


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(module of the package, line) for every import statement in *path*, at any depth."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # ``from P import x``: the module P.x if there is one, else P itself.
            targets = [
                f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            if target in known and target != name:
                yield target, node.lineno


def graph() -> dict[str, dict[str, int]]:
    """importer -> {imported: first line}."""
    known = modules()
    edges: dict[str, dict[str, int]] = {}
    for name, path in known.items():
        edges[name] = {}
        for target, line in imports(name, path, known):
            edges[name].setdefault(target, line)
    return edges


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
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


def test_the_graph_is_read() -> None:
    edges = graph()
    assert "fusethrottle.metering.fleet_share" in edges["fusethrottle.metering.fleet"]
    assert (
        "fusethrottle.observability.metrics.snapshot" in edges["fusethrottle.observability.metrics"]
    )
    # A function-level import counts as much as one at the top.
    assert "fusethrottle.service.daemon" in edges["fusethrottle.service.cli"]


def test_a_lazy_import_that_closes_a_cycle_is_found() -> None:
    edges = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 9}, "d": {"a": 1}}
    assert cycles(edges) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    edges = graph()
    stale = sorted(edge for edge in KNOWN if edge[1] not in edges.get(edge[0], {}))
    assert not stale, f"these imports are gone: delete them from KNOWN: {stale}"
    for importer, imported in KNOWN:
        del edges[importer][imported]
    paths = {name: path.relative_to(PACKAGE.parent) for name, path in modules().items()}
    problems = []
    for component in cycles(edges):
        inside = [
            f"  {a} -> {b} ({paths[a]}:{edges[a][b]})"
            for a in component
            for b in sorted(edges[a])
            if b in component
        ]
        problems.append("cycle among " + ", ".join(component) + ":\n" + "\n".join(inside))
    assert not problems, "\n".join(problems)
