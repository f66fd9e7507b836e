"""The sans-IO core must not do I/O (no trio, sockets, subprocesses or HTTP libraries), and every
package imports only packages on a lower floor: arrows point down, never up or sideways.

The floors, lowest first (a package may import the packages of every floor below its own):

    0  errors, jsonrpc     the wire and the error hierarchy
       log_summary         a line that comes in floods, logged once per interval with a count
    1  mcp                 protocol facts
    2  core                the sans-IO router (core -> mcp -> jsonrpc only, checked on its own too)
    3  config, transports  the config model (with secret masking); byte-level queues and HTTP
       registry            servers from an MCP registry: entries checked, tables written as text
    4  telemetry           the instruments: metrics, tracing, traffic log, recent errors
       credentials         users' own credentials for servers: vault, token exchange, OAuth client
       cluster             what replicas share: the key ring, sealed session ids, the store
    5  upstreams, plugins  the servers side (``UpstreamPort``); the plugin API and its gate
    6  hub                 the top nursery, the one place commands are carried out
    7  fronts              the clients side (``ClientPort``, which the hub is)
    8  ops                 the admin pages: health, status, its page, the admin listener
    9  cli                 the commands
   10  __main__

``aggregator`` itself (its ``__version__``) may be imported from anywhere. Imports made for
type checking only count too: a package that needs to name something above it describes it
as a protocol of its own.

Inside the core the same holds between its own packages (a top-level module is its own),
lowest first:

    0  commands, defaults     what the router says to do; the defaults
    1  replies, settings      what the proxy says itself; what the core is told of the config
    2  lifecycle              one upstream connection: its era, handshake, listing, own requests
    3  records, events        the shared records (link, request, client, log levels); the events
    4  catalogs               what clients see: catalogs, names, URIs, targets, outages, search
    5  notices                subscriptions and listens, list_changed notices
    6  requests               the request table, forwarding, deadlines, tasks, tallies
    7  reverse                server-to-client requests' table, affinity, roots
    8  clients                the handshake: what the proxy says of itself
    9  upstreams              the proxy's own requests upstream, listen acks, held requests
   10  era                    the era bridges: modern callers, input bridge, parked calls
   11  handlers               the event handlers and what they dispatch to, in-flight timeouts
   12  router                 the one class that composes them

What one needs of another above it comes back as an outcome (a reload's search settings
return the profiles whose tools/list changed; the router has them announced).
"""

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


# The core's objects that own their state and handle its events (and the records and wire
# types they use): each is given its collaborators, so none reaches for the router, which
# composes them. The router is one class (``test_router_groups``): there is no shared
# state of its for them to import.
CORE_BELOW_THE_ROUTER = sorted(
    str(p.relative_to(ROOT / "core")) for p in (ROOT / "core").rglob("*.py") if p.name != "router.py"
)


@pytest.mark.parametrize("name", CORE_BELOW_THE_ROUTER)
def test_nothing_in_the_core_imports_the_router(name):
    path = ROOT / "core" / name
    shared = [m for m in _own_imports(path) if m == "aggregator.core.router"]
    assert shared == [], f"{name} imports {shared}"


# The event handlers the router composes, lowest first. Each may import those before it,
# never one after it: what a lower one needs of a higher one comes back as an outcome (a
# shared server listed hands back the requests held for it, ``Resend``, for the client
# events to handle again). Nothing else in the core imports them; the router composes them.
EVENT_HANDLERS = [
    "handlers/upstream_events.py",
    "handlers/reconfigure.py",
    "handlers/client_events.py",
    "handlers/server_messages.py",
]


def test_the_event_handlers_import_only_those_below_them():
    modules = [_module(ROOT / "core" / name) for name in EVENT_HANDLERS]
    for place, name in enumerate(EVENT_HANDLERS):
        above = [m for m in _own_imports(ROOT / "core" / name) if m in modules[place:]]
        assert above == [], f"{name} imports {above}"


