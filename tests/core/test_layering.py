"""The sans-IO core must not do I/O (no trio, sockets, subprocesses or HTTP libraries), and its
layers import one way: core -> mcp -> jsonrpc, never back and never out to the trio layer."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2] / "aggregator"
FORBIDDEN = {
    "trio",
    "trio_websocket",
    "h11",
    "wsproto",
    "httpx",
    "httptools",
    "socket",
    "subprocess",
    "asyncio",
    "anyio",
}
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


# Which of the project's own packages each sans-IO layer may import: the direction runs
# core -> mcp -> jsonrpc, never back, and never out to the trio layer (hub, transports,
# fronts, config, cli, plugins). ``aggregator`` itself is for ``__version__``.
MAY_IMPORT = {
    "jsonrpc": {"aggregator.jsonrpc"},
    "mcp": {"aggregator.mcp", "aggregator.jsonrpc"},
    "core": {"aggregator.core", "aggregator.mcp", "aggregator.jsonrpc"},
}


def _own_imports(path: Path) -> list[str]:
    """The project modules a file imports, anywhere in it (type-checking blocks too)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level:
            names.append("<relative>")
    return [name for name in names if name == "<relative>" or name.split(".")[0] == "aggregator"]


def _wrong_way(path: Path, layer: str) -> list[str]:
    """The project modules ``path`` imports that its layer may not."""
    return [
        name
        for name in _own_imports(path)
        if name != "aggregator"
        and not any(name == allowed or name.startswith(allowed + ".") for allowed in MAY_IMPORT[layer])
    ]


@pytest.mark.parametrize("path", SANS_IO, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_run_one_way(path):
    layer = path.relative_to(ROOT).parts[0]
    assert _wrong_way(path, layer) == [], f"{path.name} ({layer}) imports the wrong way"


def test_the_direction_check_catches_a_wrong_way_import(tmp_path):
    wrong = tmp_path / "wrong.py"
    wrong.write_text(
        "from aggregator import __version__\nfrom aggregator.hub.hub import Hub\n"
        "from aggregator.jsonrpc.codec import dumps\n"
        "if True:\n    from aggregator.core.router import Router\n"
        "from . import sibling\n"
    )
    assert sorted(_wrong_way(wrong, "mcp")) == ["<relative>", "aggregator.core.router", "aggregator.hub.hub"]
    assert sorted(_wrong_way(wrong, "core")) == ["<relative>", "aggregator.hub.hub"]
    assert sorted(_wrong_way(wrong, "jsonrpc")) == ["<relative>", "aggregator.core.router", "aggregator.hub.hub"]


# The core's objects that own their state (and the records and wire types they use): each
# is given its collaborators, so none reaches for the router or its shared state.
OWNERS = [
    "requests/request_table.py",
    "reverse/reverse_table.py",
    "reverse/roots.py",
    "reverse/affinity.py",
    "catalogs/targets.py",
    "catalogs/discovery.py",
    "catalogs/result_budget.py",
    "clients/handshake.py",
    "clients/clients.py",
    "notices/announcements.py",
    "era/listen_acks.py",
    "upstreams/links.py",
    "events.py",
    "commands.py",
]


@pytest.mark.parametrize("name", OWNERS)
def test_an_owner_of_state_never_imports_the_routers_shared_state(name):
    path = ROOT / "core" / name
    shared = [m for m in _own_imports(path) if m in ("aggregator.core.state", "aggregator.core.router")]
    assert shared == [], f"{name} imports {shared}"
