"""What the core's test modules share: a clock the test moves by hand, JSON-RPC messages in
and out of the router, and the routers several modules drive (two servers ``a`` and ``b``
with clients connected; the same with a small JSON depth limit). Pure: no I/O.

Fixtures built from these live in ``tests/core/conftest.py``."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from aggregator.config import ServerConfig
from aggregator.config.core_settings import link_settings
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.events import (
    ClientConnected,
    ClientMessage,
    ServerItems,
    ServerMessage,
    ServerReady,
    StartupCompleted,
    UpstreamConnected,
)
from aggregator.core.lifecycle.upstream_lifecycle import CONTROL_ID_PREFIX
from aggregator.core.router import Router, RouterSettings
from aggregator.jsonrpc import RemoteProtocolError, decode_message, dumps, loads
from aggregator.mcp.constants import LIST_METHOD_OF

CLIENT_CAPS = {"sampling": {}, "roots": {"listChanged": True}, "elicitation": {"form": {}, "url": {}}}
JSON_DEPTH_LIMIT = 32
# Number literals, many of which a float would round or spell otherwise: each is forwarded as written.
AWKWARD_LITERALS = [
    "9007199254740993.0",
    "0.10000000000000001",
    "1e-400",
    "1e2",
    "1E2",
    "-0",
    "1.0",
    "1.50",
    "-0.0",
    "0e0",
    "123456789012345678901234567890",
    "4" + "0" * 399,
    "5e-324",
    "1.7976931348623157e309",
    "1e400",
    "-1e400",
    "1E+2",
    "2e-7",
    "-123456789012345678901234567890.5",
    "7" * 5000,
    "0.7",
    "100",
    "-5",
    "18446744073709551616",
    "-9223372036854775809",
    "1e16",
    "12.30e-005",
]


# What ``new_router`` passes to the Router itself; every other keyword is a RouterSettings field.
ROUTER_ARGS = ("clock", "profiles", "instance", "server_request_policy")


def new_router(catalog: Any, servers: list[Any], **kw: Any) -> Router:
    """A router over ``catalog`` and these configured servers (through the same adapter as
    the hub), with keywords that are either the Router's own or its settings' fields."""
    own = {k: kw.pop(k) for k in ROUTER_ARGS if k in kw}
    return Router(catalog, RouterSettings(servers=tuple(link_settings(s) for s in servers), **kw), **own)


class Clock:
    """The router's clock: returns ``now``, which a test advances (``clock.now += 5``)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def msg(**fields: Any) -> bytes:
    """A JSON-RPC 2.0 message with these fields, encoded as the router receives it."""
    return dumps({"jsonrpc": "2.0", **fields})


def decoded(message: Any) -> Any:
    """A command's message as a dict, whether the router encoded it already or not."""
    return loads(message) if type(message) is bytes else message


def refused(raw: bytes) -> RemoteProtocolError:
    """The error the codec raises for ``raw``, which it must refuse."""
    with pytest.raises(RemoteProtocolError) as info:
        decode_message(raw)
    return info.value


def unpack(commands: list[Any]) -> list[tuple[str, Any, Any]]:
    """Commands as (type name, session or server, decoded message); a command without a
    message (``RequestEnded``) gives its other fields instead."""
    fields = [attrs.astuple(c, recurse=False) for c in commands]
    return [
        (type(c).__name__, f[0], decoded(c.message) if hasattr(c, "message") else f[1:])
        for c, f in zip(commands, fields, strict=True)
    ]


def make_router(clock: Clock, debounce: float = 0.0, **kw: Any) -> Router:
    """Servers ``a`` (timeout 5 s, at most 20 s) and ``b`` (timeout 5 s, not reset by
    progress), both ready with tools ``slow`` and ``fast`` and one resource; no client yet."""
    servers = [
        ServerConfig(name="a", command="x", request_timeout=5.0, max_request_timeout=20.0),
        ServerConfig(name="b", command="x", request_timeout=5.0, timeout_resets_on_progress=False),
    ]
    router = new_router(Catalog(servers, "__", 50), servers, clock=clock, list_changed_debounce=debounce, **kw)
    caps = {"tools": {}, "resources": {"subscribe": True}, "logging": {}, "tasks": {"list": {}, "cancel": {}}}
    for name in ("a", "b"):
        router.handle(ServerReady(name, {"protocolVersion": "2025-11-25", "capabilities": caps}))
        router.handle(ServerItems(name, "tools", [{"name": "slow"}, {"name": "fast"}]))
        router.handle(ServerItems(name, "resources", [{"uri": "demo://r/1"}]))
    router.handle(StartupCompleted())
    return router


def connect(router: Router, key: int, caps: dict[str, Any] = CLIENT_CAPS) -> None:
    """Client ``key`` connects and completes the handshake with these capabilities."""
    router.handle(ClientConnected(key))
    router.handle(
        ClientMessage(
            key,
            msg(
                id=0,
                method="initialize",
                params={"protocolVersion": "2025-11-25", "capabilities": caps, "clientInfo": {"name": f"c{key}"}},
            ),
        )
    )
    router.handle(ClientMessage(key, msg(method="notifications/initialized")))


