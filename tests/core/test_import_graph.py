"""No two of the aggregator's modules import each other, directly or round a loop, not even
for type checking only (the hub imports the upstreams' module, which describes what it
needs of the hub as a protocol)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2] / "aggregator"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each module -> the aggregator modules it imports anywhere in it."""
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
                found |= {f"{node.module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The loops of ``graph``: for each module, a path back to itself if there is one."""
    found = []
    for start in sorted(graph):
        seen = {start}
        paths = [[start]]
        while paths:  # bounded: every module is entered once per start
            path = paths.pop()
            for nxt in sorted(graph[path[-1]]):
                if nxt == start:
                    found.append([*path, start])
                    paths = []
                    break
                if nxt not in seen:
                    seen.add(nxt)
                    paths.append([*path, nxt])
    return found


def test_no_import_cycles():
    graph = import_graph()
    assert "aggregator.upstreams.session" in graph["aggregator.hub.hub"]
    assert cycles(graph) == []


def test_a_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        ["a", "b", "c", "a"],
        ["b", "c", "a", "b"],
        ["c", "a", "b", "c"],
    ]
    assert cycles({"a": {"b"}, "b": set()}) == []
