"""The test suite's own layout: helpers that several test modules use live in ``conftest.py``
files and helper modules, so no test module imports from another one (importing a test
module runs its collection-time code and makes one test file's edits break another's)."""

import ast
from pathlib import Path

TESTS = Path(__file__).parents[1]
SOURCES = sorted(p for p in TESTS.rglob("*.py") if "node_modules" not in p.parts)


def imported_test_modules(source: str) -> list[str]:
    """The ``test_*`` modules of the suite that this source imports, anywhere in it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.startswith("tests.")]
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("tests.")):
            module = "." * node.level + (node.module or "")
            found += [module] + [f"{module}.{alias.name}".replace("..", ".") for alias in node.names]
    return [name for name in found if name.rsplit(".", 1)[-1].startswith("test_")]


def test_imports_of_test_modules_are_recognised() -> None:
    source = (
        "from tests.e2e.test_http import post\nimport tests.core.test_router\n"
        "def f():\n    from tests.e2e import test_sdk1\n    from .test_codec import X\n"
    )
    assert imported_test_modules(source) == [
        "tests.e2e.test_http",
        "tests.core.test_router",
        "tests.e2e.test_sdk1",
        ".test_codec",
    ]
    helpers = "from tests.e2e.conftest import post\nfrom tests.loopback import INIT\nimport test_like_but_not_ours\n"
    assert imported_test_modules(helpers) == []


def test_no_test_module_imports_another() -> None:
    assert len(SOURCES) > 50
    offenders = {
        str(path.relative_to(TESTS)): names for path in SOURCES if (names := imported_test_modules(path.read_text()))
    }
    assert offenders == {}, "move what they share to a conftest.py or a helper module"
