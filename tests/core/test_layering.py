"""The sans-IO core must not do I/O: no trio, sockets, subprocesses or HTTP libraries."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2] / "aggregator"
FORBIDDEN = {"trio", "trio_websocket", "h11", "wsproto", "httpx", "socket", "subprocess", "asyncio", "anyio"}
SANS_IO = sorted(p for d in ("core", "jsonrpc", "mcp") for p in (ROOT / d).rglob("*.py"))


@pytest.mark.parametrize("path", SANS_IO, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_io_imports(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"


def test_there_is_a_core_to_check():
    assert len(SANS_IO) >= 8


def test_no_unbounded_channels():
    import re
    unbounded = re.compile(r"open_memory_channel\(\s*(math\.)?inf")
    for path in ROOT.rglob("*.py"):
        assert not unbounded.search(path.read_text()), path
