"""The code stays readable: no function over 60 lines, and every module says what it owns
in its docstring, in the core and outside it (the trio layer, the command line, the
plugins). A module is as long as its one idea: there is no cap on its lines, which only
made files be trimmed to fit a number."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
CORE = sorted((ROOT / "aggregator" / "core").rglob("*.py"))
OUTSIDE_CORE = sorted(
    path for path in (ROOT / "aggregator").rglob("*.py") if (ROOT / "aggregator" / "core") not in path.parents
)
MAX_FUNCTION_LINES = 60


def long_functions(source: str) -> list[str]:
    return [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_core_module_has_short_functions_and_says_what_it_owns(path):
    source = path.read_text()
    assert long_functions(source) == []
    assert path.name == "__init__.py" or ast.get_docstring(ast.parse(source))


@pytest.mark.parametrize("path", OUTSIDE_CORE, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_outside_the_core_does_too(path):
    source = path.read_text()
    assert long_functions(source) == []
    assert path.name == "__init__.py" or ast.get_docstring(ast.parse(source))


def test_the_check_sees_a_long_function():
    source = "def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    assert long_functions(source) == [f"f ({MAX_FUNCTION_LINES + 1} lines)"]
    assert len(CORE) >= 25
    assert len(OUTSIDE_CORE) >= 40