def make_depth_limited_router(limit: int = JSON_DEPTH_LIMIT) -> Router:
    """Servers ``a`` and ``b`` with a tool ``echo`` each, ``max_json_depth=limit``, client 1
    connected with sampling."""
    servers = [ServerConfig(name="a", command="x"), ServerConfig(name="b", command="x")]
    router = new_router(
        Catalog(servers, "__", 50), servers, clock=Clock(), list_changed_debounce=0, max_json_depth=limit
    )
    for name in ("a", "b"):
        router.handle(ServerReady(name, {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}}))
        router.handle(ServerItems(name, "tools", [{"name": "echo"}]))
    router.handle(StartupCompleted())
    router.handle(ClientConnected(1))
    router.handle(
        ClientMessage(
            1,
            msg(
                id=0,
                method="initialize",
                params={"protocolVersion": "2025-11-25", "capabilities": {"sampling": {}}, "clientInfo": {"name": "c"}},
            ),
        )
    )
    router.handle(ClientMessage(1, msg(method="notifications/initialized")))
    return router


def still_serves(router: Router) -> None:
    """Client 1 of a depth-limited router still gets a ping answered and a call through."""
    assert unpack(router.handle(ClientMessage(1, msg(id="p", method="ping")))) == [
        ("ToClient", 1, {"jsonrpc": "2.0", "id": "p", "result": {}})
    ]
    [(kind, server, sent)] = unpack(
        router.handle(
            ClientMessage(1, msg(id="c", method="tools/call", params={"name": "a__echo", "arguments": {"ok": True}}))
        )
    )
    assert (kind, server) == ("ToServer", "a")
    [(kind, _, answer)] = unpack(router.handle(ServerMessage("a", msg(id=sent["id"], result={"ok": 1}))))
    assert answer == {"jsonrpc": "2.0", "id": "c", "result": {"ok": 1}}


def own_asks(commands: list[Any]) -> list[dict[str, Any]]:
    """The proxy's own requests among ``commands`` (ids ``aggregator-N``)."""
    return [
        c.message
        for c in commands
        if type(c).__name__ == "ToServer"
        and type(c.message) is dict
        and str(c.message.get("id", "")).startswith(CONTROL_ID_PREFIX)
    ]


def lifecycle_serves(
    router: Router, name: str, capabilities: dict[str, Any], items: dict[str, list[Any]] | None = None
) -> list[Any]:
    """Connect ``name`` through the router's lifecycle: its initialize answered with
    ``capabilities``, each list request with ``items`` of its kind (one page). Every command
    that came out, in order."""
    kind_of = {method: kind for kind, method in LIST_METHOD_OF.items()}
    out = router.handle(UpstreamConnected(name, target="x", init_timeout=5.0))
    seen = list(out)
    for _ in range(20):
        asks = own_asks(out)
        if not asks:
            return seen
        [ask] = asks
        if ask["method"] == "server/discover":  # a legacy server
            out = router.handle(
                ServerMessage(name, msg(id=ask["id"], error={"code": -32601, "message": "Method not found"}))
            )
            seen += out
            continue
        if ask["method"] == "initialize":
            result = {"protocolVersion": "2025-11-25", "capabilities": capabilities, "serverInfo": {"name": name}}
        else:
            kind = kind_of[ask["method"]]
            result = {kind: (items or {}).get(kind, [])}
        out = router.handle(ServerMessage(name, msg(id=ask["id"], result=result)))
        seen += out
    raise AssertionError("the lifecycle kept asking")


class TracedHub:
    """What the hub does for a traced proxy, over a router: each client request routed in a
    span of its own (``Tracing.traced``), what held requests send later shown to the same
    tracing (``Router.watch_held``), spans collected in memory."""

    def __init__(self, router: Router) -> None:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from aggregator.telemetry.tracing import Tracing

        self.router = router
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracing = Tracing(provider)
        router.watch_held(self.tracing.forwarded)

    def request(self, key: int, message: dict[str, Any]) -> list[Any]:
        """Client ``key``'s request, routed in its span; what the router said to do."""
        from aggregator.core.events import ClientDecoded
        from aggregator.jsonrpc.kinds import REQUEST

        self.tracing.request(key, message)
        commands = self.router.handle(ClientDecoded(key, REQUEST, message))
        self.tracing.forwarded(key, message["id"], commands)
        return commands

    def answered(self, commands: list[Any]) -> None:
        """The answers among ``commands`` reach their clients: their spans end."""
        from aggregator.core.commands import ToClient

        for command in commands:
            if type(command) is ToClient:
                self.tracing.answered(command.session, decoded(command.message))

    def spans(self, method: str) -> tuple[Any, Any]:
        """The finished server span of a ``method`` request and the one client span under it."""
        from opentelemetry.trace import SpanKind

        spans = self.exporter.get_finished_spans()
        server = [s for s in spans if s.kind == SpanKind.SERVER and s.name.startswith(method)]
        assert len(server) == 1, [s.name for s in spans]
        client = [s for s in spans if s.kind == SpanKind.CLIENT and s.parent.span_id == server[0].context.span_id]
        assert len(client) == 1, [s.name for s in spans]
        return server[0], client[0]