@pytest.mark.parametrize("name", [n for n in CORE_BELOW_THE_ROUTER if n not in EVENT_HANDLERS])
def test_only_the_router_composes_the_event_handlers(name):
    handlers = {_module(ROOT / "core" / n) for n in EVENT_HANDLERS}
    assert [m for m in _own_imports(ROOT / "core" / name) if m in handlers] == []


FLOORS = {
    "errors": 0,
    "log_summary": 0,
    "jsonrpc": 0,
    "mcp": 1,
    "core": 2,
    "config": 3,
    "transports": 3,
    "registry": 3,
    "telemetry": 4,
    "credentials": 4,
    "cluster": 4,
    "upstreams": 5,
    "plugins": 5,
    "hub": 6,
    "fronts": 7,
    "ops": 8,
    "cli": 9,
    "__main__": 10,
}
MODULES = sorted(ROOT.rglob("*.py"))


def _package(path: Path) -> str:
    """The package a file belongs to (a top-level module is its own: ``errors``, ``__main__``)."""
    parts = path.relative_to(ROOT).parts
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def _module(path: Path) -> str:
    """``aggregator.hub.hub`` for ``aggregator/hub/hub.py`` (a file elsewhere: its own name)."""
    if not path.is_relative_to(ROOT):
        return path.stem
    return ".".join(("aggregator", *path.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__")


def upward_imports(path: Path, package: str, floors: dict[str, int] = FLOORS, within: str = "aggregator") -> list[str]:
    """Each import of ``path`` (in ``package``) that does not point to a lower floor, said as
    'importer -> imported: rule'. ``within`` is whose packages ``floors`` orders (the
    project's, or ``aggregator.core``'s: imports outside it are the project check's)."""
    found = []
    depth = within.count(".") + 1
    for name in _own_imports(path):
        if name == within or name == "aggregator":
            continue
        if name == "<relative>":
            found.append(f"{_module(path)} -> a relative import: name the module, so its floor can be checked")
            continue
        if not name.startswith(within + "."):
            continue
        target = name.split(".")[depth]
        if target == package:
            continue
        if target not in floors:
            found.append(f"{_module(path)} -> {name}: package {target!r} has no floor (add it to the floors)")
        elif floors[target] >= floors[package]:
            found.append(
                f"{_module(path)} -> {name}: {package} (floor {floors[package]}) may import only lower floors,"
                f" and {target} is on floor {floors[target]}"
            )
    return found


def test_every_package_has_a_floor():
    packages = {_package(path) for path in MODULES} - {"__init__"}
    assert packages - set(FLOORS) == set(), "a package without a floor"
    assert set(FLOORS) - packages == set(), "a floor for no package"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_arrows_point_down(path):
    package = _package(path)
    if package == "__init__":
        return  # ``aggregator`` itself: its version, imported by anyone
    assert upward_imports(path, package) == []


def test_the_floor_check_names_both_modules_and_the_rule(tmp_path):
    hub = tmp_path / "hub"
    hub.mkdir()
    wrong = hub / "wrong.py"
    wrong.write_text(
        "from aggregator import __version__\n"
        "from aggregator.upstreams.session import UpstreamSession\n"
        "if True:\n    from aggregator.fronts.session import serve_client\n"
        "from aggregator.hub.hub import Hub\n"
        "import aggregator.ops.status\n"
    )
    assert sorted(upward_imports(wrong, "hub")) == [
        "wrong -> aggregator.fronts.session: hub (floor 6) may import only lower floors, and fronts is on floor 7",
        "wrong -> aggregator.ops.status: hub (floor 6) may import only lower floors, and ops is on floor 8",
    ]
    sideways = upward_imports(wrong, "upstreams")
    assert any("upstreams (floor 5) may import only lower floors, and hub is on floor 6" in line for line in sideways)
    assert upward_imports(wrong, "cli") == []


# The core's own packages in floors (the module docstring says what each holds): arrows
# point down inside the core too, so its objects form no cycle and each is built from
# those below it. A top-level module (``commands``, ``router``) is its own package.
CORE = ROOT / "core"
CORE_FLOORS = {
    "commands": 0,
    "defaults": 0,
    "replies": 1,
    "settings": 1,
    "lifecycle": 2,
    "records": 3,
    "events": 3,
    "catalogs": 4,
    "notices": 5,
    "requests": 6,
    "reverse": 7,
    "clients": 8,
    "upstreams": 9,
    "era": 10,
    "handlers": 11,
    "router": 12,
}
CORE_MODULES = sorted(p for p in CORE.rglob("*.py") if p != CORE / "__init__.py")


def _core_package(path: Path) -> str:
    """The core package a file belongs to (a top-level module is its own: ``router``)."""
    parts = path.relative_to(CORE).parts
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def test_every_core_package_has_a_floor():
    packages = {_core_package(path) for path in CORE_MODULES}
    assert packages - set(CORE_FLOORS) == set(), "a core package without a floor"
    assert set(CORE_FLOORS) - packages == set(), "a floor for no core package"


@pytest.mark.parametrize("path", CORE_MODULES, ids=lambda p: str(p.relative_to(CORE)))
def test_arrows_point_down_inside_the_core(path):
    assert upward_imports(path, _core_package(path), CORE_FLOORS, "aggregator.core") == []


def test_the_core_floor_check_names_both_modules_and_the_rule(tmp_path):
    requests = tmp_path / "requests"
    requests.mkdir()
    wrong = requests / "wrong.py"
    wrong.write_text(
        "from aggregator.core.commands import ToClient\n"
        "from aggregator.core.requests.tasks import TaskOwners\n"
        "from aggregator.mcp.constants import TOOLS\n"
        "if True:\n    from aggregator.core.era.parked import ParkedCalls\n"
        "from aggregator.core.notices import subscriptions\n"
        "import aggregator.core.router\n"
        "from aggregator.core.requests.somewhere import Else\n"
        "from aggregator.core.ahead import Nothing\n"
    )
    assert sorted(upward_imports(wrong, "requests", CORE_FLOORS, "aggregator.core")) == [
        "wrong -> aggregator.core.ahead: package 'ahead' has no floor (add it to the floors)",
        "wrong -> aggregator.core.era.parked: requests (floor 6) may import only lower floors, and era is on floor 10",
        "wrong -> aggregator.core.router: requests (floor 6) may import only lower floors, and router is on floor 12",
    ]
    assert upward_imports(wrong, "handlers", CORE_FLOORS, "aggregator.core") == [
        "wrong -> aggregator.core.router: handlers (floor 11) may import only lower floors, and router is on floor 12",
        "wrong -> aggregator.core.ahead: package 'ahead' has no floor (add it to the floors)",
    ]


# Only the hub routes and carries out the router's commands: the fronts, the upstream sessions
# and the plugin gate reach it through their ports (``fronts.port``, ``upstreams.port``,
# ``plugins.gate.GateHost``) and never hold the router; nothing but the hub dispatches.
DISPATCH = {"dispatch", "dispatch_now", "dispatch_soon"}
PORT_SIDES = ("fronts", "upstreams", "plugins", "hub")
THE_HUB = ROOT / "hub" / "hub.py"


def routes_or_dispatches(source: str, package: str) -> list[str]:
    """What in ``source`` (a module of ``package``) reaches the router or dispatches commands."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        if node.attr in DISPATCH:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif node.attr == "router" and package in PORT_SIDES:
            found.append(f"line {node.lineno}: .router")
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_hub_routes_and_dispatches(path):
    package = _package(path)
    if path == THE_HUB or package == "core":
        return
    assert routes_or_dispatches(path.read_text(), package) == [], f"{_module(path)} routes or dispatches itself"


def test_the_dispatch_check_sees_the_router_and_dispatching():
    source = "def f(hub):\n    hub.dispatch_now(hub.router.server_lost('a', 'gone'))\n    return hub.config.router\n"
    assert sorted(routes_or_dispatches(source, "upstreams")) == [
        "line 2: .dispatch_now",
        "line 2: .router",
        "line 3: .router",
    ]
    assert routes_or_dispatches(source, "ops") == ["line 2: .dispatch_now"]
